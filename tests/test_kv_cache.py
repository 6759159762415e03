"""The KV cache of CrammedForCausalLM.generate: the same tokens and logits as recomputing the prefix, for every
position scheme and attention pattern a causal model can use, left-padded batches included; the cache is really
used (each step feeds one token); blocks that cannot be cached are refused, never answered wrongly."""

import pytest
import torch

from cramming.model import CrammedConfig, CrammedForCausalLM
from cramming.model.attention_masks import alibi_bias, alibi_bias_at, visible_keys
from cramming.model.kv_cache import CACHE_KEY
from cramming.model.patterns import PATTERNS
from cramming.model.positions import POSITIONS

TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, max_seq_length=32,
            objective="clm", hidden_dropout=0.0, attention_dropout=0.0, init_std=0.2)
POSITION_OPTIONS = {
    "none": dict(position="none"),
    "learned": dict(position="learned"),
    "sinusoidal": dict(position="sinusoidal"),
    "scaled-sinusoidal": dict(position="scaled-sinusoidal"),
    "alibi": dict(position="alibi"),
    "rpe": dict(position="rpe", rpe_buckets=8, rpe_max_distance=16),
    "rpe-per-layer": dict(position="rpe", rpe_cache=False, rpe_buckets=8, rpe_max_distance=16),
    "rotary": dict(position="rotary", rotary_pct=0.5),
    "rotary-interleaved-every-2": dict(position="rotary", rotary_interleaved=True, rotary_every=2, num_layers=3),
}
PATTERN_OPTIONS = {
    "global": dict(),
    "local": dict(attention_pattern=["local"], attention_window=3),
    "stepped": dict(attention_pattern=["stepped"], attention_window=4),
    "topk": dict(attention_pattern=["topk"], attention_topk=3, attention_impl="eager"),
    "local-global": dict(attention_pattern=["local", "global"], attention_window=2),
}
PROMPT, NEW = 6, 7


def tiny_model(**overrides) -> CrammedForCausalLM:
    torch.manual_seed(0)
    return CrammedForCausalLM(CrammedConfig(**{**TINY, **overrides})).eval()


def left_padded_prompts():
    """Two prompts of PROMPT tokens; the second is left-padded by 3."""
    ids = torch.randint(5, 97, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


def greedy(model, use_cache: bool):
    """Greedy tokens and raw logits of every step. No token twice in a row (no_repeat_ngram_size): a random tiny
    model would otherwise repeat one token, feeding each step the same input."""
    ids, mask = left_padded_prompts()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                         eos_token_id=None, use_cache=use_cache, return_dict_in_generate=True, output_logits=True,
                         no_repeat_ngram_size=1)
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("pattern", sorted(PATTERN_OPTIONS))
@pytest.mark.parametrize("position", sorted(POSITION_OPTIONS))
def test_greedy_generation_with_the_cache_matches_recomputing_the_prefix(position, pattern):
    model = tiny_model(**POSITION_OPTIONS[position], **PATTERN_OPTIONS[pattern])
    with torch.no_grad():
        tokens, logits = greedy(model, use_cache=True)
        want_tokens, want_logits = greedy(model, use_cache=False)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)


def test_every_causal_position_scheme_and_pattern_is_covered():
    assert {o["position"] for o in POSITION_OPTIONS.values()} == set(POSITIONS)
    assert {p for o in PATTERN_OPTIONS.values() for p in o.get("attention_pattern", ["global"])} == set(PATTERNS)


@pytest.mark.parametrize("options", [dict(position="rotary"), dict(position="alibi", norm_position="post"),
                                     dict(position="learned", qk_norm=True, attention_pattern=["stepped"],
                                          attention_window=2)])
def test_a_cached_step_gives_the_full_forwards_logits(options):
    """Prompt into the cache, then one token, then two at once: each equals the full forward's last positions."""
    model = tiny_model(**options)
    ids, mask = left_padded_prompts()
    more = torch.randint(5, 97, (2, 3), generator=torch.Generator().manual_seed(2))
    full_ids, full_mask = torch.cat([ids, more], 1), torch.cat([mask, torch.ones_like(more)], 1)
    with torch.no_grad():
        full = model(full_ids, attention_mask=full_mask).logits
        cache = getattr(model(ids, attention_mask=mask, use_cache=True), CACHE_KEY)
        assert cache.get_seq_length() == PROMPT
        one = model(more[:, :1], attention_mask=full_mask[:, :PROMPT + 1], **{CACHE_KEY: cache})
        two = model(more[:, 1:], attention_mask=full_mask, **{CACHE_KEY: cache})
    torch.testing.assert_close(one.logits[:, -1], full[:, PROMPT], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(two.logits, full[:, PROMPT + 1:], atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == PROMPT + 3


def tokens_entering(module, model, use_cache: bool) -> list[int]:
    """The sequence length of each call of `module` (the token embedding, the output projection) in greedy()."""
    lengths = []
    hook = module.register_forward_hook(lambda m, args, out: lengths.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            greedy(model, use_cache)
    finally:
        hook.remove()
    return lengths


def tokens_entering_the_encoder(model, use_cache: bool) -> list[int]:
    return tokens_entering(model.encoder.tokens, model, use_cache)


def test_the_cache_feeds_the_encoder_only_the_new_token():
    model = tiny_model(position="rotary")
    assert tokens_entering_the_encoder(model, use_cache=True) == [PROMPT] + [1] * (NEW - 1)
    assert tokens_entering_the_encoder(model, use_cache=False) == list(range(PROMPT, PROMPT + NEW))


def test_generation_projects_only_the_last_position_onto_the_vocabulary():
    model = tiny_model()
    for use_cache in (True, False):
        assert tokens_entering(model.decoder, model, use_cache) == [1] * NEW
    ids, mask = left_padded_prompts()
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        assert full.shape[1] == PROMPT
        torch.testing.assert_close(model(ids, attention_mask=mask, logits_to_keep=2).logits, full[:, -2:])


def test_a_cached_step_builds_its_mask_and_rotary_tables_once_for_all_layers(monkeypatch):
    """A decode step is mostly small ops: the layers of one cached step share its mask and rotary tables
    (context.Context.shared) instead of each building them, and each turns q and k in one kernel call."""
    from cramming.model import attention, rotary

    model = tiny_model(position="rotary", num_layers=3)
    calls = {"mask": 0, "tables": 0, "kernel": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(attention, "build_mask_at", counted("mask", attention.build_mask_at))
    monkeypatch.setattr(rotary, "rotary_cos_sin", counted("tables", rotary.rotary_cos_sin))
    for layer in model.encoder.layers:
        layer.attn.rotary.kernel = counted("kernel", layer.attn.rotary.kernel)
    ids = torch.randint(5, 97, (2, PROMPT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(ids, use_cache=True)[CACHE_KEY]
        calls.update(mask=0, tables=0, kernel=0)
        step = model(ids[:, :1], attention_mask=torch.ones(2, PROMPT + 1, dtype=torch.long), use_cache=True,
                     **{CACHE_KEY: cache})
    assert calls == {"mask": 1, "tables": 1, "kernel": 3}
    full = model(torch.cat([ids, ids[:, :1]], 1)).logits[:, -1]
    torch.testing.assert_close(step.logits[:, -1], full, rtol=1e-5, atol=1e-5)


def test_gmlp_refuses_the_cache_and_generates_by_recomputing():
    model = tiny_model(layout=["gmlp", "attention"], gmlp_attn_dim=8)
    assert tokens_entering_the_encoder(model, use_cache=True) == list(range(PROMPT, PROMPT + NEW))
    with torch.no_grad():
        tokens, _ = greedy(model, use_cache=True)
        assert torch.equal(tokens, greedy(model, use_cache=False)[0])
        ids, mask = left_padded_prompts()
        assert getattr(model(ids, attention_mask=mask, use_cache=True), CACHE_KEY) is None
        filled = getattr(tiny_model()(ids, attention_mask=mask, use_cache=True), CACHE_KEY)
        with pytest.raises(ValueError, match="no KV cache for arch.layout=.*gmlp blocks keep no keys"):
            model(ids[:, -1:], attention_mask=torch.cat([mask, mask[:, -1:]], 1), **{CACHE_KEY: filled})


def test_a_cache_that_drops_keys_or_a_short_mask_is_refused():
    class Forgetful:  # holds 6 tokens but hands back only the newest keys, as a sliding window of 1 would
        def get_seq_length(self, layer_idx=0):
            return PROMPT

        def update(self, k, v, layer_idx, *args, **kwargs):
            return k, v

    model = tiny_model()
    ids, mask = left_padded_prompts()
    with torch.no_grad():
        with pytest.raises(ValueError, match="returned 1 keys for 6 cached"):
            model(ids[:, -1:], **{CACHE_KEY: Forgetful()})
        cache = getattr(model(ids, attention_mask=mask, use_cache=True), CACHE_KEY)
        with pytest.raises(ValueError, match="attention_mask has 1 columns for 6 cached and 1 new"):
            model(ids[:, -1:], attention_mask=mask[:, -1:], **{CACHE_KEY: cache})


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("causal", [False, True])
def test_each_patterns_mask_at_absolute_positions_is_the_kernels_mask(name, causal):
    """visible(query positions, key positions) over a whole sequence is attention_masks.visible_keys, and its rows for
    the last queries are the same rows: the kernels' definition, which a cached step must follow."""
    pattern, seq = PATTERNS[name], 12
    args = pattern.kernel_args(CrammedConfig(attention_window=4, attention_topk=3))
    args = {k: v for k, v in args.items() if k in ("window", "stepped")}
    pos = torch.arange(seq)
    want = visible_keys(seq, causal, args.get("window"), None, "cpu", args.get("stepped"))
    want = torch.ones(seq, seq, dtype=torch.bool) if want is None else want[0, 0]
    got = pattern.visible(pos, pos, **args)
    got = torch.ones(seq, seq, dtype=torch.bool) if got is None else got
    if causal:
        got = got & (pos[:, None] >= pos[None, :])
    assert torch.equal(got, want)
    if (rows := pattern.visible(pos[9:], pos, **args)) is not None:
        assert torch.equal(rows, pattern.visible(pos, pos, **args)[9:])


def test_alibi_at_absolute_positions_is_the_kernels_bias():
    pos = torch.arange(10)
    torch.testing.assert_close(alibi_bias_at(pos, pos, 6), alibi_bias(10, 6, "cpu"))
    torch.testing.assert_close(alibi_bias_at(pos[7:], pos, 6), alibi_bias(10, 6, "cpu")[:, :, 7:])


def test_the_speedrun_blocks_generate_the_same_with_the_cache():
    """Value embeddings, U-net skips and soft-capped logits are per token: cached steps must match the prefix."""
    model = tiny_model(num_layers=4, value_embeddings=1, unet_skips=True, logit_softcap=5.0, position="rotary")
    with torch.no_grad():
        for module in model.modules():  # the mixing weights start where they change nothing visible: move them
            for name, param in module.named_parameters(recurse=False):
                if "mix" in name or "skip" in name or "weight" == name and param.ndim == 1 and param.numel() < 8:
                    param.add_(0.3)
        tokens, logits = greedy(model, use_cache=True)
        want_tokens, want_logits = greedy(model, use_cache=False)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    assert logits.abs().max() <= 5.0
