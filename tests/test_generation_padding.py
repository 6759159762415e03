"""Left-padded batches generate what each prompt generates alone, for every position scheme and attention pattern.

Padding must not count as positions. The reference's rule (transformers, `prepare_inputs_for_generation`):

    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)

Without it, a prompt behind k pads would read the position table at rows k.., turn rotary by other angles and
start the stepped blocks elsewhere than alone. Distances (causality, windows, ALiBi, T5 buckets) count indices,
which left padding leaves unchanged between real tokens; the pads themselves are masked as keys.
"""

import pytest
import torch

from cramming.model import CrammedConfig, CrammedForCausalLM
from cramming.model.attention import ATTENTION_KERNELS, kernel_problem
from cramming.model.context import position_ids_from_mask
from cramming.model.kv_cache import CACHE_KEY
from cramming.model.patterns import PATTERNS
from cramming.model.positions import POSITIONS

TINY = dict(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, ffn_size=64, max_seq_length=32,
            objective="clm", init_std=0.2, rpe_buckets=8, rpe_max_distance=16, rotary_pct=0.5)
LENGTHS, NEW, PAD = (7, 3, 5), 6, 0  # pads 0, 4 and 2: not whole stepped blocks of 3


def tiny_model(position: str, pattern: str, **overrides) -> CrammedForCausalLM:
    """Window and block 3, top-3; the SDPA kernel unless it refuses the pattern (top-k: eager)."""
    options = dict(TINY, position=position, attention_pattern=[pattern], attention_window=3, attention_topk=3,
                   **overrides)
    if kernel_problem(ATTENTION_KERNELS["sdpa"], CrammedConfig(**options)) is not None:
        options["attention_impl"] = "eager"
    torch.manual_seed(0)
    return CrammedForCausalLM(CrammedConfig(**options)).eval()


def prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(5, 97, (n,), generator=g) for n in LENGTHS]


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def greedy(model, ids, mask, use_cache: bool):
    """New tokens and raw logits. No token twice in a row and never the pad (which a padded row would otherwise
    ban and a lone one not): a random tiny model would repeat one token, feeding each step the same input."""
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD,
                         eos_token_id=None, use_cache=use_cache, no_repeat_ngram_size=1, suppress_tokens=[PAD],
                         return_dict_in_generate=True, output_logits=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def assert_batch_generates_each_alone(model, use_cache: bool):
    rows = prompts()
    with torch.no_grad():
        tokens, logits = greedy(model, *left_padded(rows), use_cache)
        for i, row in enumerate(rows):
            alone_tokens, alone_logits = greedy(model, row[None], torch.ones(1, len(row), dtype=torch.long),
                                                use_cache)
            assert torch.equal(tokens[i], alone_tokens[0]), f"prompt {i} of {len(row)} tokens"
            torch.testing.assert_close(logits[i], alone_logits[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("position", sorted(POSITIONS))
def test_a_left_padded_batch_generates_what_each_prompt_generates_alone(position, pattern, use_cache):
    assert_batch_generates_each_alone(tiny_model(position, pattern), use_cache)


def test_a_gmlp_layout_generates_each_prompt_as_alone():
    """gMLP's spatial gate is indexed by position: a padded row must mix with its real positions' weights."""
    model = tiny_model("learned", "global", layout=["gmlp", "attention"])
    with torch.no_grad():
        for block in model.encoder.layers[::2]:  # the gate starts as the identity: give it positions to tell apart
            block.spatial.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    assert_batch_generates_each_alone(model, use_cache=False)


def padded_and_alone_logits(model, use_cache: bool, position_ids: bool = True):
    """The padded batch's logits (full forward, or the prompt into a cache then the rest one token at a time) and
    each row's logits alone, at the real tokens."""
    rows = prompts()
    ids, mask = left_padded(rows)
    pos = position_ids_from_mask(mask) if position_ids else None
    with torch.no_grad():
        if not use_cache:
            logits = model(ids, attention_mask=mask, position_ids=pos).logits
        else:
            first = model(ids[:, :3], attention_mask=mask[:, :3], use_cache=True,
                          position_ids=None if pos is None else pos[:, :3])
            steps, cache = [first.logits], getattr(first, CACHE_KEY)
            for t in range(3, ids.shape[1]):
                out = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=None if pos is None
                            else pos[:, t:t + 1], **{CACHE_KEY: cache})
                steps.append(out.logits)
            logits = torch.cat(steps, 1)
        alone = [model(row[None]).logits[0] for row in rows]
    return [logits[i, -len(row):] for i, row in enumerate(rows)], alone


@pytest.mark.parametrize("use_cache", [False, True], ids=["full", "cached"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("position", sorted(POSITIONS))
def test_the_forward_at_position_ids_is_the_unpadded_rows_forward(position, pattern, use_cache):
    padded, alone = padded_and_alone_logits(tiny_model(position, pattern), use_cache)
    for got, want in zip(padded, alone):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position, pattern", [("learned", "global"), ("scaled-sinusoidal", "local"),
                                               ("none", "stepped")])
def test_counting_the_padding_as_positions_would_change_the_padded_rows(position, pattern):
    """The tests above are not vacuous: without position_ids, absolute positions and stepped blocks see the pads."""
    padded, alone = padded_and_alone_logits(tiny_model(position, pattern), False, position_ids=False)
    torch.testing.assert_close(padded[0], alone[0], atol=1e-5, rtol=1e-5)  # the longest row: no padding
    assert not all(torch.allclose(p, a, atol=1e-3) for p, a in zip(padded[1:], alone[1:]))  # four and two pads


def test_generation_derives_position_ids_by_transformers_rule():
    model = tiny_model("learned", "global")
    ids = torch.arange(10, 20).view(2, 5)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    want = torch.tensor([[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]])
    assert torch.equal(model.prepare_inputs_for_generation(ids, mask, use_cache=False)["position_ids"], want)
    with torch.no_grad():
        cache = getattr(model(ids[:, :3], attention_mask=mask[:, :3], use_cache=True), CACHE_KEY)
    inputs = model.prepare_inputs_for_generation(ids, mask, use_cache=True, **{CACHE_KEY: cache})
    assert torch.equal(inputs["input_ids"], ids[:, 3:]) and torch.equal(inputs["position_ids"], want[:, 3:])
    assert model.prepare_inputs_for_generation(ids, torch.ones_like(mask), use_cache=False)["position_ids"] is None


def test_position_ids_of_the_wrong_shape_are_refused():
    model = tiny_model("learned", "global")
    ids, mask = left_padded(prompts())
    with pytest.raises(ValueError, match=r"position_ids has shape \(3, 6\); .* \(3, 7\)"):
        model(ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)[:, 1:])
