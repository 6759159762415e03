"""WSC's span-pair head, after the SuperGLUE BERT baseline (itself after Tenney et al. 2019, "edge probing").

The sentence is encoded once; each span (the noun phrase, the pronoun) is pooled from its tokens' states
with self-attentive span pooling (Lee et al. 2017: a learned score per token, softmaxed within the span), and
the two pooled vectors, concatenated, go to a small classifier: does the pronoun refer to the noun phrase?
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel

from ..errors import UserError
from .finetune import auto_model, collate, in_chunks, run_epochs


class SpanPairClassifier(nn.Module):
    def __init__(self, encoder, hidden: int, dropout: float, num_labels: int = 2):
        super().__init__()
        self.encoder = encoder
        self.attend = nn.ModuleList([nn.Linear(hidden, 1), nn.Linear(hidden, 1)])  # one pooling score per span
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(2 * hidden, hidden), nn.Tanh(),
                                        nn.Dropout(dropout), nn.Linear(hidden, num_labels))

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
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("WSC's span head needs a fast tokenizer (character offsets); this checkpoint's is not")
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


def finetune_span_pairs(checkpoint, tokenizer, task, recipe, seed, runtime, random_init, label, progress=None):
    torch.manual_seed(seed)
    ids, positions = encode_spans(tokenizer, task.train, recipe.max_length)
    labels = torch.tensor([e.label for e in task.train], dtype=torch.long)
    dev = {split: encode_spans(tokenizer, rows, recipe.max_length) for split, rows in task.dev.items()}
    model = build_span_model(checkpoint, recipe.dropout, random_init).to(runtime.device)
    autocast, pad_id, device = runtime.autocast(), tokenizer.pad_token_id, runtime.device

    def batch_loss(batch):
        with autocast():
            logits = model(**collate_spans([ids[i] for i in batch], [positions[i] for i in batch], pad_id, device))
        return F.cross_entropy(logits.float(), labels[batch].to(device))

    def predict(split):
        split_ids, split_positions = dev[split]

        def forward(chunk):
            return model(**collate_spans([split_ids[i] for i in chunk], [split_positions[i] for i in chunk], pad_id,
                                         device))

        chunks = in_chunks(len(split_ids), recipe.batch_size, autocast, forward)
        return np.array([pick for _, logits in chunks for pick in logits.argmax(-1).tolist()])

    return run_epochs(task, recipe, seed, runtime, model, [len(r) for r in ids], batch_loss, predict, label, progress)

