"""What every section shares: the machine description, interleaved timing, the measured matmul peak, targets."""

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def machine() -> dict:
    """Where the numbers come from: CPU model, cores and threads, GPU, library versions, date (UTC)."""
    import tokenizers
    import transformers

    try:  # only the data and fine-tuning sections need datasets; the GPU checks run where it may be missing
        import datasets
    except ImportError:
        datasets = None

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:  # no /proc (not Linux): keep platform's name
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cpus_usable": cores, "torch_threads": torch.get_num_threads(), "gpu": gpu,
            "load_average": load_average(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "datasets": datasets and datasets.__version__, "tokenizers": tokenizers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def load_average() -> float | None:
    """The 1-minute load average: other processes on the machine, which every timing here shares it with."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def describe(m: dict) -> str:
    where = f"GPU {m['gpu']}, " if m["gpu"] else ""
    return (f"{where}CPU {m['cpu']} ({m['cpus_usable']} usable CPUs, {m['torch_threads']} torch threads); "
            f"Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, datasets {m['datasets']}, "
            f"tokenizers {m['tokenizers']}; {m['date']}")


def compose_config(overrides: list[str]):
    """The validated PretrainConfig that `pretrain.py <overrides>` would run with."""
    from hydra import compose, initialize_config_dir

    from cramming.validation import load_config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose("pretrain", overrides=overrides))


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device="cpu") -> float:
    """Seconds one call of fn takes, with the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


class MatmulPeak:
    """The MFU denominator, measured in this run: one n x n x n torch.mm per sample, sampled between the measured
    steps so the same machine noise hits it; the median sample counts."""

    def __init__(self, device, dtype, n: int):
        self.a, self.b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        self.device, self.n, self.samples = device, n, []
        timed(lambda: torch.mm(self.a, self.b), device)  # warm-up

    def sample(self, count: int = 2) -> None:
        for _ in range(count):
            self.samples.append(2 * self.n**3 / timed(lambda: torch.mm(self.a, self.b), self.device))

    def flops(self) -> float:
        return statistics.median(self.samples)


def thread_counts(device) -> list[int]:
    """The torch thread counts a CPU section times at: 1 and the default (the default alone on a GPU)."""
    default = torch.get_num_threads()
    return sorted({1, default}) if device.type == "cpu" else [default]


def taking_turns(sides: dict, rounds: int, step) -> tuple[dict, dict]:
    """Each side's median seconds of step(side, index) and all its times: one warm-up step each (index -1), then
    the sides take turns, round by round, on the same indices, so a change in the machine's load hits both."""
    times = {name: [] for name in sides}
    for side in sides.values():
        step(side, -1)
    for r in range(rounds):
        for name, side in sides.items():
            times[name].append(step(side, r))
    return {name: statistics.median(t) for name, t in times.items()}, times


def at_each_thread_count(counts: list[int], measure) -> dict:
    """{threads: measure()} with torch set to each count in turn, and the default restored after."""
    default, results = torch.get_num_threads(), {}
    try:
        for threads in counts:
            torch.set_num_threads(threads)
            results[threads] = measure()
    finally:
        torch.set_num_threads(default)
    return results


def target(section: str, name: str, value, goal: str, op: str, threshold: float | None, unit: str = "x") -> dict:
    """One checked figure. op: '>=' / '<' against threshold, or 'report' (no target: status INFO); unit: how it
    reads ('x' a ratio, '%' a fraction shown in percent, '' a plain number)."""
    if value is None:
        status = "NOT MEASURED"
    elif op == "report":
        status = "INFO"
    else:
        ok = value >= threshold if op == ">=" else value < threshold
        status = "PASS" if ok else "FAIL"
    shown = "-" if value is None else f"{100 * value:.1f} %" if unit == "%" else f"{value:.3g}{unit}"
    return {"section": section, "name": name, "value": value, "shown": shown, "target": goal, "status": status}


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table: numbers formatted by fmt and right-aligned, text left as it is."""
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def launch(script: str, args: list[str]) -> subprocess.Popen:
    """One of our entry points (pretrain.py, eval.py) as a user runs it, in the background, output captured."""
    return subprocess.Popen([sys.executable, str(REPO / script), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_ok(proc: subprocess.Popen, script: str) -> None:
    """Wait for a launch(); its last error line if it failed."""
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed ({proc.returncode}): {err.strip().splitlines()[-1:]}")
