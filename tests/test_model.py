"""The model: forward/backward, kernel equivalence, sparse head, Hugging Face round trip."""

import subprocess
import sys
import textwrap

import pytest
import torch

from cramming.model import (
    CrammedConfig,
    CrammedForCausalLM,
    CrammedForMaskedLM,
    CrammedForSequenceClassification,
    auto_map_of,
)
from cramming.model.positions import POSITIONS

TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, max_seq_length=16)


def tiny(**overrides) -> CrammedConfig:
    return CrammedConfig(**{**TINY, **overrides})


def masked_batch(batch=3, seq=16, vocab=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    labels[:, 7] = ids[:, 7]
    return ids, labels


@pytest.mark.parametrize("position", sorted(POSITIONS))
@pytest.mark.parametrize("layout", [dict(), dict(norm_position="post", final_norm=False, bias=True, ffn="mlp",
                                                 head_transform=True, sparse_prediction=False, norm="rmsnorm"),
                                    dict(norm="scalenorm", qk_norm=True, init="megatron-scaled")])
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_forward_backward(position, layout, objective):
    torch.manual_seed(0)
    head = CrammedForCausalLM if objective == "clm" else CrammedForMaskedLM
    model = head(tiny(position=position, objective=objective, **layout))
    ids, labels = masked_batch()
    out = model(ids, labels=ids if objective == "clm" else labels)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert out.logits.shape[-1] == TINY["vocab_size"]


def test_tied_embeddings_and_no_biases():
    model = CrammedForMaskedLM(tiny())
    assert model.decoder.weight is model.encoder.tokens.weight
    assert not [n for n, _ in model.named_parameters() if n.endswith(".bias") and "norm" not in n]


def test_glu_halves_the_second_projection():
    model = CrammedForMaskedLM(tiny(ffn="glu"))
    ffn = model.encoder.layers[0].ffn
    assert ffn.up.weight.shape == (64, 32) and ffn.down.weight.shape == (32, 32)


def test_sparse_head_gives_the_dense_loss_and_only_pretraining_sees_it():
    """arch.sparse_prediction is the pretraining objective's (pretraining=True): the public forward gives every
    position's logits, as a masked LM does, with the same loss."""
    torch.manual_seed(0)
    sparse = CrammedForMaskedLM(tiny(sparse_prediction=True)).eval()
    dense = CrammedForMaskedLM(tiny(sparse_prediction=False)).eval()
    dense.load_state_dict(sparse.state_dict())
    ids, labels = masked_batch()
    out_sparse = sparse(ids, labels=labels, pretraining=True)
    out_dense = dense(ids, labels=labels, pretraining=True)
    public = sparse(ids, labels=labels)
    assert out_sparse.logits.shape == (6, 97)  # only the 2 masked positions of 3 rows
    assert out_dense.logits.shape == public.logits.shape == (3, 16, 97)
    torch.testing.assert_close(out_sparse.loss, out_dense.loss)
    torch.testing.assert_close(public.loss, out_dense.loss)
    torch.testing.assert_close(public.logits, sparse(ids).logits)


def test_sdpa_and_eager_agree_with_padding():
    torch.manual_seed(0)
    model = CrammedForMaskedLM(tiny(attention_impl="sdpa")).eval()
    eager = CrammedForMaskedLM(tiny(attention_impl="eager")).eval()
    eager.load_state_dict(model.state_dict())
    ids, _ = masked_batch()
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, eager(ids, attention_mask=mask).logits)


def test_padding_does_not_change_real_tokens():
    """A padded row must give the same outputs on its real tokens as the unpadded row alone."""
    torch.manual_seed(0)
    model = CrammedForMaskedLM(tiny(position="learned")).eval()
    ids, _ = masked_batch(batch=1, seq=10)
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=ids.dtype)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1).long()
    torch.testing.assert_close(model(ids).logits, model(padded, attention_mask=mask).logits[:, :10])


@pytest.mark.parametrize("arch", [dict(position="rotary", rotary_pct=0.25), dict(position="alibi"),
                                  dict(attention_pattern="local", attention_window=2)])
def test_attention_options_change_the_model_and_agree_across_kernels(arch):
    torch.manual_seed(0)
    plain = CrammedForMaskedLM(tiny(position="none", init_std=0.3)).eval()  # large enough for peaked attention
    sdpa = CrammedForMaskedLM(tiny(attention_impl="sdpa", **arch)).eval()
    eager = CrammedForMaskedLM(tiny(attention_impl="eager", **arch)).eval()
    sdpa.load_state_dict(plain.state_dict(), strict=False)
    eager.load_state_dict(plain.state_dict(), strict=False)
    ids, _ = masked_batch()
    mask = torch.ones_like(ids)
    mask[0, 11:] = 0
    want = eager(ids, attention_mask=mask).logits
    torch.testing.assert_close(sdpa(ids, attention_mask=mask).logits, want, atol=1e-5, rtol=1e-5)
    assert (plain(ids, attention_mask=mask).logits - want).abs().max() > 0.05


def test_rotary_makes_attention_depend_on_relative_position_only():
    """With rotary alone, shifting the whole input by t positions (same tokens, padded on the left side of a
    longer window) leaves the outputs of the real tokens unchanged."""
    torch.manual_seed(0)
    model = CrammedForMaskedLM(tiny(position="rotary", embedding_norm=False)).eval()
    ids, _ = masked_batch(batch=1, seq=10)
    mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 10)], dim=1).long()
    shifted = torch.cat([torch.zeros(1, 4, dtype=ids.dtype), ids], dim=1)
    torch.testing.assert_close(model(shifted, attention_mask=mask).logits[:, 4:], model(ids).logits,
                               atol=1e-5, rtol=1e-5)


def test_classifier_regression_and_classes():
    ids, _ = masked_batch()
    reg = CrammedForSequenceClassification(tiny(num_labels=1))
    out = reg(ids, labels=torch.tensor([0.5, 1.0, 4.0]))
    assert out.logits.shape == (3, 1) and torch.isfinite(out.loss)
    cls = CrammedForSequenceClassification(tiny(num_labels=3))
    out = cls(ids, labels=torch.tensor([0, 2, 1]))
    assert out.logits.shape == (3, 3) and torch.isfinite(out.loss)


@pytest.mark.parametrize("arch", [
    dict(),
    dict(position="rotary", rotary_pct=0.5, rotary_interleaved=True, attention_pattern=["local", "global"], attention_window=3),
    dict(position="rpe", layout=["gmlp", "attention"], gmlp_attn_dim=8, linear="btt", norm="scalenorm", qk_norm=True),
])
def test_hf_round_trip_in_a_fresh_interpreter(arch, tmp_path):
    """Saved like pretrain.py saves it, the checkpoint loads with trust_remote_code=True where cramming was
    never imported, and gives identical logits; the classifier head loads from the same folder."""
    torch.manual_seed(0)
    model = CrammedForMaskedLM(tiny(**arch)).eval()
    if hasattr(model.encoder.positions, "scale"):
        with torch.no_grad():
            model.encoder.positions.scale.fill_(0.123)  # a trained value must survive the round trip
    model.config.auto_map = auto_map_of(model)
    model.save_pretrained(tmp_path)
    ids, _ = masked_batch()
    torch.save({"ids": ids, "logits": model(ids).logits, "hidden": model.encoder(ids).last_hidden_state},
               tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification
        path = {str(tmp_path)!r}
        expected = torch.load(path + "/expected.pt")
        mlm = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True).eval()
        assert "cramming" not in sys.modules
        assert mlm.decoder.weight.data_ptr() == mlm.encoder.tokens.weight.data_ptr(), "tie lost"
        torch.testing.assert_close(mlm(expected["ids"]).logits, expected["logits"], rtol=0, atol=0)
        enc = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        torch.testing.assert_close(enc(expected["ids"]).last_hidden_state, expected["hidden"], rtol=0, atol=0)
        clf = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True, num_labels=2).eval()
        torch.testing.assert_close(clf.encoder(expected["ids"]).last_hidden_state, expected["hidden"], rtol=0, atol=0)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_attention_pattern_cycles_over_the_layers():
    model = CrammedForMaskedLM(tiny(num_layers=3, attention_pattern=["local", "global"], attention_window=5))
    assert [layer.attn.spec.window for layer in model.encoder.layers] == [5, None, 5]


@pytest.mark.parametrize("scheme", ["normal", "small", "megatron-scaled"])
def test_init_schemes_set_the_documented_stds(scheme):
    torch.manual_seed(0)
    config = tiny(hidden_size=128, num_heads=4, ffn_size=512, num_layers=8, init=scheme, init_std=0.05)
    model = CrammedForMaskedLM(config)
    layer = model.encoder.layers[0]
    plain = 0.05 if scheme != "small" else (2 / (5 * 128)) ** 0.5
    residual = 0.05 / 4.0 if scheme == "megatron-scaled" else plain  # 0.05 / sqrt(2 * 8 layers)
    assert layer.attn.qkv.weight.std().item() == pytest.approx(plain, rel=0.05)
    assert layer.attn.out.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert layer.ffn.down.weight.std().item() == pytest.approx(residual, rel=0.05)


def test_scalenorm_and_qk_norm():
    from cramming.model.norms import ScaleNorm

    norm = ScaleNorm(16, 1e-12, False)
    x = torch.randn(3, 16)
    torch.testing.assert_close(norm(x), x / x.norm(dim=-1, keepdim=True) * 4.0)
    model = CrammedForMaskedLM(tiny(qk_norm=True, norm="rmsnorm")).eval()
    assert model.encoder.layers[0].attn.q_norm.weight.shape == (8,)  # one norm over each head's 8 dims
    with torch.no_grad():  # scaling the query projection cannot change the output once queries are normalised
        ids, _ = masked_batch()
        before = model(ids).logits
        model.encoder.layers[0].attn.qkv.weight[:32] *= 7.0
        torch.testing.assert_close(model(ids).logits, before, atol=1e-4, rtol=1e-4)


def test_rmsnorm_divides_by_the_root_mean_square_plus_arch_norm_eps():
    """RMSNorm (Zhang & Sennrich 2019): y = g * x / sqrt(mean(x^2) + eps), with eps = arch.norm_eps. Small inputs
    make eps matter: torch's default eps would give x / rms(x), about ten times this."""
    model = CrammedForMaskedLM(tiny(norm="rmsnorm", norm_eps=0.1)).eval()
    x = 0.03 * torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(0))
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 0.1)
    for norm in (model.encoder.layers[0].norm1, model.encoder.final_norm, model.encoder.embedding_norm):
        torch.testing.assert_close(norm(x), want)


def test_embedding_dropout_comes_after_the_embedding_norm():
    """BERT's and Cramming's embedding block: dropout(norm(tokens + positions)). In training the embeddings'
    output is then the normalised sum with each entry either zeroed or scaled by 1 / (1 - p); dropout before the
    norm would leave no exact zeros."""
    torch.manual_seed(0)
    model = CrammedForMaskedLM(tiny(hidden_dropout=0.5)).train()
    encoder = model.encoder
    ids, _ = masked_batch()
    got = model(ids, output_hidden_states=True).hidden_states[0]
    with torch.no_grad():
        normed = encoder.embedding_norm(encoder.tokens(ids) + encoder.positions(ids.shape[1], 0, None))
    kept = got != 0
    assert 0.3 < kept.float().mean().item() < 0.7
    torch.testing.assert_close(got[kept], normed[kept] * 2.0)


def test_causal_model_does_not_see_the_future():
    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(objective="clm", position="rotary")).eval()
    ids, _ = masked_batch(batch=2, seq=12)
    changed = ids.clone()
    changed[:, 7:] = torch.randint(5, 97, (2, 5))
    before, after = model(ids).logits, model(changed).logits
    torch.testing.assert_close(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_causal_loss_is_next_token_cross_entropy():
    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(objective="clm"))
    ids, _ = masked_batch(batch=2, seq=10)
    out = model(ids, labels=ids)
    want = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, want)
    # the shifted-target loss (no slice of the logits) has the sliced loss's gradients too
    got = torch.autograd.grad(out.loss, list(model.parameters()), retain_graph=True)
    expected = torch.autograd.grad(want, list(model.parameters()))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    with pytest.raises(ValueError, match="AutoModelForMaskedLM"):
        CrammedForCausalLM(tiny(objective="mlm"))
    with pytest.raises(ValueError, match="causal: it has no masked-LM head; load it with AutoModelForCausalLM"):
        CrammedForMaskedLM(tiny(objective="clm"))


def test_causal_classifier_pools_the_last_real_token():
    torch.manual_seed(0)
    model = CrammedForSequenceClassification(tiny(objective="clm", num_labels=2)).eval()
    ids, _ = masked_batch(batch=1, seq=8)
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=ids.dtype)], dim=1)
    mask = torch.cat([torch.ones(1, 8), torch.zeros(1, 3)], dim=1).long()
    torch.testing.assert_close(model(padded, attention_mask=mask).logits, model(ids).logits)


def test_causal_checkpoint_generates_in_a_fresh_interpreter(tmp_path):
    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(objective="clm", position="rotary", rotary_pct=0.5)).eval()
    model.config.auto_map = auto_map_of(model)
    model.save_pretrained(tmp_path)
    ids = torch.tensor([[2, 17, 45, 9]])
    greedy = ids
    with torch.no_grad():
        for _ in range(5):  # our own greedy loop: the reference for generate()
            greedy = torch.cat([greedy, model(greedy).logits[:, -1:].argmax(-1)], dim=1)
    torch.save({"ids": ids, "greedy": greedy}, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        path = {str(tmp_path)!r}
        expected = torch.load(path + "/expected.pt")
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
        assert "cramming" not in sys.modules
        out = model.generate(expected["ids"], max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(out, expected["greedy"]), (out, expected["greedy"])
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


BLOCK_OPTIONS = [
    dict(position="rpe"),
    dict(position="rpe", rpe_cache=False, rpe_buckets=8, rpe_max_distance=16),
    dict(position="rotary", rotary_every=2, rotary_pct=0.25),
    dict(layout=["gmlp", "gmlp", "attention"], attention_pattern=["local"], attention_window=4),
    dict(layout=["gmlp"], gmlp_attn_dim=8),
    dict(attention_pattern=["stepped", "topk", "global"], attention_window=4, attention_topk=5, attention_impl="eager"),
    dict(linear="monarch", linear_on=["ffn"]),
]


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("options", BLOCK_OPTIONS)
def test_every_block_option_trains_for_both_objectives(options, objective):
    torch.manual_seed(0)
    head = CrammedForCausalLM if objective == "clm" else CrammedForMaskedLM
    model = head(tiny(num_layers=3, objective=objective, **options))
    ids, labels = masked_batch()
    mask = torch.ones_like(ids)
    mask[0, 12:] = 0
    out = model(ids, attention_mask=mask, labels=ids if objective == "clm" else labels)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    if objective == "clm":  # no block may look ahead
        model.eval()
        changed = ids.clone()
        changed[:, 9:] = 5
        torch.testing.assert_close(model(ids).logits[:, :9], model(changed).logits[:, :9])


def test_rpe_cached_equals_uncached():
    torch.manual_seed(0)
    cached = CrammedForMaskedLM(tiny(position="rpe", init_std=0.3)).eval()
    uncached = CrammedForMaskedLM(tiny(position="rpe", rpe_cache=False, init_std=0.3)).eval()
    uncached.load_state_dict(cached.state_dict())
    ids, _ = masked_batch()
    torch.testing.assert_close(cached(ids).logits, uncached(ids).logits, rtol=0, atol=0)


def test_rpe_buckets_follow_t5():
    from cramming.model.relative_bias import relative_buckets

    relative = torch.arange(-40, 41)
    both = relative_buckets(relative, True, 32, 128)
    assert both[40].item() == 0 and both[41].item() == 17 and both[39].item() == 1  # 0, +1, -1
    assert both.max().item() < 32 and both[:40].max().item() < 16 <= both[41:].min().item()
    back = relative_buckets(relative, False, 32, 128)
    assert (back[40:] == 0).all() and back[39].item() == 1  # causal: only the past is told apart


def test_rotary_every_second_layer():
    model = CrammedForMaskedLM(tiny(num_layers=4, position="rotary", rotary_every=2))
    assert [layer.attn.rotary is not None for layer in model.encoder.layers] == [True, False, True, False]


def test_layout_cycles_blocks_and_patterns_cycle_over_attention_blocks():
    model = CrammedForMaskedLM(tiny(num_layers=6, layout=["gmlp", "attention"], attention_pattern=["local", "global"],
                                    attention_window=3))
    kinds = [type(layer).__name__ for layer in model.encoder.layers]
    assert kinds == ["GMLPBlock", "TransformerBlock"] * 3
    assert [model.encoder.layers[i].attn.spec.window for i in (1, 3, 5)] == [3, None, 3]


def test_gmlp_padding_does_not_reach_real_tokens():
    torch.manual_seed(0)
    model = CrammedForMaskedLM(tiny(layout=["gmlp"], gmlp_attn_dim=8, position="learned")).eval()
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.spatial.normal_(0, 0.3)  # trained-looking mixing, not the identity start
    ids, _ = masked_batch(batch=1, seq=10)
    padded = torch.cat([ids, torch.full((1, 6), 7)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1).long()
    torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, :10], model(ids).logits,
                               atol=1e-5, rtol=1e-5)


def test_parameter_count_matches_the_closed_form():
    h, f, layers, vocab, seq = 32, 64, 2, 97, 16
    glu = CrammedForMaskedLM(tiny(position="learned"))
    block = 3 * h * h + h * h + h * f + (f // 2) * h + 2 * h  # qkv, out, up, down, two norm weights
    assert sum(p.numel() for p in glu.parameters()) == vocab * h + seq * h + h + layers * block + h
    gmlp = CrammedForMaskedLM(tiny(position="none", layout=["gmlp"]))
    block = h + h * f + f // 2 + seq * seq + seq + (f // 2) * h  # norm, up, gate norm, spatial + bias, down
    assert sum(p.numel() for p in gmlp.parameters()) == vocab * h + h + layers * block + h


def test_the_model_config_takes_every_arch_option_and_default_from_arch_config():
    """One definition: CrammedConfig's defaults are ArchConfig's, field by field (sections included)."""
    import dataclasses

    from cramming.model.arch import ArchConfig

    config, defaults = CrammedConfig(), ArchConfig()
    assert {f.name: getattr(config, f.name) for f in dataclasses.fields(ArchConfig)} == vars(defaults)
    changed = CrammedConfig(hidden_dropout=0.3, attention={"window": 7}, linear_args={"rank": 3})
    assert (changed.hidden_dropout, changed.attention.window, changed.attention.pattern) == (0.3, 7, ["global"])
    assert changed.linear_args.given() == {"rank": 3}


def test_config_json_nests_the_sections_and_older_flat_keys_still_load(tmp_path):
    config = tiny(attention={"pattern": ["local", "global"], "window": 3}, linear_args={"rank": 4})
    config.save_pretrained(tmp_path)
    import json

    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attention"] == {"pattern": ["local", "global"], "window": 3, "topk": 16}
    assert saved["linear_args"]["rank"] == 4 and "attention_window" not in saved
    assert CrammedConfig.from_pretrained(tmp_path).attention == config.attention
    # a config.json written before the sections existed: flat attention_* keys, linear_args without unset sizes
    saved.pop("attention")
    saved.update(attention_pattern=["local", "global"], attention_window=3, attention_topk=16, linear_args={"rank": 4})
    (tmp_path / "config.json").write_text(json.dumps(saved))
    old = CrammedConfig.from_pretrained(tmp_path)
    assert old.attention == config.attention and old.linear_args == config.linear_args
    assert not hasattr(old, "attention_window")


# The default path's promise (docs/extending.md): a default model's forward and backward read in modeling_crammed.py,
# which calls out only to the extension points it was built with: the attention kernel, the position table, the
# loss, the parametrization's logit multiplier, the forward's context, and the PreTrainedModel base.
DEFAULT_PATH = {"modeling_crammed.py", "attention.py", "positions.py", "losses.py", "parametrization.py", "context.py",
                "pretrained.py"}


@pytest.mark.parametrize("head", ["mlm", "clm"])
def test_the_default_forward_and_backward_read_in_one_file(head):
    """Every function of cramming/model/ that a default crammed BERT (or causal model) calls in a training forward
    and backward is in DEFAULT_PATH, and most calls are modeling_crammed.py's."""
    causal = head == "clm"
    config = tiny(objective="clm", causal=True) if causal else tiny()
    model = (CrammedForCausalLM if causal else CrammedForMaskedLM)(config)
    ids, labels = masked_batch()
    calls = {}

    def count(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and "/cramming/model/" in path:
            name = path.rsplit("/", 1)[1]
            calls[name] = calls.get(name, 0) + 1

    sys.setprofile(count)
    try:
        out = model(ids, labels=labels, **({} if causal else {"pretraining": True}))
        out.loss.backward()
    finally:
        sys.setprofile(None)
    assert set(calls) <= DEFAULT_PATH, calls
    assert calls["modeling_crammed.py"] > sum(calls.values()) / 2, calls
