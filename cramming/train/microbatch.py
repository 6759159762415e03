"""`impl.microbatch_size=auto`: the largest microbatch that fits this model, sequence length and GPU, with room kept.

Every candidate divides train.batch_size (and is a multiple of the curriculum's block, see curriculum.py), so
gradient accumulation reaches the batch exactly. On CUDA each candidate, smallest first, gets one forward and
backward pass at the longest sequence the run will see, beside a ballast the size of the optimizer's state, until
one runs out of room or its peak passes HEADROOM of the GPU's memory: the probe is one eager pass on a fresh
allocator, and a real run (later ramp steps, curriculum stages, a fragmented allocator) needs more than that. A
launch that fails for size (CUDA "invalid argument", a launch failure, Triton's OutOfResources) counts as out of
room, as an OOM does. The answer is remembered per model, length, precision and GPU in the cache folder, so the
search runs once. Elsewhere (CPU) memory is not the limit and auto means CPU_MICROBATCH.
"""

import hashlib
import json
from pathlib import Path

import torch

from ..atomic import locked, write_atomic

CPU_MICROBATCH = 32
HEADROOM = 0.9  # the most of the GPU's memory that the probe's peak (the allocator's reserve) may take
# what CUDA and cuBLAS say when a launch is too large for the device rather than wrong
LAUNCH_FAILURES = ("out of memory", "invalid argument", "invalid configuration argument", "launch failure",
                   "too many resources requested", "CUBLAS_STATUS_ALLOC_FAILED")


def candidates(batch_size: int, multiple_of: int) -> list[int]:
    return [d for d in range(multiple_of, batch_size + 1, multiple_of) if batch_size % d == 0]


def out_of_room(error: Exception) -> bool:
    """Did this microbatch fail for its size? Other errors are bugs, and the search must not hide them."""
    if isinstance(error, torch.cuda.OutOfMemoryError) or type(error).__name__ == "OutOfResources":  # Triton's
        return True
    return isinstance(error, RuntimeError) and any(text in str(error) for text in LAUNCH_FAILURES)


def largest_fitting(options: list[int], peak, capacity: int) -> int:
    """The largest option (ascending) before the first that runs out of room (peak None) or peaks above HEADROOM
    of capacity bytes; the smallest if none fits."""
    best = options[0]
    for option in options:
        used = peak(option)
        if used is None or used > HEADROOM * capacity:
            break
        best = option
    return best


def probe_peak(model, vocab_size: int, seq_len: int, autocast, ballast_numel: int):
    """peak(m): the bytes the allocator reserved at most for a forward + backward of m sequences of seq_len tokens
    beside the ballast (0 off CUDA), or None where it ran out of room."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"

    def peak(m: int) -> int | None:
        ballast = ids = None
        try:  # fork_rng: probing must not move the random streams the run (and its resumption) replays
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            with torch.random.fork_rng(devices=[device] if cuda else []):
                ballast = torch.empty(ballast_numel, dtype=torch.float32, device=device)
                ids = torch.randint(5, vocab_size, (m, seq_len), device=device)
                with autocast():
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            return torch.cuda.max_memory_reserved(device) if cuda else 0
        except Exception as error:  # out_of_room decides; anything else is raised again
            if not out_of_room(error):
                raise
            return None
        finally:
            del ballast, ids
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.empty_cache()

    return peak


def gpu_bytes(device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def auto_microbatch(model, config, vocab_size: int, seq_len: int, multiple_of: int, runtime, cache_dir) -> int:
    options = candidates(config.train.batch_size, multiple_of)
    if runtime.device.type != "cuda":
        fitting = [m for m in options if m <= CPU_MICROBATCH]
        return fitting[-1] if fitting else options[0]
    key_text = json.dumps({"arch": repr(config.arch), "seq_len": seq_len, "precision": runtime.precision,
                           "device": torch.cuda.get_device_name(runtime.device), "batch": config.train.batch_size,
                           "multiple_of": multiple_of, "headroom": HEADROOM})
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    cache = Path(cache_dir).expanduser() / "microbatch.json"
    if key in (known := remembered(cache)):
        return known[key]
    optimizer_state = 2 * sum(p.numel() for p in model.parameters())  # AdamW's two moments, fp32
    model.train()
    peak = probe_peak(model, vocab_size, seq_len, runtime.autocast(), optimizer_state)
    best = largest_fitting(options, peak, gpu_bytes(runtime.device))
    with locked(cache):  # other jobs of a sweep may have added theirs since: merge, never overwrite
        write_atomic(cache, json.dumps({**remembered(cache), key: best}, indent=1))
    return best


def remembered(cache: Path) -> dict:
    return json.loads(cache.read_text()) if cache.is_file() else {}


def microbatch_size(c) -> int | None:
    """Sequences per forward pass: impl.microbatch_size, or the whole batch when that is smaller; None for auto
    (decided once the model is built: choose_microbatch)."""
    if c.impl.microbatch_size == "auto":
        return None
    return min(c.impl.microbatch_size, c.train.batch_size)
