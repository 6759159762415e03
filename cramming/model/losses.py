"""How a pretraining head computes its loss, by name (`impl.loss`, saved as the config's `loss_impl`).

Both give the same loss; they differ in memory. `plain` projects the hidden states to full logits and takes their
cross-entropy; `fused` never materialises the logits while training (fused_loss.py), and falls back to `plain`
in evaluation, which wants the logits themselves. `per_token` also returns each row's loss (detached), from the
same pass: what token dropping's importance averages are updated from (token_dropping.py).
"""

import torch
from torch import nn
from torch.nn import functional as F

from .fused_loss import linear_cross_entropy
from .registry import Registry
from .softcap import soft_cap

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


@LOSSES.register_one("fused")
class FusedLoss(PlainLoss):
    """Cross-entropy computed in chunks of rows without holding the whole logits (fused_loss.py); training only."""

    def __call__(self, hidden, decoder, targets, training, softcap=None, multiplier=1.0):
        if not training:
            return super().__call__(hidden, decoder, targets, training, softcap, multiplier)
        return self.fused(hidden, decoder, targets, softcap, multiplier, False), None

    def per_token(self, hidden, decoder, targets, training, softcap=None, multiplier=1.0):
        if not training:
            return super().per_token(hidden, decoder, targets, training, softcap, multiplier)
        loss, rows = self.fused(hidden, decoder, targets, softcap, multiplier, True)
        return loss, None, rows

    @staticmethod
    def fused(hidden, decoder, targets, softcap, multiplier, token_losses):
        # no logits, ever in full; head_logits' (m h) W^T + b: the multiplier scales the rows, not the weight or bias
        if multiplier != 1.0:
            hidden = hidden * multiplier
        return linear_cross_entropy(hidden, decoder.weight, decoder.bias, targets, softcap, token_losses)
