"""Launch configs of the attention kernels, their shared-memory estimate, and the time spent autotuning.

Plain Python (no Triton import): the router (cramming.impl) asks `shared_memory_problem` before any work, the autotuner's
pruner keeps the configs whose estimate fits the device, and `python -m cramming.kernels.aot` compiles the configs
for sm_80/sm_90 on CPU and checks the estimate against the compiler's own number (metadata.shared).

Why an estimate: a config that needs more shared memory than a block may use fails to launch (OutOfResources); the
autotuner times it as infinitely slow, and where every config fails it launches the first one anyway and the run
dies. Pruning by the estimate keeps such configs out, and where none is left the router picks SDPA (auto) or
refuses (an explicit impl.attention=triton).
"""

import functools

import torch

# (BLOCK_M, BLOCK_N, num_warps, num_stages). dK/dV: BLOCK_N keys per program, BLOCK_M queries per step; dQ and the
# forward: BLOCK_M queries per program, BLOCK_N keys per step. The small 2-stage configs at the end of each list are
# the ones that fit sm_80 at head dim 256 (bf16) / 128 (fp32) and sm_90 at fp32 head dim 256. Dropped: the configs
# that spilled registers at bf16 head dim 64 on sm_80 (`python -m cramming.kernels.aot --head-dims 64 --all`):
# fwd (128, 128, 8, 3), (64, 128, 4, 3); dkdv (32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (64, 128, 8, 2);
# dq (64, 32, 4, 2).
CONFIGS = {
    "fwd": [(128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4), (64, 64, 4, 3), (64, 32, 4, 4), (128, 128, 8, 2),
            (64, 32, 4, 2), (32, 32, 4, 2)],
    "dkdv": [(32, 128, 8, 4), (32, 64, 4, 4), (16, 128, 4, 4), (32, 64, 4, 2), (16, 64, 4, 2), (16, 32, 4, 2)],
    "dq": [(128, 32, 4, 3), (128, 64, 8, 3), (128, 32, 8, 4), (64, 64, 4, 3), (64, 32, 4, 4), (128, 64, 8, 2),
           (128, 16, 4, 4), (64, 16, 4, 2), (32, 16, 4, 2)],
}
SHARED_PER_BLOCK = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}  # opt-in maximum, bytes (sm_XY -> XY)
ESTIMATE_MARGIN = 1.0  # the AOT check requires estimate >= compiled metadata.shared for every config it builds
SCRATCH = 2048  # row reductions and layout conversions Triton does not overlap with the tiles (seen: 1,024 B)


def shared_bytes(kernel: str, block_m: int, block_n: int, stages: int, block_d: int, elt: int) -> int:
    """Shared memory of one program, in bytes: the tiles that are loaded in the loop are multi-buffered `stages`
    deep (cp.async pipelining), the tiles held across the loop are staged once for the dot operands."""
    if kernel == "fwd":  # loop: K, V (and the padding mask); held: Q
        tiles = elt * block_d * (stages * 2 * block_n + block_m) + stages * block_n
    elif kernel == "dkdv":  # loop: Q, dO, lse, delta; held: K, V
        tiles = elt * block_d * (stages * 2 * block_m + 2 * block_n) + stages * block_m * 8
    elif kernel == "dq":  # loop: K, V (and the padding mask); held: Q, dO
        tiles = elt * block_d * (stages * 2 * block_n + 2 * block_m) + stages * block_n
    else:
        raise KeyError(kernel)
    return tiles + SCRATCH


def block_d_of(head_dim: int) -> int:
    return max(16, 1 << (head_dim - 1).bit_length())


def fitting(kernel: str, head_dim: int, elt: int, limit: int) -> list[tuple]:
    """The configs of `kernel` whose estimate fits `limit` bytes of shared memory per block."""
    block_d = block_d_of(head_dim)
    return [c for c in CONFIGS[kernel] if shared_bytes(kernel, c[0], c[1], c[3], block_d, elt) <= limit]


@functools.cache
def shared_limit(device: torch.device) -> int:
    """Bytes of shared memory a block may use on this CUDA device: what Triton's launcher checks against."""
    try:
        from triton.runtime import driver  # this module stays free of Triton (its docstring): only on CUDA

        return int(driver.active.utils.get_device_properties(device.index or 0)["max_shared_mem"])
    except Exception:  # noqa: BLE001  an older Triton, or no driver: the vendor number for this capability
        major, minor = torch.cuda.get_device_capability(device)
        return SHARED_PER_BLOCK.get(10 * major + minor, SHARED_PER_BLOCK[80])


def shared_memory_problem(head_dim: int, dtype: torch.dtype, limit: int) -> str | None:
    """Why no config of some attention kernel fits `limit` bytes at this head dim and dtype, or None."""
    elt = torch.empty((), dtype=dtype).element_size()
    for kernel in CONFIGS:
        if not fitting(kernel, head_dim, elt, limit):
            return (f"no {kernel} launch config fits {limit:,} bytes of shared memory per block at head dim "
                    f"{head_dim} in {str(dtype).removeprefix('torch.')}")
    return None


_AUTOTUNE_SECONDS = [0.0]


def add_autotune_seconds(seconds: float):
    _AUTOTUNE_SECONDS[0] += seconds


def autotune_seconds() -> float:
    """Wall seconds this process spent compiling and autotuning attention kernels for new keys (first launches)."""
    return _AUTOTUNE_SECONDS[0]
