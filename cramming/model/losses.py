"""How a pretraining head computes its loss, by name (`impl.loss`, saved as the config's `loss_impl`).

Both give the same loss; they differ in memory. `plain` (here) projects the hidden states to full logits and takes
their cross-entropy; `fused` (cramming/kernels/fused_loss.py, registered with the kernels: training only, so
checkpoints never need it) never materialises the logits while training, and falls back to `plain` in evaluation,
which wants the logits themselves. `per_token` also returns each row's loss (detached), from the
same pass: what token dropping's importance averages are updated from (token_dropping.py).
"""

import torch
from torch import nn
from torch.nn import functional as F

from .registry import Registry

LOSSES = Registry("loss")


def head_logits(hidden: torch.Tensor, decoder: nn.Linear, softcap: float | None = None, multiplier: float = 1.0):
    """The head's logits: the decoder applied to the hidden states times the output multiplier
    (arch.parametrization: 1 / m under mup), W (h / m) + b as the `mup` package's MuReadout (the bias is not
    scaled), then soft-capped at softcap if set."""
    return soft_cap(decoder(hidden if multiplier == 1.0 else hidden * multiplier), softcap)


@LOSSES.register_one("plain")
class PlainLoss:
    """The logits of every predicted row, then cross-entropy: what Hugging Face heads do."""

    def __call__(self, hidden: torch.Tensor, decoder: nn.Linear, targets: torch.Tensor, training: bool,
                 softcap: float | None = None, multiplier: float = 1.0):
        """(mean cross-entropy over targets != -100, logits or None), on head_logits."""
        logits = head_logits(hidden, decoder, softcap, multiplier)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
        return loss, logits

    def per_token(self, hidden, decoder, targets, training, softcap=None, multiplier=1.0):
        """(mean loss, logits, each row's loss: 0 where the target is -100, detached)."""
        logits = head_logits(hidden, decoder, softcap, multiplier)
        targets = targets.reshape(-1)
        rows = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets, ignore_index=-100,
                               reduction="none")
        loss = rows.sum() / (targets != -100).sum().clamp(min=1)
        return loss, logits, rows.detach()


# ---------------------------------------------------------------- logit soft-capping
# Logit soft-capping (Gemma 2, and the GPT speedrun's output head): `c * tanh(logits / c)` keeps every output logit
# inside (-c, c) while leaving small ones almost unchanged, so no logit can run away early in training. It applies
# wherever the head's logits are made: the inference outputs, the plain loss and the fused loss (below).


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """`cap * tanh(logits / cap)`, or the logits themselves when cap is None (off)."""
    return logits if cap is None else cap * torch.tanh(logits / cap)
