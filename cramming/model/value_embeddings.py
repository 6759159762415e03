"""Value embeddings (the GPT speedrun, `arch.value_embeddings`): extra token-embedding tables whose lookups are
mixed into the attention values of chosen layers, `v <- a v + b e` with a learned (a, b) per layer. As in the record,
table i serves layer i and its mirror among the last layers (`arch.value_embeddings` = k tables: the first k and the
last k layers), so the input tokens reach the late layers' values directly."""

import torch
from torch import nn


def value_layers(config) -> dict[int, int]:
    """layer index -> table index (config: a CrammedConfig)."""
    k, n = config.value_embeddings, config.num_layers
    return {**{i: i for i in range(k)}, **{n - k + i: i for i in range(k)}}


class ValueEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(config.vocab_size, config.hidden_size)
                                    for _ in range(config.value_embeddings))
        self.layers = value_layers(config)

    def forward(self, input_ids: torch.Tensor) -> dict[int, torch.Tensor]:
        """layer index -> its (batch, seq, hidden) value embedding; each table is looked up once."""
        looked_up = [table(input_ids) for table in self.tables]
        return {layer: looked_up[table] for layer, table in self.layers.items()}


class ValueMix(nn.Module):
    """One layer's mix: a v + b e, both weights starting at 0.5 (the record's lambdas)."""

    def __init__(self):
        super().__init__()
        self.weights = nn.Parameter(torch.full((2,), 0.5))

    def init_weights_(self, init, std: float) -> None:
        init.constant_(self.weights, 0.5)

    def forward(self, v: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """v: (batch, heads, seq, head_dim); embedding: (batch, seq, hidden), split into the same heads."""
        batch, heads, seq_len, head_dim = v.shape
        e = embedding.view(batch, seq_len, heads, head_dim).transpose(1, 2).to(v.dtype)
        return self.weights[0] * v + self.weights[1] * e
