"""The "tokens" head (eval=ner): a tag per word from the checkpoint's AutoModelForTokenClassification.

Words go to the tokenizer as given (`is_split_into_words`); a word's tag is trained on, and predicted from, its
FIRST word piece only (BERT's CoNLL-2003 recipe); its other pieces and the special tokens carry the label -100
(no loss, never read). A word with no piece in the input -- cut off by eval.recipe.max_length, or dropped whole by
the tokenizer (Cramming's normaliser removes non-ASCII characters, so "€" has no piece) -- is predicted `O`, and
scored as such; each run counts them per dev split (results.json: runs[].unseen_words). A causal checkpoint's
first piece sees only the words to its left.
"""

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AutoModelForTokenClassification

from .finetune import Head, auto_model, require_fast

log = logging.getLogger(__name__)
IGNORED = -100  # the label of pieces that are not a word's first: cross-entropy skips them


@dataclass
class Words:
    """One sentence, encoded."""

    ids: list[int]  # its token ids
    labels: list[int]  # per token: the word's tag index on its first piece, IGNORED elsewhere
    firsts: list[int]  # per word: the position of its first piece, or -1 if it has none (truncated, or dropped)


def encode_words(tokenizer, sentences, label_index: dict[str, int], max_length: int) -> list[Words]:
    """Token ids of every sentence with the first-piece alignment of its words."""
    require_fast(tokenizer, "eval=ner", "word_ids, to find each word's first piece")
    encoded = tokenizer([s.words for s in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    out = []
    for i, sentence in enumerate(sentences):
        firsts = [-1] * len(sentence.words)
        for position, word in enumerate(encoded.word_ids(i)):
            if word is not None and firsts[word] < 0:
                firsts[word] = position
        ids = encoded["input_ids"][i]
        labels = [IGNORED] * len(ids)
        for word, position in enumerate(firsts):
            if position >= 0:
                labels[position] = label_index[sentence.tags[word]]
        out.append(Words(ids, labels, firsts))
    return out


def unseen(sentences: list[Words]) -> int:
    """Words without a piece in the input (truncated, or dropped by the tokenizer): predicted O."""
    return sum(p < 0 for sentence in sentences for p in sentence.firsts)


def pad_labels(rows: list[list[int]], device) -> torch.Tensor:
    width = max(len(row) for row in rows)
    out = torch.full((len(rows), width), IGNORED, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out.to(device)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled pieces (first pieces), as the model's own loss; but 0, not nan, for a
    batch without any (every word dropped by the tokenizer), so one such batch cannot poison the weights."""
    total = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORED, reduction="sum")
    return total / labels.ne(IGNORED).sum().clamp(min=1)


class Tagger(Head):
    """Each word's tag: the argmax at its first piece; O for a word without one."""

    def build(self, checkpoint, task, recipe, random_init):
        labels = task.label_names
        return auto_model(AutoModelForTokenClassification, checkpoint, random_init, recipe.dropout,
                          num_labels=len(labels), id2label=dict(enumerate(labels)),
                          label2id={tag: i for i, tag in enumerate(labels)})

    def encode(self, tokenizer, task, rows, max_length):
        return encode_words(tokenizer, rows, {tag: i for i, tag in enumerate(task.label_names)}, max_length)

    def loss(self, model, inputs, items):
        labels = pad_labels([item.labels for item in items], inputs["input_ids"].device)
        return token_loss(model(**inputs).logits, labels)

    def decode(self, outputs, items, task):
        rows = outputs.logits.argmax(-1).cpu().tolist()
        return [[task.label_names[row[p]] if p >= 0 else "O" for p in item.firsts] for row, item in zip(rows, items)]

    def record(self, train, dev, answers):
        counts = {split: unseen(items) for split, items in dev.items()}
        for split, count in counts.items():
            if count:
                log.warning("%s: %d word(s) have no piece within eval.recipe.max_length (or none at all): "
                            "predicted O", split, count)
        return {"unseen_words": counts}
