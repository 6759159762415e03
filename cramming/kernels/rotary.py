"""Rotary position embeddings (RoPE): an eager reference and a fused Triton kernel, forward and backward.

x is (batch, heads, seq, head_dim). The first `rotary_dim` dims of each head are rotated pairwise by the angle
position * base**(-2i/rotary_dim); the rest pass through. Pairs are (i, i + rotary_dim/2) in the GPT-NeoX
half-split layout, or (2i, 2i + 1) in the GPT-J interleaved layout. The eager path is the definition; the Triton
path does the same in one launch per direction, so the rotated copy never round-trips through extra buffers.
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is Linux-only; the eager path must stay importable everywhere.
    triton = None

_TABLES: dict = {}
_MAX_TABLES = 16


def rotary_cos_sin(seq_len: int, rotary_dim: int, base: float = 10000.0, device=None, dtype=torch.float32):
    """The (seq_len, rotary_dim // 2) cos and sin tables, cached per (seq_len, rotary_dim, base, device, dtype).

    Every layer and every step asks for the same tables; rebuilding them costs allocations and small launches,
    and returning the same tensors keeps CUDA graphs / torch.compile guards stable. Treat them as read-only.
    """
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (int(seq_len), int(rotary_dim), float(base), device, dtype)
    if key not in _TABLES:
        if len(_TABLES) >= _MAX_TABLES:  # a handful of configs in practice; never grow without bound
            _TABLES.pop(next(iter(_TABLES)))
        inv_freq = base ** (-torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim)
        angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
        _TABLES[key] = (angles.cos().to(dtype), angles.sin().to(dtype))
    return _TABLES[key]


def _rotary_dim(x, cos, sin, position_ids, rotary_pct):
    """Validate shapes and return rotary_dim = int(head_dim * rotary_pct), rounded down to even."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
    if not 0.0 <= rotary_pct <= 1.0:
        raise ValueError(f"rotary_pct must be in [0, 1], got {rotary_pct}")
    rotary_dim = int(x.shape[-1] * rotary_pct) // 2 * 2
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != rotary_dim // 2:
        raise ValueError(f"cos/sin must both be (positions, {rotary_dim // 2}) for rotary_dim {rotary_dim}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if position_ids is None and cos.shape[0] < x.shape[2]:
        raise ValueError(f"tables hold {cos.shape[0]} positions but seq is {x.shape[2]}")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != x.shape[2]
                                     or position_ids.shape[0] not in (1, x.shape[0])):
        raise ValueError(f"position_ids must be ({x.shape[0]} or 1, {x.shape[2]}), got {tuple(position_ids.shape)}")
    return rotary_dim


def apply_rotary_torch(x, cos, sin, position_ids=None, rotary_pct=1.0, interleaved=False):
    """Eager reference: the definition the kernel is tested against. Computes in fp32, returns x's dtype."""
    rotary_dim = _rotary_dim(x, cos, sin, position_ids, rotary_pct)
    half, seq = rotary_dim // 2, x.shape[2]
    if position_ids is None:
        c, s = cos[:seq].float(), sin[:seq].float()  # (seq, half), broadcasts over batch and heads
    else:
        c, s = cos[position_ids].float().unsqueeze(1), sin[position_ids].float().unsqueeze(1)  # (batch, 1, seq, half)
    rot, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., :half], rot[..., half:])
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    rot = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    return torch.cat((rot.to(x.dtype), rest), dim=-1)


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


class _RotaryFunction(torch.autograd.Function):
    """Gradient flows to x only: the cos/sin tables and position ids are constants."""

    @staticmethod
    def forward(ctx, x, cos, sin, position_ids, rotary_dim, interleaved):
        ctx.save_for_backward(cos, sin, position_ids)
        ctx.rotary_dim, ctx.interleaved = rotary_dim, interleaved
        return _launch(x, cos, sin, position_ids, rotary_dim, interleaved, backward=False)

    @staticmethod
    def backward(ctx, grad_out):
        cos, sin, position_ids = ctx.saved_tensors
        grad_x = _launch(grad_out, cos, sin, position_ids, ctx.rotary_dim, ctx.interleaved, backward=True)
        return grad_x, None, None, None, None, None


def apply_rotary_triton(x, cos, sin, position_ids=None, rotary_pct=1.0, interleaved=False):
    """Same result as apply_rotary_torch, in one fused Triton launch (and one more for the backward)."""
    if triton is None:
        raise RuntimeError("apply_rotary_triton needs triton; use apply_rotary_torch instead")
    rotary_dim = _rotary_dim(x, cos, sin, position_ids, rotary_pct)
    if len({t.device for t in (x, cos, sin) + ((position_ids,) if position_ids is not None else ())}) != 1:
        raise ValueError("x, cos, sin and position_ids must be on one device")
    return _RotaryFunction.apply(x, cos.contiguous(), sin.contiguous(), position_ids, rotary_dim, interleaved)


def apply_rotary_qk(q, k, cos, sin, position_ids=None, rotary_pct=1.0, interleaved=False, use_triton=True):
    """Rotate queries and keys alike (two launches, so q and k may differ in head count, as with GQA)."""
    fn = apply_rotary_triton if use_triton else apply_rotary_torch
    return (fn(q, cos, sin, position_ids, rotary_pct, interleaved),
            fn(k, cos, sin, position_ids, rotary_pct, interleaved))
