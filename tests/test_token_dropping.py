"""Token dropping (arch.token_dropping, model/token_dropping.py): which tokens the middle layers see, what the dropped
ones carry past them, the importance averages and their update from both loss paths, the forwards that never drop,
the FLOPs count, what it accepts (what it refuses: the table in tests/test_refusals.py), exact resume and a
whole CLI run."""

import math
from pathlib import Path

import pytest
import torch
from conftest import run_pretrain
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file
from test_resume import NAN_RUN, sigterm_at  # noqa: F401  (the fixture, for the resume test)
from test_resume import config_for as run_config

from cramming.model.configuration_crammed import CrammedConfig
from cramming.model.context import Context
from cramming.model.heads import CrammedForSequenceClassification
from cramming.model.modeling_crammed import CrammedForMaskedLM
from cramming.model.context import Positions
from cramming.model.token_dropping import TokenImportance, dropping_layers, kept_only_layers
from cramming.train.flops import block_flops, forward_flops_per_token
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
VOCAB, SEQ, PAD, CLS, SEP, MASK = 64, 16, 0, 2, 3, 4
SIZES = {"vocab_size": VOCAB, "num_layers": 4, "hidden_size": 32, "num_heads": 2, "ffn_size": 64}


def config(keep=0.5, **arch):
    dropping = {"keep": keep, **arch.pop("token_dropping", {})}
    return CrammedConfig(**{**SIZES, **arch}, token_dropping=dropping)


def model(keep=0.5, cls=CrammedForMaskedLM, seed=0, **arch):
    torch.manual_seed(seed)
    return cls(config(keep, **arch))


def batch(seed=0):
    """Ids 5.. with a [CLS] first, a [SEP] and two [MASK]s; labels on every fourth position."""
    ids = torch.randint(5, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[:, 7], ids[:, 5], ids[:, 9] = CLS, SEP, MASK, MASK
    labels = torch.full_like(ids, -100)
    labels[:, 1::4] = ids[:, 1::4]
    labels[:, 5], labels[:, 9] = 11, 12
    return ids, labels


def record_layer_inputs(m) -> dict:
    seen = {}
    for i, layer in enumerate(m.encoder.layers):
        layer.register_forward_pre_hook(lambda mod, args, i=i: seen.setdefault(i, args[0].detach().clone()))
    return seen


def test_the_dropping_layers_see_exactly_k_tokens():
    """4 layers: the default range is the reference's [1, 3), layer 1 reading every token (cross_first); layers
    [1, 3] without cross_first and [0, 3] with it: the layers that see only the kept tokens get k = round(0.5 * 16)
    = 8 or round(0.3 * 16) = 5 rows."""
    for keep, drop, k, kept_only in ((0.5, {}, 8, [2]), (0.3, {"layers": [1, 3], "cross_first": False}, 5, [1, 2]),
                                     (0.5, {"layers": [0, 3]}, 8, [1, 2])):
        m = model(keep, token_dropping=drop).train()
        seen = record_layer_inputs(m)
        m(*batch()[:1], labels=batch()[1], pretraining=True)
        assert list(kept_only_layers(m.config)) == kept_only
        assert [seen[i].shape[1] for i in range(4)] == [k if i in kept_only else SEQ for i in range(4)], drop


def test_the_reference_layout_numerically():
    """The TF reference (official/projects/token_dropping/encoder.py): "For a 12-layer BERT: 1. All tokens fist go
    though 5 transformer layers, then 2. Only important tokens go through 1 transformer layer with cross attention
    to unimportant tokens, then 3. Only important tokens go through 5 transformer layers without cross attention.
    4. Finally, all tokens go through the last layer." The dropped tokens rejoin there with the state they had
    before step 2 (its x_not_selected), merged back by argsort of [selected, not_selected]. Rebuilt here the
    reference's way at 6 layers (2 + 1 + 2 + 1) and compared with the encoder's forward."""
    assert (dropping_layers(config(num_layers=12)), kept_only_layers(config(num_layers=12))) == (range(5, 11),
                                                                                                  range(6, 11))
    m = model(num_layers=6).eval()
    ids = batch()[0]
    keep = m.token_importance.choose(ids)
    dropped = torch.ones(2, SEQ, dtype=torch.bool).scatter(1, keep, False).nonzero()[:, 1].view(2, -1)
    enc, take = m.encoder, lambda x, at: x.gather(1, at[..., None].expand(-1, -1, x.shape[-1]))
    with torch.no_grad():
        x = enc.embedding_norm(enc.tokens(ids) + enc.positions(SEQ, 0))
        for layer in enc.layers[:2]:  # 1. every token
            x = layer(x)
        selected, not_selected = take(x, keep), take(x, dropped)
        x_selected = enc.layers[2](torch.cat([selected, not_selected], 1))[:, :keep.shape[1]]  # 2. cross-attention
        for layer in enc.layers[3:5]:  # 3. the kept tokens alone
            x_selected = layer(x_selected)
        order = torch.cat([keep, dropped], 1).argsort(1)  # 4. merged back, then every token
        want = enc.final_norm(enc.layers[5](take(torch.cat([x_selected, not_selected], 1), order)))
        got = enc(ids, keep=keep).last_hidden_state
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, enc(ids).last_hidden_state, atol=1e-3)  # and it is not the undropped model


def test_the_lowest_importance_ids_are_dropped_and_specials_kept():
    importance = TokenImportance(config(0.5))
    importance.loss.copy_(torch.arange(VOCAB, dtype=torch.float32))  # id i has running loss i
    importance.loss[MASK] = importance.loss[CLS] = importance.loss[SEP] = -5.0  # specials are kept whatever they hold
    importance.loss[PAD] = 100.0  # and padding dropped first whatever it holds
    ids = torch.tensor([[CLS, 40, 6, MASK, 50, 7, SEP, 30, 8, 60, 9, 20, 10, 55, PAD, PAD]])
    keep = importance.choose(ids)
    assert keep.tolist() == [[0, 1, 3, 4, 6, 7, 9, 13]]  # specials, then 60, 55, 50, 40, 30; never 20, pads, 6-10
    hidden = importance.choose(ids, attention_mask=(torch.arange(SEQ) != 13).long()[None])  # a hidden 55
    assert hidden.tolist() == [[0, 1, 3, 4, 6, 7, 9, 11]]


def test_dropped_tokens_pass_the_middle_layers_unchanged():
    """Layers [1, 3) of 4: what enters layer 3 at a dropped position is exactly what entered layer 1 there."""
    m = model(token_dropping={"layers": [1, 3]}).train()
    seen = record_layer_inputs(m)
    first = []
    m.encoder.layers[0].register_forward_hook(lambda mod, args, out: first.append(out.detach().clone()))
    ids, labels = batch()
    keep = m.token_importance.choose(ids)
    m(ids, labels=labels, pretraining=True)
    dropped = torch.ones(2, SEQ, dtype=torch.bool).scatter(1, keep, False)
    assert dropped.sum() == 2 * (SEQ - 8)
    assert torch.equal(seen[3][dropped], first[0][dropped])
    assert not torch.isclose(seen[3][~dropped], first[0][~dropped]).all(-1).any()  # the kept ones went through


def test_rotary_turns_the_kept_tokens_by_their_own_positions():
    """A dropping layer on the kept tokens gives what it gives on the whole sequence with only those keys visible."""
    m = model(position="rotary", token_dropping={"layers": [1, 3]}).eval()
    layer = m.encoder.layers[1]
    x = torch.randn(2, SEQ, 32)
    keep = torch.tensor([[0, 2, 3, 7, 8, 9, 12, 15], [1, 4, 5, 6, 10, 11, 13, 14]])
    visible = torch.zeros(2, SEQ, dtype=torch.bool).scatter(1, keep, True)
    with torch.no_grad():
        whole = layer(x, Context(padding=visible))
        kept = layer(x.gather(1, keep[..., None].expand(-1, -1, 32)), Context(positions=Positions(keep, SEQ)))
    torch.testing.assert_close(kept, whole.gather(1, keep[..., None].expand(-1, -1, 32)))


def test_the_importance_moves_toward_the_observed_losses():
    importance = TokenImportance(config(0.5, token_dropping={"decay": 0.9}))
    start = math.log(VOCAB)
    importance.update(torch.tensor([7, 7, 9, -100, 11]), torch.tensor([1.0, 3.0, 5.0, 50.0, float("nan")]))
    want = torch.full((VOCAB,), start)
    want[7], want[9] = 0.9 * start + 0.1 * 2.0, 0.9 * start + 0.1 * 5.0  # the mean of id 7's two losses
    torch.testing.assert_close(importance.loss, want)  # -100 and the NaN loss left out

    m = model().train()
    ids, labels = batch()
    before = m.token_importance.loss.clone()
    m(ids, labels=labels, pretraining=True)
    moved = (m.token_importance.loss != before).nonzero().flatten().tolist()
    assert moved == sorted(set(labels[labels != -100].tolist()))


def test_fused_and_plain_losses_give_the_same_update():
    ids, labels = batch()
    results = {}
    for loss in ("plain", "fused"):
        m = model(loss_impl=loss).train()
        out = m(ids, labels=labels, pretraining=True)
        out.loss.backward()
        results[loss] = (out.loss.detach(), m.token_importance.loss, m.decoder.weight.grad)
    (loss_p, imp_p, grad_p), (loss_f, imp_f, grad_f) = results["plain"], results["fused"]
    assert not torch.equal(imp_p, torch.full((VOCAB,), math.log(VOCAB)))
    torch.testing.assert_close(imp_f, imp_p)
    torch.testing.assert_close(loss_f, loss_p)
    torch.testing.assert_close(grad_f, grad_p)


def test_eval_finetuning_inference_and_keep_one_are_the_undropped_model():
    ids, labels = batch()
    plain, dropping = model(None), model(0.5)
    with torch.no_grad():
        for mode in ("eval", "train"):
            getattr(plain, mode)(), getattr(dropping, mode)()
            assert torch.equal(plain(ids).logits, dropping(ids).logits), mode  # no labels: inference never drops
        plain.eval(), dropping.eval()
        assert torch.equal(plain(ids, labels=labels).loss, dropping(ids, labels=labels).loss)  # validation
        for cls in (CrammedForSequenceClassification,):
            a, b = model(None, cls).train(), model(0.5, cls).train()
            outputs = []
            for m in (a, b):
                torch.manual_seed(1)  # the same classifier dropout
                outputs.append(m(ids).logits)
            assert torch.equal(*outputs)
    one = model(1.0).train()
    assert one.token_importance is None
    plain.train()
    torch.testing.assert_close(one(ids, labels=labels, pretraining=True).loss, plain(ids, labels=labels).loss)
    dropped = dropping.train()(ids, labels=labels, pretraining=True).loss
    assert not torch.equal(dropped, plain(ids, labels=labels).loss)
    # only the pretraining objective drops: a training forward with labels from anyone else (the Trainer) does not
    torch.testing.assert_close(dropping(ids, labels=labels).loss, plain(ids, labels=labels).loss)


def test_flops_count_the_kept_only_layers_at_k_tokens():
    """Default (4 layers: [1, 3), cross_first): layer 1 runs whole, layer 2 on k; without cross_first both on k."""
    off, on, plain = model(None), model(0.5), model(0.5, token_dropping={"cross_first": False})
    blocks = on.encoder.layers
    saved = block_flops(blocks[2], SEQ) - block_flops(blocks[2], 8) * 8 / SEQ
    assert forward_flops_per_token(on, SEQ) == int(forward_flops_per_token(off, SEQ) - saved)
    assert forward_flops_per_token(plain, SEQ) == int(forward_flops_per_token(off, SEQ) - 2 * saved)
    assert saved > 0.45 * block_flops(blocks[2], SEQ)


BASE = ["arch=crammed-bert-tiny", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128", "impl=cpu",
        "data=sanity", "data.vocab_size=256", "data.seq_length=32", "arch.token_dropping.keep=0.5"]


def load(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=BASE + list(overrides)))


def test_what_is_accepted():
    for overrides in ([], ["arch.position=rotary"], ["arch.position=learned"], ["arch.position=none"],
                      ["arch.attention.pattern=[topk]", "impl.attention=eager"], ["arch.num_layers=2"],
                      ["arch.token_dropping.layers=[0,3]", "arch.token_dropping.cross_first=false"],
                      ["arch.token_dropping.keep=null", "arch.num_layers=1"]):
        load(*overrides)


def test_resuming_gives_the_same_weights_and_importance_bitwise(sigterm_at, tmp_path):
    """Stopped at step 2 of 6 and resumed: the importance buffer comes back with the weights, so the run ends as
    the uninterrupted one, bit for bit."""
    from cramming import pretraining
    from cramming.errors import RunStopped

    run = [*NAN_RUN, "arch.num_layers=3", "arch.token_dropping.keep=0.5", "train.checkpoint_every_minutes=null"]
    pretraining.pretrain(run_config(*run), tmp_path / "whole")
    sigterm_at.append(2)
    with pytest.raises(RunStopped):
        pretraining.pretrain(run_config(*run), tmp_path / "stopped")
    sigterm_at.clear()
    assert pretraining.pretrain(run_config(*run), tmp_path / "stopped")["resumed_from"].endswith("step-00000002")
    want, got = (load_file(tmp_path / d / "checkpoint" / "model.safetensors") for d in ("whole", "stopped"))
    assert "token_importance.loss" in want and not torch.equal(want["token_importance.loss"],
                                                               torch.full((256,), math.log(256)))
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_cli_run_drops_tokens_end_to_end(tmp_path):
    result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity", "name=td",
                          "train.max_steps=3", "arch.token_dropping.keep=0.5", run_dir=tmp_path,
                          in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    weights = load_file(tmp_path / "checkpoint" / "model.safetensors")
    vocab = weights["token_importance.loss"].shape[0]
    assert (weights["token_importance.loss"] < math.log(vocab)).any()  # three steps of losses went in
