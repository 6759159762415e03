"""Peak memory of a training step with impl.loss=fused against plain, part of section 1.

Each (model, loss) runs in its own interpreter: the model is built as pretrain.py builds it and takes one step
(warm-up: the optimizer state exists afterwards); then the kernel's peak counter (VmHWM) is reset and two more steps
run. The figure is that peak minus what stays resident between steps, i.e. the step's working memory. Linux only.
Run alone: python scripts/bench_sections/loss_memory.py ARCH BATCH SEQ VOCAB LOSS [--smoke]
"""

import json
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def probe(arch: str, batch: int, seq: int, vocab: int, loss: str, smoke: bool) -> dict:
    import torch

    from bench_sections.train import build_ours

    _, runtime, ours = build_ours(arch, seq, vocab, torch.device("cpu"), smoke, loss=loss)
    generator = torch.Generator().manual_seed(0)

    def step():
        ours["run"].step(torch.randint(5, vocab, (batch, seq), generator=generator), generator)

    step()
    resident = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM): start-up's imports peaked higher
    step()
    step()
    peak = high_water_mark()
    return {"arch": arch, "loss": runtime.loss, "peak_bytes": peak, "between_steps_bytes": resident,
            "step_bytes": peak - resident}


def high_water_mark() -> int:
    """The process's peak resident set since the last reset, in bytes (Linux's VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory needs Linux")


def measure(arch: str, batch: int, seq: int, vocab: int, smoke: bool) -> dict:
    """{loss: probe result} for fused and plain, each in a fresh interpreter."""
    results = {}
    for loss in ("plain", "fused"):
        args = [sys.executable, str(HERE / "loss_memory.py"), arch, str(batch), str(seq), str(vocab), loss]
        out = subprocess.run(args + (["--smoke"] if smoke else []), capture_output=True, text=True, check=True,
                             cwd=HERE.parent)
        results[loss] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    arch, batch, seq, vocab, loss = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    print(json.dumps(probe(arch, batch, seq, vocab, loss, smoke="--smoke" in sys.argv)))
