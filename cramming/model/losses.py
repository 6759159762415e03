"""How a pretraining head computes its loss, by name (`impl.loss`, saved as the config's `loss_impl`).

Both give the same loss; they differ in memory. `plain` projects the hidden states to full logits and takes their
cross-entropy; `fused` never materialises the logits while training (fused_loss.py), and falls back to `plain`
in evaluation, which wants the logits themselves.
"""

import torch
from torch import nn
from torch.nn import functional as F

from .fused_loss import linear_cross_entropy
from .registry import Registry
from .softcap import soft_cap

LOSSES = Registry("loss")


@LOSSES.register_one("plain")
class PlainLoss:
    def __call__(self, hidden: torch.Tensor, decoder: nn.Linear, targets: torch.Tensor, training: bool,
                 softcap: float | None = None):
        """(mean cross-entropy over targets != -100, logits or None); the logits soft-capped at softcap if set."""
        logits = soft_cap(decoder(hidden), softcap)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
        return loss, logits


@LOSSES.register_one("fused")
class FusedLoss(PlainLoss):
    def __call__(self, hidden, decoder, targets, training, softcap=None):
        if not training:
            return super().__call__(hidden, decoder, targets, training, softcap)
        # no logits, ever in full
        return linear_cross_entropy(hidden, decoder.weight, decoder.bias, targets, softcap), None
