"""Launch configs by shared memory: the router's refusal and fallback, the autotuner's pruner, the fp32 route, and
the autotune time and cache. No GPU: the device's shared memory per block is set by hand (sm_80 / sm_90)."""
import inspect
import time

import pytest
import torch

from cramming import impl
from cramming.config import ArchConfig
from cramming.errors import UserError
from cramming.kernels import HAVE_TRITON, tuning

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
CUDA = torch.device("cuda")
SM80, SM90 = tuning.SHARED_PER_BLOCK[80], tuning.SHARED_PER_BLOCK[90]


def arch_with_head_dim(head_dim):
    return ArchConfig(hidden_size=2 * head_dim, num_heads=2, attention_dropout=0.0)


def on_device(monkeypatch, shared):
    monkeypatch.setattr(tuning, "shared_limit", lambda device: shared)


@needs_triton
@pytest.mark.parametrize("shared,dtype,head_dim,fits", [
    (SM80, torch.bfloat16, 128, True), (SM80, torch.bfloat16, 256, True), (SM80, torch.float32, 128, True),
    (SM90, torch.float32, 256, True), (SM80, torch.float32, 256, True), (100_000, torch.float32, 256, False),
    (60_000, torch.bfloat16, 256, False)])
def test_auto_takes_sdpa_and_explicit_triton_is_refused_where_no_config_fits(shared, dtype, head_dim, fits,
                                                                             monkeypatch):
    on_device(monkeypatch, shared)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")  # tf32 allowed: fp32 may take triton
    arch = arch_with_head_dim(head_dim)
    assert impl.resolve_kernels("auto", "torch", arch, CUDA, dtype)[0] == ("triton" if fits else "sdpa")
    if fits:
        assert impl.resolve_kernels("triton", "torch", arch, CUDA, dtype)[0] == "triton"
    else:
        with pytest.raises(UserError, match=rf"impl.attention=triton cannot serve this run: no \w+ launch config "
                                            rf"fits {shared:,} bytes of shared memory per block at head dim "
                                            rf"{head_dim} in {str(dtype)[6:]}; or use impl.attention=sdpa"):
            impl.resolve_kernels("triton", "torch", arch, CUDA, dtype)


def test_the_configs_added_for_small_shared_memory_are_what_fits_there():
    """sm_80 at bf16 head dim 256 (and fp32 at 128) fits none of the original backward configs: the added 2-stage
    ones, and only they, fit there."""
    for kernel in ("dkdv", "dq"):
        kept = tuning.fitting(kernel, 256, 2, SM80)
        assert kept and all(stages == 2 and max(m, n) <= 64 for m, n, _, stages in kept), (kernel, kept)
        assert kept == tuning.fitting(kernel, 128, 4, SM80)
    assert all(stages == 2 for *_, stages in tuning.fitting("fwd", 256, 4, SM90))


@needs_triton
def test_fp32_takes_sdpa_under_auto_unless_tf32_is_allowed(monkeypatch):
    on_device(monkeypatch, SM90)
    arch = arch_with_head_dim(64)
    for precision, want in (("highest", "sdpa"), ("high", "triton"), ("medium", "triton")):
        monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda p=precision: p)
        assert impl.resolve_kernels("auto", "torch", arch, CUDA, torch.float32)[0] == want, precision
        assert impl.resolve_kernels("auto", "torch", arch, CUDA, torch.bfloat16)[0] == "triton"
        assert impl.resolve_kernels("triton", "torch", arch, CUDA, torch.float32)[0] == "triton"  # explicit: IEEE


@needs_triton
@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq"])
def test_the_pruner_keeps_only_configs_that_fit_the_device(kernel, monkeypatch):
    import triton

    from cramming.kernels import flash_kernels

    monkeypatch.setattr(flash_kernels, "shared_limit", lambda device: SM80)
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in tuning.CONFIGS[kernel]]
    prune = flash_kernels._pruner(kernel)
    for dtype, head_dim in ((torch.bfloat16, 256), (torch.float32, 128), (torch.bfloat16, 64)):
        q = torch.empty(1, 1, 1, head_dim, dtype=dtype)
        kept = prune(configs, {"Q": q, "N_BUCKET": 4096}, BLOCK_D=head_dim)
        sizes = [tuning.shared_bytes(kernel, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, head_dim,
                                     q.element_size()) for c in kept]
        assert kept and max(sizes) <= SM80, (dtype, head_dim, sizes)
        assert len(kept) == len(tuning.fitting(kernel, head_dim, q.element_size(), SM80))
    short = prune(configs, {"Q": torch.empty(1, 1, 1, 64), "N_BUCKET": 16}, BLOCK_D=64)
    assert short and all(max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= 32 for c in short)


@needs_triton
def test_autotune_seconds_count_new_keys_only(monkeypatch):
    from cramming.kernels import attention, flash_kernels

    class Tuner:
        def __init__(self):
            self.cache = {}

        def __getitem__(self, grid):
            def launch(*args, **meta):
                if meta["key"] not in self.cache:
                    time.sleep(0.2)  # compiling and timing the configs
                    self.cache[meta["key"]] = "best"
            return launch

    monkeypatch.setitem(flash_kernels.TUNED, "fwd", Tuner())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    before = tuning.autotune_seconds()
    for key in ("a", "a", "b", "a"):
        attention._launch("fwd", "BLOCK_M", 64, 4, (), {"key": key}, CUDA)
    assert 0.4 <= tuning.autotune_seconds() - before < 0.6


@needs_triton
def test_autotune_results_are_cached_on_disk_where_triton_can():
    import triton

    from cramming.kernels import flash_kernels

    can = "cache_results" in inspect.signature(triton.autotune).parameters
    assert flash_kernels._CACHE == ({"cache_results": True} if can else {})
