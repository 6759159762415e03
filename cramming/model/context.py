"""What one forward tells every block besides the hidden state, in one object: the blocks and their attention
read what they need from it, and a new per-forward input is one field here instead of one more argument through
every layer."""

from typing import NamedTuple

import torch

from .rotary import Positions
from .token_dropping import gather_tokens


class Context(NamedTuple):
    padding: torch.Tensor | None = None  # (batch, seq) bool, True = a real token; None: every token is real
    positions: Positions | None = None  # where the rows sit when not at their indices (rotary.Positions)
    documents: torch.Tensor | None = None  # (batch, seq) document ids: no attention across them (data.document_masking)
    bias: torch.Tensor | None = None  # an additive score bias shared by the layers (T5's relative-position bias)
    cache: object | None = None  # this layer's KV cache slot when generating (kv_cache.LayerCache)
    value_embedding: torch.Tensor | None = None  # this layer's value embedding (value_embeddings.py)
    hidden_states: list | None = None  # output_hidden_states: each block's output is appended (stacks.py)
    attentions: list | None = None  # output_attentions: each attention block appends its probabilities

    def kept(self, keep: torch.Tensor, seq_len: int) -> "Context":
        """The context of the kept tokens alone (token dropping): their padding, document ids and positions."""
        ids = keep if self.positions is None else self.positions.ids.gather(1, keep)
        return self._replace(padding=None if self.padding is None else gather_tokens(self.padding, keep),
                             documents=None if self.documents is None else gather_tokens(self.documents, keep),
                             positions=Positions(ids, seq_len))


PLAIN = Context()  # a forward with nothing to tell: every token real, at its index, in one document, no cache


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position within its own document: 0 at the first token of every document (document ids do not
    decrease along a row)."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return index - torch.where(starts, index, 0).cummax(1).values

