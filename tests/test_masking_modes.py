"""train.masking: whole words (the tokenizer's word starts) and SpanBERT's spans mask exactly as many positions per
row as single tokens do, draw their masks from the positional generator (exact resume), and train."""

import pytest
import torch
from test_resume import TINY, config_for, final_weights, sigterm_at, whole_and_resumed  # noqa: F401  a fixture
from tokenizers import Tokenizer, models, pre_tokenizers

from cramming import pretraining
from cramming.data.tokenizer import train_tokenizer, word_starts
from cramming.errors import UserError
from cramming.train.masking import MaskContext, PositionalMasks, mask_tokens, span_lengths, word_ids

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


def test_span_masks_runs_of_the_same_count():
    """Span masking: the same count per row, no special token, and masked runs as long as SpanBERT's spans
    (a little longer where spans touch), where single tokens give runs near 1."""
    ids = batch(rows=256, seq=512)
    span = masked(ids, "span", prob=0.1, ctx=context(span_p=0.2, span_max_length=10))
    assert (span.sum(1) == 51).all() and not span[:, 0].any() and not span[:, 50].any()
    span_runs, token_runs = runs(span), runs(masked(ids, "token", prob=0.1))
    assert 3.5 < sum(span_runs) / len(span_runs) < 4.6 and max(span_runs) > 10 - 1
    assert sum(token_runs) / len(token_runs) < 1.2
    short = masked(ids, "span", prob=0.1, ctx=context(span_p=1.0, span_max_length=10))
    assert sum(runs(short)) / len(runs(short)) < 1.2  # p = 1: every span is one token


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


@pytest.mark.parametrize("override,message", [
    ("train.masking=words", r"train.masking='words' is not a valid option; choose one of: span, token, whole-word"),
    ("train.span.p=0", r"train.span.p=0.0 is invalid: must be in \(0, 1\]"),
])
def test_bad_masking_options_stop_with_one_line(override, message):
    with pytest.raises(UserError, match=f"^{message}$"):
        config_for(*TINY, "train.masking=span", override)


def test_a_causal_objective_refuses_whole_words():
    with pytest.raises(UserError, match=r"^train.masking='whole-word' is invalid: arch.objective=clm masks nothing"):
        config_for(*TINY, "arch=gpt-tiny", "train.masking=whole-word")


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


def test_a_whole_word_run_resumes_bitwise(sigterm_at, tmp_path):  # noqa: F811  the fixture imported above
    """Stopped by SIGTERM in step 1 of 4 (its first of two microbatches) and resumed: the same weights bit for bit,
    as the token mode's."""
    whole_and_resumed([*RUN, "train.masking=whole-word"], sigterm_at, tmp_path, stop_at=1)
    want, got = final_weights(tmp_path / "whole"), final_weights(tmp_path / "stopped")
    assert all(torch.equal(got[k], want[k]) for k in want)
