"""What one forward tells every block besides the hidden state, in one object (Context): the blocks and their
attention read what they need from it, and a new per-forward input is one field here instead of one more argument
through every layer. With it, where the forward's tokens sit: position_ids as given or derived from the attention
mask, and each token's position within its packed document."""

from typing import NamedTuple

import torch


class Positions(NamedTuple):
    """Where the rows of q and k sit when that is not simply 0 .. seq - 1: a subset of a sequence's tokens (token
    dropping), or positions given by the caller (position_ids: left-padded generation counts only real tokens)."""

    ids: torch.Tensor  # (batch, rows) the rows' positions
    seq_len: int  # a bound on every position: the tables must reach it
    keys: torch.Tensor | None = None  # (batch, keys) the keys' positions when they are more rows (a KV cache)

    @property
    def key_ids(self) -> torch.Tensor:
        return self.ids if self.keys is None else self.keys


class Context(NamedTuple):
    padding: torch.Tensor | None = None  # (batch, seq) bool, True = a real token; None: every token is real
    positions: Positions | None = None  # where the rows sit when not at their indices (Positions)
    documents: torch.Tensor | None = None  # (batch, seq) document ids: no attention across them (data.document_masking)
    bias: torch.Tensor | None = None  # an additive score bias shared by the layers (T5's relative-position bias)
    cache: object | None = None  # this layer's KV cache slot when generating (kv_cache.LayerCache)
    value_embedding: torch.Tensor | None = None  # this layer's value embedding (value_embeddings.py)
    hidden_states: list | None = None  # output_hidden_states: each block's output is appended (record)
    attentions: list | None = None  # output_attentions: each attention block appends its probabilities
    shared: dict | None = None  # what the layers of one cached step build once and share (attention.mask_at)

    def record(self, x: torch.Tensor) -> torch.Tensor:
        """x, a block's output, kept for output_hidden_states when they were asked for."""
        if self.hidden_states is not None:
            self.hidden_states.append(x)
        return x


PLAIN = Context()  # a forward with nothing to tell: every token real, at its index, in one document, no cache


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position within its own document: 0 at the first token of every document (document ids do not
    decrease along a row)."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return index - torch.where(starts, index, 0).cummax(1).values


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position among the real tokens of its row, as transformers derives it for generation:
    cumsum(mask) - 1, and 1 on the padding (any valid row: padding is masked out as a key)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)


def token_positions(position_ids, attention_mask, past: int, seq_len: int) -> Positions | None:
    """The per-forward Positions of the new tokens (Positions), or None for past .. past + seq_len - 1.
    With a cache, the cached keys' positions (which the stepped pattern reads) are derived from attention_mask,
    so beam search's reordering of the mask reorders them too."""
    if position_ids is None:
        return None
    batch = attention_mask.shape[0] if attention_mask is not None else position_ids.shape[0]
    if position_ids.dim() != 2 or position_ids.shape[1] != seq_len or position_ids.shape[0] not in (1, batch):
        raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}; it needs one position per new token: "
                         f"({batch}, {seq_len})")
    ids = position_ids.expand(batch, seq_len)
    if not past:
        return Positions(ids, past + seq_len)
    cached = (position_ids_from_mask(attention_mask)[:, :past] if attention_mask is not None
              else torch.arange(past, device=ids.device).expand(batch, past))
    return Positions(ids, past + seq_len, torch.cat([cached, ids], 1))
