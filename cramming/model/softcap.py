"""Logit soft-capping (Gemma 2, and the GPT speedrun's output head): `c * tanh(logits / c)` keeps every output logit
inside (-c, c) while leaving small ones almost unchanged, so no logit can run away early in training. It applies
wherever the head's logits are made: the inference outputs, the plain loss and the fused loss (fused_loss.py)."""

import torch


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """`cap * tanh(logits / cap)`, or the logits themselves when cap is None (off)."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


