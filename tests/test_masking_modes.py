"""train.masking: whole words (the tokenizer's word starts) mask exactly as many positions per row as single tokens
do; SpanBERT's spans mask its ceil(n p) and replace each span as one (all [MASK], all random or all kept); all
draw their masks from the positional generator (exact resume), and train."""

import pytest
import torch
from test_resume import TINY, config_for, final_weights, sigterm_at, whole_and_resumed  # noqa: F401  a fixture
from tokenizers import Tokenizer, models, pre_tokenizers

from cramming import pretraining
from cramming.data.tokenizer import train_tokenizer, word_starts
from cramming.errors import UserError
from cramming.train.masking import MaskContext, PositionalMasks, mask_count, mask_tokens, span_lengths, word_ids

SPECIAL = torch.tensor([0, 2, 3, 4])
VOCAB = 1000
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "while", "unbelievable", "tokenization",
         "happens", "quietly"]


def batch(rows=256, seq=128):
    ids = torch.randint(5, VOCAB, (rows, seq), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 2  # [CLS]
    ids[:, 50] = 3  # [SEP] between documents
    return ids


def context(**kwargs) -> MaskContext:
    """About 40 % of the vocabulary continues a word (mean word length about 1.7 tokens)."""
    starts = torch.rand(VOCAB, generator=torch.Generator().manual_seed(1)) < 0.6
    starts[:5] = True
    return MaskContext(SPECIAL, starts_word=starts, **kwargs)


def masked(ids, masking, seed=3, ctx=None, prob=0.25):
    _, labels = mask_tokens(ids, prob, 4, VOCAB, SPECIAL, 0.8, torch.Generator().manual_seed(seed), masking,
                            ctx or context())
    return labels != -100


def runs(chosen: torch.Tensor) -> list[int]:
    """The lengths of the masked runs of consecutive positions, over all rows."""
    lengths = []
    for row in chosen.tolist():
        run = 0
        for flag in [*row, False]:
            if flag:
                run += 1
            elif run:
                lengths.append(run)
                run = 0
    return lengths


def test_whole_word_masks_whole_words_and_the_same_count():
    """Every masked word is masked whole, except at most one per row (the last taken), of which a prefix is masked;
    each row masks exactly the token mode's count, never a special token."""
    ids = batch()
    ctx = context()
    chosen = masked(ids, "whole-word", ctx=ctx)
    assert torch.equal(chosen.sum(1), masked(ids, "token").sum(1)) and (chosen.sum(1) == 32).all()
    assert not chosen[:, 0].any() and not chosen[:, 50].any()
    word, _ = word_ids(ids, ctx)
    in_word = torch.zeros_like(word).scatter_add_(1, word, torch.ones_like(word))
    hit = torch.zeros_like(word).scatter_add_(1, word, chosen.long())
    partial = (hit > 0) & (hit < in_word)
    assert (partial.sum(1) <= 1).all()
    assert partial.any(1).float().mean() > 0.2  # the rule is exercised: words do not always fit exactly
    first_masked = chosen & (word != torch.cat([word[:, :1] - 1, word[:, :-1]], 1))  # masked word starts
    prefix_only = chosen[:, 1:] & ~chosen[:, :-1] & (word[:, 1:] == word[:, :-1])
    assert not prefix_only.any() and first_masked.any()  # a partial word is masked from its first piece on
    inside = masked(ids[:, 1:], "whole-word", ctx=ctx)  # rows that start inside a word (packed chunks can)
    assert (inside.sum(1) == 32).all()


def test_whole_word_changes_which_tokens_are_masked_together():
    """The effect: a masked continuation piece has its word's previous piece masked too (always, by the rule
    above); with single tokens, only as often as the mask rate."""
    ids = batch()
    ctx = context()
    word, _ = word_ids(ids, ctx)
    continuation = torch.cat([torch.zeros_like(ids[:, :1], dtype=torch.bool), word[:, 1:] == word[:, :-1]], 1)
    for masking, low, high in (("whole-word", 0.999, 1.0), ("token", 0.2, 0.3)):
        chosen = masked(ids, masking, ctx=ctx)
        cont = chosen[:, 1:] & continuation[:, 1:]
        together = (cont & chosen[:, :-1]).sum() / cont.sum()
        assert low <= together.item() <= high, masking


def tiny_tokenizer(kind: str):
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20
    return train_tokenizer(texts, kind, 90, 64)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_word_starts_follow_the_tokenizers_words(kind):
    """Tokens group into the tokenizer's own words (its pre-tokenizer's, as Hugging Face's word_ids gives them):
    WordPiece by its '##' continuations, byte-level BPE by 'Ġ', unigram by '▁'."""
    tok = tiny_tokenizer(kind)
    table = word_starts(tok, len(tok))
    text = "unbelievable tokenization happens over the lazy quick dogs quietly"
    encoding = tok(text)
    ids = torch.tensor([encoding["input_ids"]])
    word, _ = word_ids(ids, MaskContext(torch.tensor(tok.all_special_ids), starts_word=table))
    theirs = encoding.word_ids()[1:-1]  # between [CLS] and [SEP]
    ours = word[0, 1:-1].tolist()
    assert len(set(theirs)) == len(text.split()) < len(theirs)  # some words have several pieces
    assert [a - ours[0] for a in ours] == [b - theirs[0] for b in theirs]
    assert word[0, 1] == 1 and word[0, -1] == word[0, -2] + 1  # [CLS] and [SEP] are words of their own


def test_a_tokenizer_without_word_boundaries_is_refused_with_one_line():
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(UserError, match=r"^train.masking='whole-word' is invalid: .* marks no word boundaries"):
        word_starts(PreTrainedTokenizerFast(tokenizer_object=raw), 2)


def test_span_lengths_are_truncated_geometric():
    lengths = span_lengths((200_000,), 0.2, 10, torch.Generator().manual_seed(0), "cpu").float()
    q, top = 0.8, 10
    mean = sum(n * 0.2 * q ** (n - 1) for n in range(1, top + 1)) / (1 - q ** top)  # 3.797, SpanBERT's 3.8
    assert lengths.mean().item() == pytest.approx(mean, abs=0.03)
    assert lengths.min() == 1 and lengths.max() == top
    assert (lengths == 1).float().mean().item() == pytest.approx(0.2 / (1 - q ** top), abs=0.01)


def test_span_masks_runs_of_spanberts_length():
    """Span masking: SpanBERT's count in every row (ceil(51.2) = 52), no special token, and masked runs as long
    as SpanBERT's spans (a little longer where spans touch), where single tokens give runs near 1."""
    ids = batch(rows=256, seq=512)
    span = masked(ids, "span", prob=0.1, ctx=context(span_p=0.2, span_max_length=10))
    assert (span.sum(1) == 52).all() and not span[:, 0].any() and not span[:, 50].any()
    span_runs, token_runs = runs(span), runs(masked(ids, "token", prob=0.1))
    assert 3.5 < sum(span_runs) / len(span_runs) < 4.6 and max(span_runs) > 10 - 1
    assert sum(token_runs) / len(token_runs) < 1.2
    short = masked(ids, "span", prob=0.1, ctx=context(span_p=1.0, span_max_length=10))
    assert sum(runs(short)) / len(runs(short)) < 1.2  # p = 1: every span is one token


def test_span_count_is_spanberts_ceiling():
    """SpanBERT masks ceil(n p) tokens (20 at 128 x 0.15); BERT and Cramming round (19), kept for the token and
    whole-word modes. A product whole in decimal is not pushed up by float error (0.07 x 100 = 7.000000000000001)."""
    assert mask_count(0.15, 128, "span") == 20
    assert mask_count(0.15, 128, "token") == mask_count(0.15, 128, "whole-word") == 19
    assert mask_count(0.07, 100, "span") == 7 and mask_count(0.001, 128, "span") == 1
    ids = batch(rows=64, seq=128)
    for masking, want in (("span", 20), ("token", 19), ("whole-word", 19)):
        assert (masked(ids, masking, prob=0.15).sum(1) == want).all(), masking


def treatments(masking: str, share: float = 0.8, rows: int = 2048, seq: int = 128) -> torch.Tensor:
    """(runs, 3): how many tokens of each maximal run of masked positions (SpanBERT's merged spans) show [MASK],
    a random token and their own token, at mask_prob 0.15. Random tokens are drawn below 4 (vocab_size=4), so
    none equals [MASK] (4) or an original (>= 5): every token's treatment reads exactly."""
    ids = batch(rows, seq)
    inputs, labels = mask_tokens(ids, 0.15, 4, 4, SPECIAL, share, torch.Generator().manual_seed(5), masking,
                                 context())
    kind = torch.where(inputs == 4, 0, torch.where(inputs == ids, 2, 1))
    gap = torch.zeros(rows, 1, dtype=torch.long)  # a column of unmasked ends every row's last run
    chosen = torch.cat([labels != -100, gap.bool()], 1).flatten()
    start = chosen & ~torch.cat([torch.zeros(1, dtype=torch.bool), chosen[:-1]])
    run = (start.long().cumsum(0) - 1)[chosen]
    kind = torch.cat([kind, gap], 1).flatten()[chosen]
    return torch.zeros(int(start.sum()), 3, dtype=torch.long).index_put_((run, kind), torch.ones_like(run), True)


@pytest.mark.parametrize("masking", ["span", "whole-word", "token"])
def test_a_span_is_all_mask_all_random_or_all_kept(masking):
    """SpanBERT's --replacement-method span: one 80/10/10 draw per span, so no span mixes treatments. Whole words
    and single tokens keep BERT's draw per token: a run of L tokens mixes with probability 1 - 0.8^L - 2 x 0.1^L."""
    counts = treatments(masking)
    length, mixed = counts.sum(1), (counts > 0).sum(1) > 1
    several = length > 1
    assert several.sum() > 3000  # enough multi-token runs to see mixing
    if masking == "span":
        assert mixed.sum().item() == 0
    else:
        expected = (1 - 0.8 ** length - 2 * 0.1 ** length)[several].double().mean().item()
        assert expected > 0.3 and mixed[several].double().mean().item() == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("share", [0.8, 0.5, 0.0])
def test_spans_split_into_mask_random_kept_by_the_share(share):
    """Counted per span, not per token: train.mask_token_share of the spans are [MASK], the rest split evenly
    into random and kept (SpanBERT's 0.8 / 0.1 / 0.1 at the default)."""
    shown = treatments("span", share) > 0
    assert (shown.sum(1) == 1).all() and len(shown) > 8000
    rest = (1 - share) / 2
    assert shown.double().mean(0).tolist() == pytest.approx([share, rest, rest], abs=0.015)


@pytest.mark.parametrize("masking", ["whole-word", "span"])
def test_the_same_position_gives_the_same_masks(masking):
    """Masks are a function of (seed, stream position): what a resumed run relies on."""
    ids = batch(rows=8)
    masks = PositionalMasks(7, "cpu")
    ctx = context()
    first = mask_tokens(ids, 0.25, 4, VOCAB, SPECIAL, 0.8, masks.at(1234), masking, ctx)
    other = mask_tokens(ids, 0.25, 4, VOCAB, SPECIAL, 0.8, masks.at(1235), masking, ctx)
    again = mask_tokens(ids, 0.25, 4, VOCAB, SPECIAL, 0.8, masks.at(1234), masking, ctx)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])


RUN = TINY + ["train.max_steps=4", "train.batch_size=16", "impl.microbatch_size=8", "train.batch_ramp=0",
              "train.schedule=step-constant", "train.warmup=0", "train.checkpoint_every_minutes=null"]


@pytest.mark.parametrize("extra", [["train.masking=whole-word"], ["train.masking=whole-word", "data.tokenizer.kind=bpe"],
                                   ["train.masking=span"], ["train.masking=span", "arch.objective=rtd"]])
def test_a_short_run_trains_with_each_masking(extra, tmp_path):
    summary = pretraining.pretrain(config_for(*RUN, *extra), tmp_path)
    assert summary["steps"] == 4 and summary["val_loss"] == summary["val_loss"]  # finite
    if extra == ["train.masking=whole-word"]:  # masks differ from the token mode's: so do the trained weights
        token = pretraining.pretrain(config_for(*RUN), tmp_path / "token")
        assert token["val_loss"] != summary["val_loss"]
        a, b = final_weights(tmp_path), final_weights(tmp_path / "token")
        assert any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("masking", ["whole-word", "span"])
def test_a_masked_run_resumes_bitwise(masking, sigterm_at, tmp_path):  # noqa: F811  the fixture imported above
    """Stopped by SIGTERM in step 1 of 4 (its first of two microbatches) and resumed: the same weights bit for bit,
    as the token mode's (span's per-span draws included: they come from the same positional generator)."""
    whole_and_resumed([*RUN, f"train.masking={masking}"], sigterm_at, tmp_path, stop_at=1)
    want, got = final_weights(tmp_path / "whole"), final_weights(tmp_path / "stopped")
    assert all(torch.equal(got[k], want[k]) for k in want)
