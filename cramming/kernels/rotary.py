"""Rotary position embeddings as one fused Triton kernel, forward and backward.

The definition (and the eager path) is cramming.model.rotary.apply_rotary_torch; this does the same rotation in
one launch per direction, reading x through its strides, so the rotated copy never round-trips through extra
buffers.
"""

import torch

from ..model.rotary import rotary_dim_of

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is Linux-only; the eager path must stay importable everywhere.
    triton = None

if triton is not None:

    @triton.jit
    def _rotary_kernel(x_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, H, S,
                       sxb, sxh, sxs, sxd, sob, soh, sos, spb, sps, stab,
                       HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr,
                       BACKWARD: tl.constexpr):
        """One program rotates BLOCK_S tokens of one (batch, head); x may be strided, out is contiguous."""
        pid_bh = tl.program_id(0)
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)  # int64: offsets may pass 2**31
        rows = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        row_ok = rows < S
        x_row = x_ptr + b * sxb + h * sxh + rows[:, None].to(tl.int64) * sxs
        o_row = out_ptr + b * sob + h * soh + rows[:, None].to(tl.int64) * sos
        if HALF > 0:
            if HAS_POS:
                pos = tl.load(pos_ptr + b * spb + rows * sps, mask=row_ok, other=0)
            else:
                pos = rows
            j = tl.arange(0, BLOCK_HALF)
            m = row_ok[:, None] & (j < HALF)[None, :]
            tab = pos[:, None].to(tl.int64) * stab + j[None, :]
            c = tl.load(cos_ptr + tab, mask=m, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + tab, mask=m, other=0.0).to(tl.float32)
            if BACKWARD:  # the transpose of a rotation is the rotation by the negative angle
                s = -s
            if INTERLEAVED:
                d1 = 2 * j
                d2 = d1 + 1
            else:
                d1 = j
                d2 = j + HALF
            x1 = tl.load(x_row + d1[None, :] * sxd, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(x_row + d2[None, :] * sxd, mask=m, other=0.0).to(tl.float32)
            tl.store(o_row + d1[None, :], (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=m)
            tl.store(o_row + d2[None, :], (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=m)
        if PASS > 0:
            p = 2 * HALF + tl.arange(0, BLOCK_PASS)
            mp = row_ok[:, None] & (p < 2 * HALF + PASS)[None, :]
            tl.store(o_row + p[None, :], tl.load(x_row + p[None, :] * sxd, mask=mp), mask=mp)


def _launch(x, cos, sin, position_ids, rotary_dim, interleaved, backward):
    """Rotate x (any strides) into a fresh contiguous tensor; strides are passed, so no input copy is made."""
    batch, heads, seq, head_dim = x.shape
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    half, rest = rotary_dim // 2, head_dim - rotary_dim
    if not half:  # empty tables may hold a null pointer, which GPU launchers reject; they are never read
        cos = sin = x
    pos = position_ids.expand(batch, seq) if position_ids is not None else x  # x: an unused placeholder
    spb, sps = (pos.stride(0), pos.stride(1)) if position_ids is not None else (0, 0)
    block_s = min(triton.next_power_of_2(seq), 16)
    grid = (batch * heads, triton.cdiv(seq, block_s))
    _rotary_kernel[grid](x, out, cos, sin, pos, heads, seq, *x.stride(), *out.stride()[:3], spb, sps,
                         cos.stride(0), HALF=half, PASS=rest, BLOCK_S=block_s,
                         BLOCK_HALF=triton.next_power_of_2(max(half, 1)),
                         BLOCK_PASS=triton.next_power_of_2(max(rest, 1)), INTERLEAVED=interleaved,
                         HAS_POS=position_ids is not None, BACKWARD=backward)
    return out


# A torch.library custom op: torch.compile keeps it in the graph as one opaque call (no graph break, no tracing
# into Triton), and autograd reaches the backward below.
@torch.library.custom_op("cramming::rotary", mutates_args=())
def _rotary_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None,
               rotary_dim: int, interleaved: bool, backward: bool) -> torch.Tensor:
    return _launch(x, cos, sin, position_ids, rotary_dim, interleaved, backward)


@_rotary_op.register_fake
def _(x, cos, sin, position_ids, rotary_dim, interleaved, backward):
    return torch.empty(x.shape, device=x.device, dtype=x.dtype)


def _setup_context(ctx, inputs, output):
    _x, cos, sin, position_ids, rotary_dim, interleaved, backward = inputs
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.rotary_dim, ctx.interleaved, ctx.backward = rotary_dim, interleaved, backward


def _rotary_backward(ctx, grad_out):
    """The transpose of a rotation is the rotation by the negative angle. Gradient flows to x only."""
    cos, sin, position_ids = ctx.saved_tensors
    grad_x = _rotary_op(grad_out, cos, sin, position_ids, ctx.rotary_dim, ctx.interleaved, not ctx.backward)
    return grad_x, None, None, None, None, None, None


_rotary_op.register_autograd(_rotary_backward, setup_context=_setup_context)


def apply_rotary_triton(x, cos, sin, position_ids=None, rotary_pct=1.0, interleaved=False):
    """Same result as apply_rotary_torch, in one fused Triton launch (and one more for the backward)."""
    if triton is None:
        raise RuntimeError("apply_rotary_triton needs triton; use apply_rotary_torch instead")
    rotary_dim = rotary_dim_of(x, cos, sin, position_ids, rotary_pct)
    if len({t.device for t in (x, cos, sin) + ((position_ids,) if position_ids is not None else ())}) != 1:
        raise ValueError("x, cos, sin and position_ids must be on one device")
    return _rotary_op(x, cos.contiguous(), sin.contiguous(), position_ids, rotary_dim, interleaved, False)

