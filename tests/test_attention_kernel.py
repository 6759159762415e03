"""Tests for the FlashAttention-style Triton kernel (cramming/kernels/attention.py) against eager_attention.

Triton runs on CPU tensors through its interpreter (TRITON_INTERPRET=1, set here before anything imports Triton).
The interpreter is slow per program and uses 16x16 blocks, so shapes are tiny but ragged (not multiples of 16),
and every mask path (partial blocks, causal diagonal, window edges, unmasked middle blocks) is crossed.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch

try:
    import triton
except ImportError as error:
    pytest.skip(f"triton is not importable ({error}); the attention kernel cannot run", allow_module_level=True)

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is not 1 and there is no GPU to compile for", allow_module_level=True)
DEVICE = "cpu" if INTERPRET else "cuda"

from cramming.kernels import attention as attention_module
from cramming.kernels import flash_attention, flash_kernels
from cramming.model.attention import ATTENTION_KERNELS, alibi_bias, eager_attention, visible_keys
from cramming.model.attention_masks import AttentionSpec

if INTERPRET and type(flash_kernels.PLAIN["fwd"]).__name__ != "InterpretedFunction":
    pytest.skip("cramming.kernels was imported (by another test) before TRITON_INTERPRET=1 was set, so its kernels "
                "were built for a GPU; export TRITON_INTERPRET=1 for the whole pytest run", allow_module_level=True)



def interpreter_bf16_dot_works():
    """Triton 3.9's interpreter multiplies bf16 dot operands as their raw uint16 bit patterns; probe, don't pin."""
    if not INTERPRET:
        return True

    @triton.jit
    def probe(a_ptr, out_ptr):
        r = triton.language.arange(0, 16)
        a = triton.language.load(a_ptr + r[:, None] * 16 + r[None, :])
        triton.language.store(out_ptr + r[:, None] * 16 + r[None, :], triton.language.dot(a, a))

    a = torch.eye(16, dtype=torch.bfloat16) * 2
    out = torch.empty(16, 16)
    probe[(1,)](a, out)
    return torch.equal(out, torch.eye(16) * 4)


# On a GPU fp32 dots use tf32 only if torch allows it (off by default), so tight tolerances hold there too.
FWD_TOL = {"atol": 1e-5, "rtol": 1e-5}
GRAD_TOL = {"atol": 1e-4, "rtol": 1e-4}


def make(batch=2, heads=2, seq=37, head_dim=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(4)]  # q k v dO


def padding(batch, seq, kind, seed=1):
    """kind 'random': ~30% random holes, and a run of 8 padded keys that leaves windowed queries seeing nothing;
    'empty-row': batch 1 has no real token at all (every query of it sees nothing)."""
    if kind is None:
        return None
    mask = torch.rand(batch, seq, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[:, 0] = True
    mask[:, seq // 3: seq // 3 + 8] = False
    if kind == "empty-row":
        mask[1] = False
    return mask.to(DEVICE)


def documents(batch, seq, given, seed=2):
    """Non-decreasing document ids of packed rows: random boundaries, some inside a 16-block, a one-token document,
    and a document that crosses block edges (data.document_masking)."""
    if not given:
        return None
    gen = torch.Generator().manual_seed(seed)
    starts = (torch.rand(batch, seq, generator=gen) < 0.12).int()
    starts[:, 0], starts[:, 5], starts[:, 6] = 0, 1, 1  # position 5 is a document of its own
    return starts.cumsum(1).to(DEVICE)


def run_both(q, k, v, dout, **kw):
    """(out, dq, dk, dv) of the Triton kernel and of the eager reference (fp32) for one upstream gradient; kw: the
    AttentionSpec's fields."""
    results, spec = [], AttentionSpec(**kw)
    for fn in (flash_attention, eager_attention):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        if fn is eager_attention:
            leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, spec)
        out.backward(dout.to(out.dtype))
        results.append([out.detach()] + [t.grad for t in leaves])
    return results


def assert_matches(got, want, fwd_tol=FWD_TOL, grad_tol=GRAD_TOL):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        torch.testing.assert_close(a.float(), b.float(), **(fwd_tol if name == "out" else grad_tol), msg=name)


# --- forward and gradients equal the eager reference --------------------------------------------------------

CASES = {  # name: (heads, seq, head_dim, kwargs)
    "plain-d16": (2, 37, 16, {}),
    "plain-d128-exact-block": (1, 32, 128, {}),
    "seq1": (2, 1, 32, {}),
    "causal-d32": (2, 37, 32, {"causal": True}),
    "causal-seq16": (1, 16, 64, {"causal": True}),
    "pad-d64": (2, 37, 64, {"pad": "random"}),
    "pad-causal-d40": (2, 23, 40, {"pad": "random", "causal": True}),
    "pad-empty-row": (2, 29, 16, {"pad": "empty-row"}),
    "window5": (2, 37, 32, {"window": 5}),
    "window0": (1, 17, 16, {"window": 0}),
    "window20-unmasked-middle": (1, 40, 16, {"window": 20}),
    "window-huge": (1, 33, 16, {"window": 10**12, "causal": True}),
    "window5-causal": (2, 37, 16, {"window": 5, "causal": True}),
    "window20-causal": (1, 40, 48, {"window": 20, "causal": True}),
    "window3-pad-empty-queries": (2, 37, 16, {"window": 3, "pad": "random"}),
    "alibi-4heads": (4, 37, 16, {"alibi": True}),
    "alibi-3heads-d32": (3, 23, 32, {"alibi": True}),
    "alibi-causal-d128": (2, 17, 128, {"alibi": True, "causal": True}),
    "all-causal-window-alibi-pad": (3, 37, 32, {"causal": True, "window": 7, "alibi": True, "pad": "random"}),
    "all-bidirectional-window-alibi-pad": (3, 37, 16, {"window": 4, "alibi": True, "pad": "empty-row"}),
    "documents-d32": (2, 37, 32, {"docs": True}),
    "documents-causal-d64": (2, 41, 64, {"docs": True, "causal": True}),
    "documents-window-alibi-pad": (3, 37, 16, {"docs": True, "window": 5, "alibi": True, "pad": "random"}),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_eager_fp32(case):
    heads, seq, head_dim, kw = CASES[case]
    kw = dict(kw)
    q, k, v, dout = make(batch=2 if kw.get("pad") or kw.get("docs") else 1, heads=heads, seq=seq, head_dim=head_dim)
    kw["padding"] = padding(q.shape[0], seq, kw.pop("pad", None))
    kw["documents"] = documents(q.shape[0], seq, kw.pop("docs", None))
    assert_matches(*run_both(q, k, v, dout, **kw))


def test_fully_masked_queries_output_zero_with_finite_grads():
    q, k, v, dout = make(batch=2, heads=2, seq=37, head_dim=16)
    mask = padding(2, 37, "random")  # keys 12..19 padded: with window 3, queries 15 and 16 see nothing
    blind = ~visible_keys(37, False, 3, mask, DEVICE).any(-1)  # (batch, 1, seq)
    assert blind.sum() >= 2
    got, want = run_both(q, k, v, dout, padding=mask, window=3)
    rows = blind.expand(-1, 2, -1)
    assert torch.equal(got[0][rows], torch.zeros_like(got[0][rows]))
    assert torch.equal(got[1][rows], torch.zeros_like(got[1][rows]))  # dq of a blind query
    assert_matches(got, want)


def test_lse_is_logsumexp_of_scaled_biased_scores():
    q, k, v, _ = make(batch=2, heads=3, seq=29, head_dim=16)
    mask = padding(2, 29, "empty-row")
    out, lse = flash_attention(q, k, v, AttentionSpec(padding=mask, causal=True, window=6, alibi=True), return_lse=True)
    scores = q @ k.transpose(-2, -1) / math.sqrt(16) + alibi_bias(29, 3, DEVICE)
    scores = scores.masked_fill(~visible_keys(29, True, 6, mask, DEVICE), float("-inf"))
    want = torch.logsumexp(scores, -1)
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 29)
    assert torch.isneginf(want[1]).all()  # the empty batch row: -inf, as torch.logsumexp gives
    torch.testing.assert_close(lse, want, **FWD_TOL)
    torch.testing.assert_close(out, eager_attention(q, k, v, AttentionSpec(mask, True, 6, alibi=True)), **FWD_TOL)


def test_custom_scale():
    q, k, v, _ = make(heads=1, seq=21, head_dim=16)
    got = flash_attention(q, k, v, AttentionSpec(causal=True, scale=0.3))
    torch.testing.assert_close(got, eager_attention(q * 0.3 * 4.0, k, v, AttentionSpec(causal=True)), **FWD_TOL)


# --- layouts -------------------------------------------------------------------------------------------------

def test_non_contiguous_inputs_give_the_same_result():
    """The model's q, k, v are a permute of one (B, N, 3, H, D) tensor; strides are passed, nothing is copied."""
    batch, seq, heads, head_dim = 2, 23, 2, 32
    qkv = torch.randn(batch, seq, 3, heads, head_dim, device=DEVICE)
    dout = torch.randn(batch, heads, seq, head_dim, device=DEVICE)
    mask = padding(batch, seq, "random")
    grads = []
    for strided in (True, False):
        leaf = qkv.clone().requires_grad_(True)
        q, k, v = leaf.permute(2, 0, 3, 1, 4)
        if strided:
            assert not q.is_contiguous()
        else:
            q, k, v = (t.contiguous() for t in (q, k, v))
        out = flash_attention(q, k, v, AttentionSpec(padding=mask, causal=True))
        out.backward(dout)
        grads.append((out.detach(), leaf.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    want = eager_attention(*qkv.permute(2, 0, 3, 1, 4), AttentionSpec(padding=mask, causal=True))
    torch.testing.assert_close(grads[0][0], want, **FWD_TOL)


def test_output_layout_is_batch_seq_heads_dim():
    q, k, v, _ = make(batch=2, heads=3, seq=5, head_dim=16)
    out = flash_attention(q, k, v)
    assert out.shape == (2, 3, 5, 16)
    assert out.transpose(1, 2).is_contiguous()  # so y.transpose(1, 2).reshape(B, N, H * D) is free
    assert out.transpose(1, 2).reshape(2, 5, 48).data_ptr() == out.data_ptr()


def test_broadcast_upstream_gradient():
    """`.sum()` sends an all-zero-stride gradient."""
    q, k, v, _ = make(heads=2, seq=19, head_dim=16)
    grads = []
    for fn in (flash_attention, eager_attention):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        fn(*leaves, AttentionSpec(causal=True)).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **GRAD_TOL)


# --- work skipping: blocks out of the causal/window range are never read --------------------------------------

@pytest.mark.skipif(not INTERPRET, reason="relies on the interpreter's fixed 16x16 blocks")
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the row max of a poisoned (NaN) query row
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": 4}], ids=["causal", "window4"])
def test_unreachable_blocks_are_not_read(kw):
    """NaNs in a block no query of a block can see must not leak in (0 * NaN = NaN if it were read)."""
    seq = 64
    q, k, v, dout = make(batch=1, heads=1, seq=seq, head_dim=16)
    clean = run_both(q, k, v, dout, **kw)[1]
    k2, v2 = k.clone(), v.clone()
    unseen = 32 if kw.get("causal") else 48  # queries < 32 see keys < 32 (causal), or <= 35 (window 4)
    k2[:, :, unseen:] = v2[:, :, unseen:] = float("nan")
    got = run_both(q, k2, v2, dout, **kw)[0]
    torch.testing.assert_close(got[0][:, :, :32], clean[0][:, :, :32], **FWD_TOL)
    torch.testing.assert_close(got[1][:, :, :32], clean[1][:, :, :32], **GRAD_TOL)
    q2, dout2 = q.clone(), dout.clone()
    rows = slice(0, 16) if kw.get("causal") else slice(48, 64)  # queries that never see keys 16..31 (16..47)
    q2[:, :, rows] = dout2[:, :, rows] = float("nan")
    got = run_both(q2, k, v, dout2, **kw)[0]
    keys = slice(16, 64) if kw.get("causal") else slice(0, 32)
    for i in (2, 3):  # dk, dv
        torch.testing.assert_close(got[i][:, :, keys], clean[i][:, :, keys], **GRAD_TOL)


# --- determinism, dtypes, errors -----------------------------------------------------------------------------

def test_backward_is_deterministic():
    q, k, v, dout = make(batch=2, heads=1, seq=37, head_dim=32)
    mask = padding(2, 37, "random")
    first, second = (run_both(q, k, v, dout, padding=mask, alibi=True)[0] for _ in range(2))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 5e-3), (torch.bfloat16, 4e-2)], ids=["fp16", "bf16"])
def test_half_precision_close_to_fp32_reference(dtype, tol):
    """fp32 accumulation, P@V and dS@K in the input dtype (as on GPU); loose tolerances (inputs are rounded)."""
    if dtype == torch.bfloat16 and not interpreter_bf16_dot_works():
        pytest.skip("this Triton's interpreter computes tl.dot on bf16 as raw uint16 bits (wrong numbers); "
                    "bf16 is checked on GPU runs only")
    q, k, v, dout = make(batch=2, heads=2, seq=23, head_dim=32, dtype=dtype)
    got, want = run_both(q, k, v, dout, causal=True, alibi=True, padding=padding(2, 23, "random"))
    assert all(t.dtype == dtype for t in got)
    assert_matches(got, want, fwd_tol={"atol": tol, "rtol": tol}, grad_tol={"atol": 2 * tol, "rtol": 2 * tol})


def test_rejects_dropout_and_bad_inputs():
    q, k, v, _ = make(heads=1, seq=4, head_dim=16)
    with pytest.raises(ValueError, match="no dropout"):
        flash_attention(q, k, v, AttentionSpec(dropout_p=0.1))
    with pytest.raises(ValueError, match="shape"):
        flash_attention(q, k[:, :, :3], v)
    with pytest.raises(ValueError, match=r"dtype, got q torch.float32, k torch.float32, v torch.bfloat16"):
        flash_attention(q, k, v.bfloat16())
    with pytest.raises(ValueError, match="window"):
        flash_attention(q, k, v, AttentionSpec(window=-1))
    with pytest.raises(ValueError, match=r"padding must be \(batch, seq\)"):
        flash_attention(q, k, v, AttentionSpec(padding=torch.ones(1, 5, dtype=torch.bool, device=DEVICE)))
    big = torch.zeros(1, 1, 2, 264, device=DEVICE)
    with pytest.raises(ValueError, match="256"):
        flash_attention(big, big, big)


def test_registered_and_missing_triton_is_a_clear_error(monkeypatch):
    from cramming import kernels

    kernels.register()  # impl.py's call (importing a kernel registers nothing)
    assert ATTENTION_KERNELS["triton"] is flash_attention
    q, k, v, _ = make(heads=1, seq=4, head_dim=16)
    monkeypatch.setattr(attention_module, "triton", None)
    with pytest.raises(RuntimeError, match="needs triton"):
        flash_attention(q, k, v)


def test_batch_times_heads_is_on_grid_axis_0(monkeypatch):
    """CUDA caps grid axes 1 and 2 at 65,535; batch * heads passes that with a large microbatch, axis 0 does not."""
    launched = []

    class Recording:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launched.append((self.name, grid))
            return self.kernel[grid]

    for name in ("fwd", "dkdv", "dq"):
        monkeypatch.setitem(flash_kernels.PLAIN, name, Recording(name, flash_kernels.PLAIN[name]))
    monkeypatch.setattr(attention_module, "DELTA", Recording("delta", flash_kernels.DELTA))
    q, k, v, do = (t.requires_grad_() for t in make(batch=3, heads=2, seq=37, head_dim=16))
    flash_attention(q, k, v).backward(do)
    assert {name for name, _ in launched} == {"fwd", "delta", "dkdv", "dq"}
    assert all(grid == (6, 3) for _, grid in launched), launched  # (batch * heads, 37 rows in 16-row blocks)
    assert attention_module.grid(70_000 * 16, 4096, 128) == (1_120_000, 32)
