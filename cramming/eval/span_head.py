"""WSC's span-pair head, after the SuperGLUE BERT baseline (itself after Tenney et al. 2019, "edge probing").

The sentence is encoded once; each span (the noun phrase, the pronoun) is pooled from its tokens' states
with self-attentive span pooling (Lee et al. 2017: a learned score per token, softmaxed within the span), and
the two pooled vectors, concatenated, go to a small classifier: does the pronoun refer to the noun phrase?
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel

from .finetune import Head, auto_model, collate, require_fast


class SpanPairClassifier(nn.Module):
    def __init__(self, encoder, hidden: int, dropout: float, num_labels: int = 2):
        super().__init__()
        self.encoder = encoder
        self.attend = nn.ModuleList([nn.Linear(hidden, 1), nn.Linear(hidden, 1)])  # one pooling score per span
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(2 * hidden, hidden), nn.Tanh(),
                                        nn.Dropout(dropout), nn.Linear(hidden, num_labels))

    @property
    def config(self):
        """The checkpoint's, as every head's model has it."""
        return self.encoder.config

    def forward(self, input_ids, attention_mask, spans):
        """spans: [batch, 2, tokens] booleans, True on each span's tokens."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = []
        for k, attend in enumerate(self.attend):
            weights = attend(hidden).squeeze(-1).float().masked_fill(~spans[:, k], float("-inf")).softmax(-1)
            pooled.append((weights.to(hidden.dtype)[..., None] * hidden).sum(1))
        return self.classifier(torch.cat(pooled, -1))


def build_span_model(checkpoint: str, dropout: float, random_init: bool) -> SpanPairClassifier:
    encoder = auto_model(AutoModel, checkpoint, random_init, dropout)
    return SpanPairClassifier(encoder, encoder.config.hidden_size, dropout)


def encode_spans(tokenizer, examples, max_length: int):
    """Token ids, and per example the token positions of each span (those whose characters overlap it). A span
    cut off by truncation falls back to the first token, so its pooling stays defined."""
    require_fast(tokenizer, "WSC's span head", "character offsets")
    encoded = tokenizer([e.text for e in examples], truncation=True, max_length=max_length,
                        return_offsets_mapping=True)
    positions = []
    for example, offsets in zip(examples, encoded["offset_mapping"]):
        spans = []
        for start, end in (example.span1, example.span2):
            inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
            spans.append(inside or [0])
        positions.append(spans)
    return encoded["input_ids"], positions


def collate_spans(ids, positions, pad_id, device) -> dict:
    batch = collate(ids, pad_id, device)
    spans = torch.zeros((len(ids), 2, batch["input_ids"].shape[1]), dtype=torch.bool)
    for i, pair in enumerate(positions):
        for k, where in enumerate(pair):
            spans[i, k, where] = True
    return batch | {"spans": spans.to(device)}


@dataclass
class Spans:
    """One sentence, encoded, with the token positions of its two spans."""

    ids: list[int]
    positions: list[list[int]]
    label: int


class SpanPairs(Head):
    def build(self, checkpoint, task, recipe, random_init):
        return build_span_model(checkpoint, recipe.dropout, random_init)

    def encode(self, tokenizer, task, rows, max_length):
        ids, positions = encode_spans(tokenizer, rows, max_length)
        return [Spans(i, p, row.label) for i, p, row in zip(ids, positions, rows)]

    def collate(self, items, pad_id, device):
        return collate_spans([item.ids for item in items], [item.positions for item in items], pad_id, device)

    def loss(self, model, inputs, items):
        labels = torch.tensor([item.label for item in items], device=inputs["input_ids"].device)
        return F.cross_entropy(model(**inputs).float(), labels)

    def decode(self, outputs, items, task):
        return outputs.argmax(-1).tolist()
