"""FLOPs per token, counted from the model that was built, so structured linear layers count their own."""


def forward_flops_per_token(model, seq_len: int, predicted_share: float = 1.0) -> int:
    """Forward FLOPs (2 per multiply-add) for one token: every block projection (each layer kind reports its own
    count), the attention scores and weighted sum (4 * seq * hidden per layer, half of it when causal), and the
    output head on the share of tokens it sees (the sparse MLM head: only the masked ones). Training is ~3x this."""
    c = model.config
    projections = sum(m.flops_per_token() for m in model.encoder.layers.modules() if hasattr(m, "flops_per_token"))
    attention = 4 * seq_len * c.hidden_size * c.num_layers // (2 if c.objective == "clm" else 1)
    head = 2 * c.hidden_size * c.vocab_size * predicted_share
    return int(projections + attention + head)
