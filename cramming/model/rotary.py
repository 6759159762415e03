"""Rotary position embeddings (RoPE, Su et al. 2021), applied to queries and keys inside attention.

x is (batch, heads, seq, head_dim). The first `rotary_dim` = head_dim * rotary_pct dims of each head (rounded
down to even) are rotated pairwise by the angle position * base**(-2i/rotary_dim); the rest pass through, as in
GPT-NeoX (rotary_pct 0.25). Pairs are (i, i + rotary_dim/2) in the GPT-NeoX half-split layout, or (2i, 2i + 1)
in the GPT-J interleaved layout. `apply_rotary_torch` is the definition; cramming.kernels holds a fused
Triton version, which impl.py registers under the name "triton" (`impl.rotary`).
"""

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .context import Positions
from .positions import POSITIONS, PositionScheme
from .registry import Registry, invalid

ROTARY_IMPLS = Registry("rotary kernel", traits={
    "needs_triton": "it is a Triton kernel: refused where Triton cannot run (impl.triton_problem)",
})

_TABLES: dict = {}
_MAX_TABLES = 16


def rotary_cos_sin(seq_len: int, rotary_dim: int, base: float = 10000.0, device=None, dtype=torch.float32):
    """The (seq_len, rotary_dim // 2) cos and sin tables, cached per (seq_len, rotary_dim, base, device, dtype).

    Every layer and every step asks for the same tables; rebuilding them costs allocations and small launches,
    and returning the same tensors keeps CUDA graphs / torch.compile guards stable. Treat them as read-only.
    """
    device = torch.device("cpu" if device is None else device)
    if _tracing():  # fake or traced tables must never outlive their mode: build them afresh, cache nothing
        return _build_tables(seq_len, rotary_dim, base, device, dtype)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (int(seq_len), int(rotary_dim), float(base), device, dtype)
    if key not in _TABLES:
        if len(_TABLES) >= _MAX_TABLES:  # a handful of configs in practice; never grow without bound
            _TABLES.pop(next(iter(_TABLES)))
        # Built as normal tensors even when first asked for under inference_mode (validation runs before
        # training): inference tensors cannot be saved for a later backward.
        with torch.inference_mode(False):
            _TABLES[key] = _build_tables(seq_len, rotary_dim, base, device, dtype)
    return _TABLES[key]


def _tracing() -> bool:
    """True under torch.compile or any dispatch mode (fake tensors, functionalization, meta tracing)."""
    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None


def _build_tables(seq_len, rotary_dim, base, device, dtype):
    with torch.no_grad():
        inv_freq = base ** (-torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim)
        angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary_dim_of(x, cos, sin, position_ids, rotary_pct):
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


@ROTARY_IMPLS.register("torch")
def apply_rotary_torch(x, cos, sin, position_ids=None, rotary_pct=1.0, interleaved=False):
    """Eager reference: the definition the kernel is tested against. Computes in fp32, returns x's dtype."""
    rotary_dim = rotary_dim_of(x, cos, sin, position_ids, rotary_pct)
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


class Rotation:
    """Rotates one attention block's queries and keys (arch.position=rotary) with the kernel impl.rotary names."""

    def __init__(self, config):
        self.kernel = ROTARY_IMPLS.get_or_explain(config.rotary_impl)
        self.pct, self.base, self.interleaved = config.rotary.pct, config.rotary.base, config.rotary.interleaved
        self.max_seq_length = config.max_seq_length

    def __call__(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0, positions: Positions | None = None,
                 shared: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """offset: the absolute position of the first token (tokens already in a KV cache). Generation asks for
        the table of max_seq_length positions and slices it, so the growing prefix reuses one cached table.
        positions: each row's own position (token dropping, position_ids); offset is then unused.
        shared: a cached step's dict its layers share (context.Context.shared): the tables are sliced once for all
        of them, and q and k turn in one kernel call (a decode step is mostly such small ops; the values are the
        same, the rotation being elementwise)."""
        rotary_dim = int(q.shape[-1] * self.pct) // 2 * 2
        key = ("rotary", rotary_dim, self.base, offset, q.shape[2], positions is None, q.device)
        if shared is not None and key in shared:
            cos, sin = shared[key]
        else:
            cos, sin = self.tables(rotary_dim, offset, q.shape[2], positions, q.device)
            if shared is not None:
                shared[key] = cos, sin
        ids = None if positions is None else positions.ids
        if shared is None:
            return (self.kernel(q, cos, sin, ids, self.pct, self.interleaved),
                    self.kernel(k, cos, sin, ids, self.pct, self.interleaved))
        both = self.kernel(torch.cat((q, k), 1), cos, sin, ids, self.pct, self.interleaved)
        return both[:, :q.shape[1]], both[:, q.shape[1]:]

    def tables(self, rotary_dim: int, offset: int, seq_len: int, positions: Positions | None, device):
        """The cos and sin rows the kernel reads: from position `offset` on, or the whole table for `positions`."""
        if positions is not None:
            return rotary_cos_sin(max(self.max_seq_length, positions.seq_len), rotary_dim, self.base, device,
                                  torch.float32)
        if offset:
            cos, sin = rotary_cos_sin(max(self.max_seq_length, offset + seq_len), rotary_dim, self.base, device,
                                      torch.float32)
            return cos[offset:offset + seq_len], sin[offset:offset + seq_len]
        return rotary_cos_sin(seq_len, rotary_dim, self.base, device, torch.float32)


@POSITIONS.register_one("rotary")
class Rotary(PositionScheme):
    """Rotary embeddings (RoFormer): queries and keys turned by angles of their positions (arch.rotary)."""

    token_subsets = True  # each kept token is turned by its own position

    def rotation(self, config, index: int) -> Rotation | None:
        return Rotation(config) if index % config.rotary.every == 0 else None

    def problem(self, config) -> str | None:
        a = config.arch
        head_dim = a.hidden_size // a.num_heads
        if int(head_dim * a.rotary.pct) < 2:  # its own ranges: RotaryConfig.RULES
            return invalid("arch.rotary.pct", a.rotary.pct,
                           f"rotates no dimension pair of a {head_dim}-dim head; raise it")
        return None
