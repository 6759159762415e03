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

LOSSES = Registry("loss")


@LOSSES.register_one("plain")
class PlainLoss:
    def __call__(self, hidden: torch.Tensor, decoder: nn.Linear, targets: torch.Tensor, training: bool):
        """(mean cross-entropy over targets != -100, logits or None)."""
        logits = decoder(hidden)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
        return loss, logits


@LOSSES.register_one("fused")
class FusedLoss(PlainLoss):
    def __call__(self, hidden, decoder, targets, training):
        if not training:
            return super().__call__(hidden, decoder, targets, training)
        return linear_cross_entropy(hidden, decoder.weight, decoder.bias, targets), None  # no logits, ever in full
