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

from ..errors import UserError
from .finetune import auto_model, collate, in_chunks, run_epochs

log = logging.getLogger(__name__)
IGNORED = -100  # the label of pieces that are not a word's first: cross-entropy skips them


@dataclass
class EncodedWords:
    ids: list[list[int]]  # token ids per sentence
    labels: list[list[int]]  # per token: the word's tag index on its first piece, IGNORED elsewhere
    firsts: list[list[int]]  # per sentence, per word: the position of its first piece, or -1 if it has none

    def unseen(self) -> int:
        """Words without a piece in the input (truncated, or dropped by the tokenizer): predicted O."""
        return sum(p < 0 for row in self.firsts for p in row)


def encode_words(tokenizer, sentences, label_index: dict[str, int], max_length: int) -> EncodedWords:
    """Token ids of every sentence with the first-piece alignment of its words."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("eval=ner needs a fast tokenizer (word_ids, to find each word's first piece); "
                        "this checkpoint's is not")
    encoded = tokenizer([s.words for s in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    out = EncodedWords([], [], [])
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
        out.ids.append(ids)
        out.labels.append(labels)
        out.firsts.append(firsts)
    return out


def build_token_classifier(checkpoint: str, labels: list[str], dropout: float, random_init: bool):
    """The checkpoint's encoder (or, random_init, a fresh one of its architecture) with a new per-token classifier."""
    return auto_model(AutoModelForTokenClassification, checkpoint, random_init, dropout, num_labels=len(labels),
                      id2label=dict(enumerate(labels)), label2id={tag: i for i, tag in enumerate(labels)})


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


def predict_tags(model, encoded: EncodedWords, labels: list[str], pad_id, batch_size, device, autocast):
    """Each sentence's tags: the argmax at every word's first piece; O for a word without one."""
    out = [["O"] * len(firsts) for firsts in encoded.firsts]

    def forward(chunk):
        return model(**collate([encoded.ids[i] for i in chunk], pad_id, device)).logits

    for chunk, logits in in_chunks(len(encoded.ids), batch_size, autocast, forward,
                                   length=lambda i: len(encoded.ids[i])):
        for row, i in zip(logits.argmax(-1).cpu().tolist(), chunk):
            out[i] = [labels[row[p]] if p >= 0 else "O" for p in encoded.firsts[i]]
    return out


def finetune_tokens(checkpoint, tokenizer, task, recipe, seed, runtime, random_init, label, progress=None) -> dict:
    torch.manual_seed(seed)
    index = {tag: i for i, tag in enumerate(task.label_names)}
    train = encode_words(tokenizer, task.train, index, recipe.max_length)
    dev = {split: encode_words(tokenizer, rows, index, recipe.max_length) for split, rows in task.dev.items()}
    unseen = {split: encoded.unseen() for split, encoded in dev.items()}
    for split, count in unseen.items():
        if count:
            log.warning("%s/%s: %d word(s) have no piece within eval.recipe.max_length=%d (or none at all): "
                        "predicted O", task.name, split, count, recipe.max_length)
    model = build_token_classifier(checkpoint, task.label_names, recipe.dropout, random_init).to(runtime.device)
    autocast, pad_id, device = runtime.autocast(), tokenizer.pad_token_id, runtime.device

    def batch_loss(batch):
        inputs = collate([train.ids[i] for i in batch], pad_id, device)
        with autocast():
            logits = model(**inputs).logits
        return token_loss(logits, pad_labels([train.labels[i] for i in batch], device))

    def predict(split):
        return predict_tags(model, dev[split], task.label_names, pad_id, recipe.batch_size, device, autocast)

    result = run_epochs(task, recipe, seed, runtime, model, [len(r) for r in train.ids], batch_loss, predict, label,
                        progress)
    return result | {"unseen_words": unseen}

