"""MLM masking with a fixed number of masked positions per sequence.

A fixed count keeps every tensor shape static (the sparse prediction head sees exactly
batch * count rows each step), which is what lets torch.compile and CUDA graphs specialise once.
Which positions make up the count is `train.masking` (MASKINGS): single tokens, whole words, or SpanBERT's spans;
spans also take SpanBERT's count (ceil, not BERT's round) and its one 80/10/10 draw per span (trait per_span).
"""

import math
from dataclasses import dataclass

import torch

from ..config import TrainConfig
from ..registry import Registry

MASKINGS = Registry("masking", traits={
    "reads_words": "it reads the tokenizer's word starts (MaskContext.starts_word)",
    "grouped": "it masks groups of tokens together (words, spans): only an objective that masks tokens can use it",
    "per_span": "SpanBERT's counting and replacement: ceil(mask_prob x seq_len) positions, and one 80/10/10 draw "
                "per run of consecutive masked positions (so a span is all [MASK], all random or all kept)",
})
MASKINGS.serves(TrainConfig, "masking")


@dataclass
class MaskContext:
    """What a masking mode may read besides the ids: the special ids, the tokenizer's word-start table
    (bool per vocabulary id, whole-word) and SpanBERT's span parameters."""

    special_ids: torch.Tensor
    starts_word: torch.Tensor | None = None
    span_p: float = 0.2
    span_max_length: int = 10


@MASKINGS.register("token")
def token_positions(input_ids, count: int, ctx: MaskContext, generator) -> torch.Tensor:
    """Cramming's: `count` positions uniformly at random, special tokens last."""
    scores = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    scores = scores.masked_fill(torch.isin(input_ids, ctx.special_ids), -1.0)
    return scores.topk(count, dim=1).indices


def word_ids(input_ids, ctx: MaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    """(word index of each token, whether it is special). A token starts a word when the tokenizer says so, when
    it is special, when it follows a special token (a document's first word after [SEP], which byte-level BPE
    writes without its space marker) and at position 0 (a chunk may start inside a word)."""
    special = torch.isin(input_ids, ctx.special_ids)
    starts = ctx.starts_word[input_ids] | special
    starts[:, 1:] |= special[:, :-1]
    starts[:, 0] = True
    return starts.long().cumsum(1) - 1, special


@MASKINGS.register("whole-word", reads_words=True, grouped=True)
def whole_word_positions(input_ids, count: int, ctx: MaskContext, generator) -> torch.Tensor:
    """Words in random order, all of each word's pieces, until `count` tokens: every masked word is whole except
    the last one taken in a row, of which only its first pieces are masked when it does not fit. Vectorised:
    each token's key is (its word's rank, its offset in the word) and the `count` smallest keys are taken."""
    batch, seq_len = input_ids.shape
    word, special = word_ids(input_ids, ctx)
    positions = torch.arange(seq_len, device=input_ids.device).expand(batch, seq_len)
    first = torch.zeros_like(word).scatter_reduce_(1, word, positions, "amin", include_self=False)
    offset = positions - first.gather(1, word)
    scores = torch.rand(batch, seq_len, generator=generator, device=input_ids.device)  # one per word slot
    special_word = torch.zeros_like(special).scatter_(1, word, special)  # a special token is a word of its own
    scores.masked_fill_(special_word, -1.0)  # ranked after every ordinary word
    rank = torch.empty_like(word).scatter_(1, scores.argsort(dim=1, descending=True, stable=True), positions.clone())
    key = rank.gather(1, word) * seq_len + offset
    return key.topk(count, dim=1, largest=False).indices


def span_lengths(shape, p: float, max_length: int, generator, device) -> torch.Tensor:
    """SpanBERT's span lengths: geometric on 1, 2, ... with P(l) = p (1 - p)^(l - 1), truncated at max_length
    (renormalised: mean 3.8 for p = 0.2, max 10), drawn by inverting the truncated CDF."""
    uniform = torch.rand(shape, generator=generator, device=device)
    if p >= 1:
        return torch.ones(shape, dtype=torch.long, device=device)
    q = 1 - p
    tail = uniform * (1 - q ** max_length)  # CDF(l) = 1 - q^l, so l = ceil(log(1 - u (1 - q^max)) / log q)
    lengths = torch.ceil(torch.log1p(-tail) / math.log(q)).long()
    return lengths.clamp_(1, max_length)


@MASKINGS.register("span", per_span=True, grouped=True)
def span_positions(input_ids, count: int, ctx: MaskContext, generator) -> torch.Tensor:
    """SpanBERT's: spans with geometric lengths and uniform starts, taken in order until `count` =
    ceil(mask_prob x seq_len) tokens are masked, and each run of masked tokens is then all [MASK], all random or
    all kept (one 80/10/10 draw per span, SpanBERT's `--replacement-method span`). `count` spans are drawn per
    row (never fewer than needed); a token covered twice counts once, the last span taken is cut where the count
    is reached, special tokens inside a span are skipped, and should the spans cover fewer than `count`
    ordinary tokens, random single tokens make up the rest."""
    batch, seq_len = input_ids.shape
    device, longest = input_ids.device, ctx.span_max_length
    lengths = span_lengths((batch, count), ctx.span_p, longest, generator, device)
    starts = torch.randint(seq_len, (batch, count), generator=generator, device=device)
    spare = torch.rand(batch, seq_len, generator=generator, device=device, dtype=torch.float64)  # exact keys
    covered = count * longest  # keys below this: inside a span, in span order
    key = spare + covered  # uncovered tokens after every span, in random order
    order = torch.arange(count, device=device) * longest
    for step in range(longest):  # at most max_length (10) vectorised scatters
        where = starts + step
        inside = (step < lengths) & (where < seq_len)
        value = torch.where(inside, (order + step).double(), float(2 * covered))
        key.scatter_reduce_(1, where.clamp(max=seq_len - 1), value, "amin")
    special = torch.isin(input_ids, ctx.special_ids)
    key = torch.where(special, spare + 4 * covered, key)  # last, in random order (no ties: a GPU's topk)
    return key.topk(count, dim=1, largest=False).indices


def mask_count(mask_prob: float, seq_len: int, masking: str) -> int:
    """Masked positions per row. BERT (create_pretraining_data.py) and Cramming round; SpanBERT (masking.py,
    every scheme) takes the ceiling, so a span mode masks ceil(0.15 x 128) = 20 where BERT masks 19. The
    product is rounded to 9 decimals first: 0.07 x 100 is 7.000000000000001 in floats, and is 7."""
    exact = mask_prob * seq_len
    return max(1, math.ceil(round(exact, 9)) if MASKINGS.trait(masking, "per_span") else round(exact))


def span_index(positions: torch.Tensor, seq_len: int) -> torch.Tensor:
    """For each chosen position (batch, count), the index of its run of consecutive chosen positions in the row:
    SpanBERT merges overlapping and touching spans (merge_intervals) and draws the treatment once per merged
    span. A row has at most `count` runs, so the index picks from `count` draws."""
    chosen = torch.zeros(positions.shape[0], seq_len, dtype=torch.bool, device=positions.device)
    chosen.scatter_(1, positions, True)
    starts = chosen.clone()
    starts[:, 1:] &= ~chosen[:, :-1]
    return (starts.long().cumsum(1) - 1).gather(1, positions)


def mask_tokens(
    input_ids: torch.Tensor,
    mask_prob: float,
    mask_token_id: int,
    vocab_size: int,
    special_ids: torch.Tensor,
    mask_token_share: float = 0.8,
    generator: torch.Generator | None = None,
    masking: str = "token",
    context: MaskContext | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, labels): `mask_count` positions per row get labels, chosen by `masking`; of those,
    `mask_token_share` become [MASK], the rest split evenly into a random token and the unchanged token, drawn
    per token (BERT's, also for whole words) or, for a per_span mode, once per span (SpanBERT's; the random
    tokens are still one per position). Special tokens ([CLS], [SEP], [PAD]) are never chosen while enough
    ordinary tokens remain. The draws are the same tensors in every mode (exact resume by position)."""
    batch, seq_len = input_ids.shape
    count = mask_count(mask_prob, seq_len, masking)
    device = input_ids.device
    context = context if context is not None else MaskContext(special_ids)
    positions = MASKINGS.get_or_explain(masking)(input_ids, count, context, generator)

    labels = torch.full_like(input_ids, -100)
    labels.scatter_(1, positions, input_ids.gather(1, positions))

    inputs = input_ids.clone()
    choice = torch.rand(batch, count, generator=generator, device=device)
    if MASKINGS.trait(masking, "per_span"):
        choice = choice.gather(1, span_index(positions, seq_len))  # every token of a span reads its span's draw
    replace_with_mask = choice < mask_token_share
    replace_with_random = (choice >= mask_token_share) & (choice < mask_token_share + (1 - mask_token_share) / 2)
    random_tokens = torch.randint(vocab_size, (batch, count), generator=generator, device=device)
    chosen = inputs.gather(1, positions)
    chosen = torch.where(replace_with_mask, torch.full_like(chosen, mask_token_id), chosen)
    chosen = torch.where(replace_with_random, random_tokens, chosen)
    inputs.scatter_(1, positions, chosen)
    return inputs, labels


# A mask's generator seed is seed * 2**40 + position: each run seed owns 2**40 (about 10**12) stream positions, far
# more than any run reaches, so two seeds never share a mask; seeds up to 2**24 keep it within torch's 64 bits.
POSITION_BITS = 40


class PositionalMasks:
    """Mask draws as a function of (seed, position in the training stream), not of a generator's history: a
    resumed run, and every rank of a distributed one, draw exactly the masks one uninterrupted process would,
    and there is no generator state to save."""

    def __init__(self, seed: int, device):
        self.seed = seed
        self.generator = torch.Generator(device=device)

    def at(self, position: int) -> torch.Generator:
        return self.generator.manual_seed((self.seed << POSITION_BITS) + position)
