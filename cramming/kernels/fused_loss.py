"""The fused chunked loss (`impl.loss=fused`): the vocabulary projection and its cross-entropy without the whole
logits, for training only. `register()` adds it to model/losses.py's LOSSES beside `plain`; checkpoints are saved
with loss_impl=plain (checkpoints/model_folder.py), so none ships this file.
"""

import torch

from ..model.losses import LOSSES, PlainLoss


def register() -> None:
    if "fused" not in LOSSES:
        LOSSES.register_one("fused")(FusedLoss)


class FusedLoss(PlainLoss):
    """Cross-entropy computed in chunks of rows without holding the whole logits (below); training only."""

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


# ---------------------------------------------------------------- the fused chunked loss
# The vocabulary projection and its cross-entropy in one pass over chunks of rows, gradients included.
#
# The plain path materialises (rows x vocab) logits, then a log-softmax of the same size, then their gradient, each
# in fresh memory: at a 32k vocabulary and 2k rows that is 256 MB apiece, and on a CPU the page faults and memory
# traffic cost about as much as the matmuls around them. Here each chunk's logits turn into their own gradient in
# place (softmax minus one-hot) and are consumed at once by the two gradient matmuls, so one chunk is the peak and
# nothing but the two gradients is kept for backward. The FLOPs are the same. For training only: evaluation wants
# the logits themselves. With a soft cap (model/losses.py) each chunk's logits are capped before the softmax and the
# gradient goes back through the cap's slope, 1 - (capped / c)^2.


CHUNK_ELEMENTS = 2**23  # logits per chunk: 32 MB in fp32, 256 rows of a 32k vocabulary


class LinearCrossEntropy(torch.autograd.Function):
    """mean over rows with target != -100 of cross_entropy(soft_cap(hidden @ weight.T + bias, softcap), target),
    and each row's own cross-entropy (0 where the target is -100; no gradient), which token dropping's importance
    averages read (token_dropping.py): a by-product of the chunks, one float per row."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, softcap=None):
        device = hidden.device.type
        # under autocast the matmuls run in its dtype, as the plain nn.Linear would; the softmax runs in fp32
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            valid = targets != -100
            plain = dtype == torch.float32 and hidden.dtype == torch.float32  # no casts: write into place
            count = valid.sum()
            scale = 1.0 / count.clamp(min=1).to(torch.float32)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            row_losses = torch.empty(h.shape[0], dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty_like(hidden)
            # the first chunk's matmul writes every element of grad_weight; no rows: zeros
            grad_weight = (torch.empty_like if h.shape[0] > 0 else torch.zeros_like)(weight, dtype=torch.float32)
            grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
            rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
            shape = (min(rows, h.shape[0]), weight.shape[0])
            buffer = torch.empty(shape, dtype=torch.float32, device=hidden.device)
            low = None if plain else torch.empty(shape, dtype=dtype, device=hidden.device)  # logits, then gradient
            slopes = None if softcap is None else torch.empty_like(buffer)
            for start in range(0, h.shape[0], rows):
                chunk, keep = h[start:start + rows], valid[start:start + rows]
                n = chunk.shape[0]
                target = targets[start:start + rows].clamp(min=0)[:, None]
                # one buffer for every chunk (fresh memory costs page faults), each pass over it counted: on a CPU
                # the elementwise passes over (rows x vocab) cost about as much as the matmuls
                logits = buffer[:n]
                if plain:
                    torch.matmul(chunk, w.t(), out=logits)
                else:  # CPUs cast mixed-dtype elementwise ops through a temporary: one explicit cast instead
                    torch.matmul(chunk, w.t(), out=low[:n])
                    logits.copy_(low[:n])
                if b is not None:
                    logits += b
                if softcap is not None:
                    slope = slopes[:n]
                    torch.square(logits.div_(softcap).tanh_(), out=slope)
                    slope.neg_().add_(1.0)  # d capped / d logits
                    logits.mul_(softcap)
                picked = logits.gather(1, target).squeeze(1)
                top = logits.amax(dim=-1, keepdim=True)
                exps = logits.sub_(top).exp_()
                sums = exps.sum(dim=-1, keepdim=True)
                row_loss = (top.squeeze(1) + sums.log().squeeze(1) - picked) * keep
                total += row_loss.sum()
                row_losses[start:start + rows] = row_loss
                # d(mean loss)/d(logits) = (softmax - one_hot) / count on kept rows, zero on ignored ones:
                # (exps - sums * one_hot) * keep / (count * sums)
                exps.scatter_add_(1, target, -sums)
                exps.mul_(keep[:, None] * scale / sums)
                if softcap is not None:
                    exps.mul_(slope)
                if grad_bias is not None:
                    grad_bias += exps.sum(0)
                grad = exps if plain else low[:n].copy_(exps)
                if plain:
                    torch.matmul(grad, w, out=grad_hidden[start:start + rows])
                else:
                    grad_hidden[start:start + rows] = grad @ w
                if plain and start == 0:  # the first chunk writes, the others add: no zero-filled start
                    torch.matmul(grad.t(), chunk, out=grad_weight)
                elif plain:
                    grad_weight.addmm_(grad.t(), chunk)
                elif start == 0:
                    grad_weight.copy_(grad.t() @ chunk)
                else:
                    grad_weight += (grad.t() @ chunk).float()
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.has_bias = bias is not None
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(row_losses)
        return total * scale, row_losses

    @staticmethod
    def backward(ctx, grad_loss, _grad_row_losses):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        grad_bias = (grad_bias * grad_loss).to(ctx.weight_dtype) if ctx.has_bias else None
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight, grad_bias, None, None


def linear_cross_entropy(hidden, weight, bias, targets, softcap=None, token_losses: bool = False):
    """The loss of `nn.Linear(weight, bias)`, soft-capped at `softcap` (None: off), followed by
    `F.cross_entropy(ignore_index=-100)`, fused; with token_losses, (that loss, each row's loss)."""
    loss, rows = LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1),
                                          softcap)
    return (loss, rows) if token_losses else loss
