"""`impl.microbatch_size=auto`: the largest microbatch that fits this model, sequence length and GPU.

Every candidate divides train.batch_size (and is a multiple of the curriculum's block, see curriculum.py), so
gradient accumulation reaches the batch exactly. On CUDA each candidate, smallest first, gets one forward and
backward pass at the longest sequence the run will see, beside a ballast the size of the optimizer's state,
until one runs out of memory; the answer is remembered per model, length, precision and GPU in the cache
folder, so the search runs once. Elsewhere (CPU) memory is not the limit and auto means CPU_MICROBATCH.
"""

import hashlib
import json
from pathlib import Path

import torch

CPU_MICROBATCH = 32


def candidates(batch_size: int, multiple_of: int) -> list[int]:
    return [d for d in range(multiple_of, batch_size + 1, multiple_of) if batch_size % d == 0]


def largest_fitting(options: list[int], fits) -> int:
    """The largest option before the first that does not fit (options ascending); the smallest if none fits."""
    best = options[0]
    for option in options:
        if not fits(option):
            break
        best = option
    return best


def probe_fits(model, vocab_size: int, seq_len: int, autocast, ballast_numel: int):
    """fits(m): does a forward + backward of m sequences of seq_len tokens fit beside the ballast?"""
    device = next(model.parameters()).device

    def fits(m: int) -> bool:
        ballast = ids = None
        try:  # fork_rng: probing must not move the random streams the run (and its resumption) replays
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                ballast = torch.empty(ballast_numel, dtype=torch.float32, device=device)
                ids = torch.randint(5, vocab_size, (m, seq_len), device=device)
                with autocast():
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            del ballast, ids
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()

    return fits


def auto_microbatch(model, config, vocab_size: int, seq_len: int, multiple_of: int, runtime, cache_dir) -> int:
    options = candidates(config.train.batch_size, multiple_of)
    if runtime.device.type != "cuda":
        fitting = [m for m in options if m <= CPU_MICROBATCH]
        return fitting[-1] if fitting else options[0]
    key_text = json.dumps({"arch": repr(config.arch), "seq_len": seq_len, "precision": runtime.precision,
                           "device": torch.cuda.get_device_name(runtime.device), "batch": config.train.batch_size,
                           "multiple_of": multiple_of})
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    cache = Path(cache_dir).expanduser() / "microbatch.json"
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if key in known:
        return known[key]
    optimizer_state = 2 * sum(p.numel() for p in model.parameters())  # AdamW's two moments, fp32
    model.train()
    best = largest_fitting(options, probe_fits(model, vocab_size, seq_len, runtime.autocast(), optimizer_state))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({**known, key: best}, indent=1))
    return best
