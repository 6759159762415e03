"""Tests for the fused rotary kernel (cramming/kernels/rotary.py) against its eager reference.

Triton runs on CPU tensors through its interpreter (TRITON_INTERPRET=1, set here before anything imports
Triton: it picks interpret-or-compile when a kernel is decorated, and reads it again at launch, so it stays set).
The interpreter is slow per program, so every shape is tiny. With TRITON_INTERPRET=0 and a GPU, the same tests run the compiled kernel.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch

try:
    import triton  # noqa: F401
except ImportError as error:
    pytest.skip(f"triton is not importable ({error}); the rotary kernel cannot run", allow_module_level=True)

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is not 1 and there is no GPU to compile for", allow_module_level=True)
DEVICE = "cpu" if INTERPRET else "cuda"

from cramming.kernels import apply_rotary_torch, apply_rotary_triton, rotary, rotary_cos_sin

if INTERPRET and type(rotary._rotary_kernel).__name__ != "InterpretedFunction":
    pytest.skip("cramming.kernels was imported (by another test) before TRITON_INTERPRET=1 was set, so its kernel "
                "was built for a GPU; export TRITON_INTERPRET=1 for the whole pytest run", allow_module_level=True)

IMPLS = {"torch": apply_rotary_torch, "triton": apply_rotary_triton}
GRID = [(pct, interleaved, with_pos) for pct in (0.25, 0.5, 1.0) for interleaved in (False, True)
        for with_pos in (False, True)]
GRID_IDS = [f"pct{p}-{'gptj' if i else 'neox'}-{'pos' if w else 'nopos'}" for p, i, w in GRID]


def rotary_dim(head_dim, pct):
    return int(head_dim * pct) // 2 * 2


def make(seq=7, head_dim=24, pct=1.0, with_pos=False, batch=2, heads=2, dtype=torch.float32, max_pos=32, seed=0):
    """A random x, its tables, and (optionally) random per-sequence offsets as position ids."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, seq, head_dim, generator=gen).to(DEVICE, dtype)
    cos, sin = rotary_cos_sin(max_pos, rotary_dim(head_dim, pct), device=DEVICE)
    pos = None
    if with_pos:
        offsets = torch.randint(0, max_pos - seq + 1, (batch, 1), generator=gen)
        pos = (offsets + torch.arange(seq)).to(DEVICE)
    return x, cos, sin, pos


# --- forward: Triton equals the eager reference -------------------------------------------------------------

@pytest.mark.parametrize("pct,interleaved,with_pos", GRID, ids=GRID_IDS)
def test_forward_matches_reference_fp32(pct, interleaved, with_pos):
    x, cos, sin, pos = make(seq=7, head_dim=24, pct=pct, with_pos=with_pos)
    got = apply_rotary_triton(x, cos, sin, pos, pct, interleaved)
    torch.testing.assert_close(got, apply_rotary_torch(x, cos, sin, pos, pct, interleaved), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 1.6e-2)], ids=["fp16", "bf16"])
def test_half_precision_close_to_fp32_reference(dtype, tol):
    """Computes in fp32, rounds once on store. bf16 tolerance is ~2 ulps: the interpreter truncates fp32->bf16
    where GPUs round to nearest, so it can be one ulp off torch's own cast."""
    x, cos, sin, pos = make(seq=9, head_dim=32, pct=0.5, with_pos=True, dtype=dtype)
    got = apply_rotary_triton(x, cos, sin, pos, 0.5, False)
    assert got.dtype == dtype
    want = apply_rotary_torch(x.float(), cos, sin, pos, 0.5, False)
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_non_contiguous_inputs_and_broadcast_positions():
    """Strides are passed to the kernel (no copy): a (b, s, h, d) -> (b, h, s, d) transpose and a strided last dim."""
    base = torch.randn(2, 9, 2, 32, device=DEVICE)
    cos, sin = rotary_cos_sin(16, 16, device=DEVICE)
    pos = torch.arange(3, 12, device=DEVICE)[None]  # (1, seq): one offset shared by the batch
    for x in (base.transpose(1, 2), base.transpose(1, 2)[..., ::2]):
        assert not x.is_contiguous()
        pct = 16 / x.shape[-1]
        for interleaved in (False, True):
            got = apply_rotary_triton(x, cos, sin, pos, pct, interleaved)
            torch.testing.assert_close(got, apply_rotary_torch(x, cos, sin, pos, pct, interleaved), atol=1e-6, rtol=1e-6)


def test_head_dim_256_and_odd_rotary_dim_rounds_down():
    x, cos, sin, _ = make(seq=3, head_dim=256, batch=1, heads=1)
    torch.testing.assert_close(apply_rotary_triton(x, cos, sin), apply_rotary_torch(x, cos, sin), atol=1e-6, rtol=1e-6)
    x = torch.randn(1, 2, 5, 10, device=DEVICE)  # 10 * 0.5 = 5 -> rotary_dim 4, dims 4.. pass through
    cos, sin = rotary_cos_sin(5, 4, device=DEVICE)
    torch.testing.assert_close(apply_rotary_triton(x, cos, sin, rotary_pct=0.5),
                               apply_rotary_torch(x, cos, sin, rotary_pct=0.5), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="cos/sin"):
        apply_rotary_triton(x, *rotary_cos_sin(5, 6, device=DEVICE), rotary_pct=0.5)


def test_qk_rotates_both_alike():
    q, cos, sin, pos = make(seq=6, head_dim=16, with_pos=True)
    k = torch.randn(2, 1, 6, 16, device=DEVICE)  # fewer key heads (GQA) is fine: one launch each
    rq, rk = (apply_rotary_triton(t, cos, sin, pos, interleaved=True) for t in (q, k))
    torch.testing.assert_close(rq, apply_rotary_torch(q, cos, sin, pos, interleaved=True), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rk, apply_rotary_torch(k, cos, sin, pos, interleaved=True), atol=1e-6, rtol=1e-6)


# --- backward: Triton's hand-written gradient equals autograd through the reference --------------------------

@pytest.mark.parametrize("pct,interleaved,with_pos", GRID, ids=GRID_IDS)
def test_backward_matches_autograd_through_reference(pct, interleaved, with_pos):
    x, cos, sin, pos = make(seq=7, head_dim=24, pct=pct, with_pos=with_pos)
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = []
    for fn in (apply_rotary_triton, apply_rotary_torch):
        leaf = x.clone().requires_grad_(True)
        fn(leaf, cos, sin, pos, pct, interleaved).backward(upstream)
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-6)


def test_backward_with_broadcast_upstream_gradient():
    """`.sum()` sends an expanded (all-zero-stride) gradient; the backward kernel reads it through its strides."""
    x, cos, sin, pos = make(seq=5, head_dim=8, pct=0.5, with_pos=True)
    grads = []
    for fn in (apply_rotary_triton, apply_rotary_torch):
        leaf = x.clone().requires_grad_(True)
        fn(leaf, cos, sin, pos, 0.5).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-6)


# --- semantics, pinned by equivalences (both implementations) -----------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("pct", [0.0, 0.1])  # head_dim 8: int(0.8) = 0 -> nothing rotated
def test_zero_rotary_dim_is_identity(impl, pct):
    x, cos, sin, pos = make(seq=5, head_dim=8, pct=pct, with_pos=True)
    assert cos.shape == (32, 0)
    assert torch.equal(IMPLS[impl](x, cos, sin, pos, pct), x)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_pass_through_dims_untouched_and_position_zero_is_identity(impl, interleaved):
    x, cos, sin, _ = make(seq=5, head_dim=24, pct=0.5)
    out = IMPLS[impl](x, cos, sin, None, 0.5, interleaved)
    assert torch.equal(out[..., 12:], x[..., 12:])
    assert not torch.allclose(out[..., 1:, :12], x[..., 1:, :12])  # positions > 0 really rotate
    assert torch.equal(out[..., 0, :], x[..., 0, :])  # position 0: cos 1, sin 0
    zeros = torch.zeros(2, 5, dtype=torch.long, device=DEVICE)
    assert torch.equal(IMPLS[impl](x, cos, sin, zeros, 0.5, interleaved), x)


@pytest.mark.parametrize("impl", IMPLS)
def test_rotation_preserves_pair_norms_and_matches_complex_multiply(impl):
    x, cos, sin, pos = make(seq=7, head_dim=16, with_pos=True)
    out = IMPLS[impl](x, cos, sin, pos)
    squared_norms = [t[..., :8] ** 2 + t[..., 8:] ** 2 for t in (out, x)]  # half-split pairs (i, i + 8)
    torch.testing.assert_close(*squared_norms, atol=1e-5, rtol=1e-5)
    # Independent definition: pair (x_i, x_{i+d/2}) is the complex number z, rotated by angle pos * 10000**(-2i/d).
    angle = pos[:, None, :, None].double() * 10000.0 ** (-torch.arange(0, 16, 2, device=DEVICE).double() / 16)
    z = torch.complex(x[..., :8].double(), x[..., 8:].double()) * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(out.double(), torch.cat((z.real, z.imag), -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_half_split_and_interleaved_are_permutations_of_each_other(impl):
    """GPT-J slot 2i holds NeoX slot i and 2i+1 holds i + d/2; rotating the permuted input = permuting the output."""
    head_dim, pct = 24, 0.5
    x, cos, sin, pos = make(seq=6, head_dim=head_dim, pct=pct, with_pos=True)
    half = rotary_dim(head_dim, pct) // 2
    perm = [k // 2 + (half if k % 2 else 0) for k in range(2 * half)] + list(range(2 * half, head_dim))
    neox = IMPLS[impl](x, cos, sin, pos, pct, interleaved=False)
    gptj = IMPLS[impl](x[..., perm], cos, sin, pos, pct, interleaved=True)
    assert torch.equal(gptj, neox[..., perm])


# --- the cos/sin cache ----------------------------------------------------------------------------------------

def test_cos_sin_cached_per_key_with_expected_values():
    cos, sin = rotary_cos_sin(11, 6, device=DEVICE)
    again = rotary_cos_sin(11, 6, device=DEVICE)
    assert again[0] is cos and again[1] is sin
    assert rotary_cos_sin(11, 6, device=DEVICE, dtype=torch.float16)[0] is not cos
    assert rotary_cos_sin(12, 6, device=DEVICE)[0] is not cos
    assert cos.shape == sin.shape == (11, 3)
    p, i = 7, 2
    assert math.isclose(cos[p, i].item(), math.cos(p * 10000.0 ** (-2 * i / 6)), abs_tol=1e-6)
    assert math.isclose(sin[p, i].item(), math.sin(p * 10000.0 ** (-2 * i / 6)), abs_tol=1e-6)


def test_tables_first_built_under_inference_mode_serve_training():
    """Validation (inference_mode) may build the tables before the first training step needs them."""
    with torch.inference_mode():
        cos, sin = rotary_cos_sin(11, 6, base=123.0, device=DEVICE)
    x = torch.randn(1, 1, 11, 6, device=DEVICE, requires_grad=True)
    for impl in IMPLS.values():
        impl(x, cos, sin).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
