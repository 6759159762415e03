"""FlashAttention-2-style attention in Triton, forward and backward, with the masks of cramming.model.attention.

Same semantics as `eager_attention` (key padding, causal, local window, ALiBi, document ids: a query sees only keys
of its own document; a query that sees nothing outputs zeros). The forward keeps a running max and sum per query row (online softmax), so memory is linear in the
sequence length; it saves O and the log-sum-exp, and the backward recomputes the probabilities from them.
The backward is two kernels without atomics (dK/dV per key block, dQ per query block), so it is deterministic.

Key blocks that no query of a block can see are never visited (the loop bounds follow causal/window), and the
position masks are only evaluated on the blocks that straddle a boundary: each program runs up to three loops,
masked / unmasked / masked. Scores are kept in raw q.k units and turned into base-2 logits by one multiply
(log2(e) folded into the scale), so exp2 is used throughout; the saved log-sum-exp is in natural-log units.
"""

import math
import os
import time

import torch

from ..model.attention_masks import AttentionSpec
from . import tuning
from .flash_kernels import triton  # None where Triton is not installed
from .tuning import add_autotune_seconds, shared_limit, shared_memory_problem

if triton is not None:
    from .flash_kernels import DELTA, PLAIN, TUNED


def grid(batch_heads, seq, block):
    """(batch * heads, seq blocks): batch * heads goes on axis 0, whose cap is 2**31 - 1; CUDA caps axes 1 and 2 at
    65,535, which a large microbatch times the head count passes."""
    return batch_heads, triton.cdiv(seq, block)


def _launch(name, grid_block, seq, batch_heads, args, meta, device):
    """Run kernel `name` on a (batch * heads, seq / grid_block) grid. Under the interpreter (or off CUDA) the blocks
    are a fixed 16x16 and nothing is autotuned: the interpreter would run every config."""
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        PLAIN[name][grid(batch_heads, seq, 16)](*args, BLOCK_M=16, BLOCK_N=16, **meta)
        return
    tuner = TUNED[name]
    known, started = len(tuner.cache), time.perf_counter()
    tuner[lambda m: grid(batch_heads, seq, m[grid_block])](*args, **meta)
    if len(tuner.cache) > known:  # a new key: compiled (and timed, unless Triton's disk cache knew it)
        add_autotune_seconds(time.perf_counter() - started)


def _meta(q, causal, window, alibi, key_padding_mask, documents):
    head_dim = q.shape[-1]
    block_d = max(16, triton.next_power_of_2(head_dim))
    tf32 = q.dtype == torch.float32 and q.is_cuda and torch.get_float32_matmul_precision() != "highest"
    return {"BLOCK_D": block_d, "CAUSAL": causal, "HAS_WINDOW": window is not None,
            "HAS_PAD": key_padding_mask is not None, "ALIBI": alibi, "HAS_DOCS": documents is not None,
            "EVEN_D": block_d == head_dim,
            "DOT_PREC": "tf32" if tf32 else "ieee"}


def _mask_args(q, key_padding_mask):
    """The padding mask as uint8 (a free view of a bool tensor) and its strides; q is a never-read stand-in."""
    if key_padding_mask is None:
        return q, 0, 0
    mask = key_padding_mask.bool().view(torch.uint8)
    return mask, mask.stride(0), mask.stride(1)


def _document_args(q, documents):
    """The (batch, seq) int32 document ids and their strides; q is a never-read stand-in."""
    if documents is None:
        return q, 0, 0
    return documents, documents.stride(0), documents.stride(1)


def _forward(q, k, v, key_padding_mask, documents, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    if q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        problem = shared_memory_problem(head_dim, q.dtype, shared_limit(q.device))
        if problem:  # the router picks SDPA for these (impl.attention=auto); say so instead of OutOfResources
            raise ValueError(f"the Triton attention kernel cannot run here: {problem}; use the 'sdpa' kernel")
    out = torch.empty(batch, seq, heads, head_dim, device=q.device, dtype=q.dtype).transpose(1, 2)
    lse = torch.empty(batch, heads, seq, device=q.device, dtype=torch.float32)
    mask, smb, smn = _mask_args(q, key_padding_mask)
    docs, sxb, sxn = _document_args(q, documents)
    args = (q, k, v, out, lse, mask, docs, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], smb,
            smn, sxb, sxn, heads, seq, head_dim, window or 0, scale, triton.next_power_of_2(seq))
    meta = _meta(q, causal, window, alibi, key_padding_mask, documents)
    _launch("fwd", "BLOCK_M", seq, batch * heads, args, meta, q.device)
    return out, lse


def _backward(q, k, v, out, lse, dout, key_padding_mask, documents, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    if dout.stride(-1) != 1:  # e.g. the all-zero-stride gradient of .sum()
        dout = dout.contiguous()
    delta = torch.empty_like(lse)
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m = 16 if os.environ.get("TRITON_INTERPRET") == "1" else 64
    DELTA[grid(batch * heads, seq, block_m)](
        out, dout, delta, *out.stride()[:3], *dout.stride()[:3], heads, seq, head_dim, BLOCK_M=block_m,
        BLOCK_D=block_d)
    grads = [torch.empty(batch, seq, heads, head_dim, device=q.device, dtype=q.dtype).transpose(1, 2)
             for _ in range(3)]
    dq, dk, dv = grads
    mask, smb, smn = _mask_args(q, key_padding_mask)
    docs, sxb, sxn = _document_args(q, documents)
    meta = _meta(q, causal, window, alibi, key_padding_mask, documents)
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dk.stride()[:3], smb, smn,
              sxb, sxn, heads, seq, head_dim, window or 0, scale, triton.next_power_of_2(seq))
    _launch("dkdv", "BLOCK_N", seq, batch * heads, (q, k, v, dout, dk, dv, lse, delta, mask, docs, *common), meta,
            q.device)
    _launch("dq", "BLOCK_M", seq, batch * heads, (q, k, v, dout, dq, lse, delta, mask, docs, *common), meta, q.device)
    return dq, dk, dv


# torch.library custom ops: torch.compile keeps each as one opaque call in its graph (no graph break, no tracing
# into Triton); the fake functions tell it the output shapes and strides.
@torch.library.custom_op("cramming::flash_attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None,
                  documents: torch.Tensor | None, causal: bool, window: int | None, alibi: bool,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, key_padding_mask, documents, causal, window, alibi, scale)


@_attention_op.register_fake
def _(q, k, v, key_padding_mask, documents, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    out = q.new_empty(batch, seq, heads, head_dim).transpose(1, 2)
    return out, q.new_empty(batch, heads, seq, dtype=torch.float32)


@torch.library.custom_op("cramming::flash_attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                           dout: torch.Tensor, key_padding_mask: torch.Tensor | None,
                           documents: torch.Tensor | None, causal: bool, window: int | None, alibi: bool, scale: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, out, lse, dout, key_padding_mask, documents, causal, window, alibi, scale)


@_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, key_padding_mask, documents, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    return tuple(q.new_empty(batch, seq, heads, head_dim).transpose(1, 2) for _ in range(3))


def _setup_context(ctx, inputs, output):
    q, k, v, key_padding_mask, documents, causal, window, alibi, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, key_padding_mask, documents)
    ctx.options = (causal, window, alibi, scale)
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, dout, _dlse):
    q, k, v, out, lse, key_padding_mask, documents = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(q, k, v, out, lse, dout, key_padding_mask, documents, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_setup_context)


SERVES = {"window", "alibi", "documents"}  # the attention.FEATURES it computes (kernels/__init__.py registers it)


def triton_fit_problem(arch, device=None, dtype=None) -> str | None:
    """What the kernel's tiles cannot hold: head dims past 256, or (on a known CUDA device and dtype) no launch
    config that fits the device's shared memory."""
    head_dim = arch.hidden_size // arch.num_heads
    if head_dim > 256:
        return f"it supports head dims up to 256, and arch.hidden_size / arch.num_heads = {head_dim}"
    if device is not None and device.type == "cuda" and dtype is not None:
        return tuning.shared_memory_problem(head_dim, dtype, tuning.shared_limit(device))  # via the module: tests set it
    return None


def flash_attention(q, k, v, spec: AttentionSpec = AttentionSpec(), return_lse=False):
    """softmax(q k^T * scale + alibi, masked) v for (batch, heads, seq, head_dim) q, k, v of one dtype (fp16,
    bf16 or fp32; any strides). Masks, ALiBi and scale come from `spec` (attention_masks.py). Returns a (batch, heads,
    seq, head_dim) view of a (batch, seq, heads, head_dim) tensor, and with return_lse also the fp32 (batch, heads,
    seq) natural-log log-sum-exp of the scores (-inf for a query that sees no key)."""
    if spec.stepped is not None or spec.topk is not None or spec.bias is not None:
        raise ValueError("the Triton attention kernel implements global and local attention with padding, causal "
                         "and ALiBi masks; stepped, top-k and a learned score bias need the 'sdpa' or 'eager' kernel")
    if spec.dropout_p > 0:
        raise ValueError("the Triton attention kernel has no dropout; set attention dropout to 0 or use the "
                         "'sdpa' or 'eager' kernel")
    if triton is None:
        raise RuntimeError("the 'triton' attention kernel needs triton, which is not importable here; use the "
                           "'sdpa' or 'eager' kernel")
    shapes = [tuple(t.shape) for t in (q, k, v)]
    if q.dim() != 4 or len(set(shapes)) != 1:
        raise ValueError(f"q, k, v must share one (batch, heads, seq, head_dim) shape, got {shapes}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype} (under autocast, "
                         "cast them to the autocast dtype first, as SelfAttention does)")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or q.shape[-1] > 256:
        raise ValueError(f"supported: fp16/bf16/fp32 and head_dim <= 256, got {q.dtype}, head_dim {q.shape[-1]}")
    window, padding, documents = spec.window, spec.padding, spec.documents
    if window is not None and window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if padding is not None and tuple(padding.shape) != (q.shape[0], q.shape[2]):
        raise ValueError(f"padding must be (batch, seq), got {tuple(padding.shape)}")
    if documents is not None and tuple(documents.shape) != (q.shape[0], q.shape[2]):
        raise ValueError(f"documents must be (batch, seq), got {tuple(documents.shape)}")
    documents = None if documents is None else documents.to(torch.int32)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # kernels assume unit stride on dim
    scale = 1.0 / math.sqrt(q.shape[-1]) if spec.scale is None else float(spec.scale)
    window = None if window is None else min(int(window), q.shape[2])  # same mask; keeps int32 bounds in range
    out, lse = _attention_op(q, k, v, padding, documents, bool(spec.causal), window, bool(spec.alibi), scale)
    return (out, lse) if return_lse else out
