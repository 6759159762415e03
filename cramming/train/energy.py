"""The energy a run's training took, from the hardware's own counters, over the budget clock's running time only
(validation pauses the clock and the meter alike).

- CUDA: NVML's total-energy counter of each rank's GPU (millijoules since the driver loaded; Volta and later),
  through the `pynvml` module of the nvidia-ml-py package (pip install 'cramming[energy]'), summed over ranks.
- CPU: Linux's RAPL counters, `/sys/class/powercap/intel-rapl:<n>/energy_uj` of each package domain (AMD's
  too), where readable (root only since Linux 5.10). They read 0..`max_energy_range_uj` and then wrap to 0, so one
  wrap spans `max_energy_range_uj` + 1 µJ (the range is the largest reading, not the modulus); the meter reads them at
  least every `SAMPLE_SECONDS` of training, well inside a wrap (tens of minutes at full power). They count the
  whole package, so other programs on the machine count too; one process per machine reads them.
- Anywhere else: no number (null) and the reason.
"""

import time
from pathlib import Path

import torch

from .hooks import Hook

POWERCAP = Path("/sys/class/powercap")
SAMPLE_SECONDS = 1.0  # the loop reads the counter at most this often (and at every pause and at the end)
JOULES_PER_KWH = 3.6e6


class Rapl:
    """The package domains of the powercap tree: one energy_uj counter each, wrapping past its range to 0."""

    source = "rapl"

    def __init__(self, domains: list[tuple[Path, int]]):
        self.domains = domains  # (energy_uj file, max_energy_range_uj: the largest value the counter reads)

    def read(self) -> tuple[int, ...]:
        return tuple(int(path.read_text()) for path, _ in self.domains)

    def joules(self, before: tuple, after: tuple) -> float:
        """The energy between two readings, a counter that passed its range having wrapped once: it reads
        0..max_energy_range_uj, so one wrap is max_energy_range_uj + 1 µJ."""
        total = 0
        for (_, largest), a, b in zip(self.domains, before, after):
            total += b - a if b >= a else b + (largest + 1) - a
        return total / 1e6


class Nvml:
    """One GPU's total-energy counter (millijoules; 64 bits, it does not wrap)."""

    source = "nvml"

    def __init__(self, pynvml, handle):
        self.pynvml, self.handle = pynvml, handle

    def read(self) -> int:
        return self.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def joules(self, before: int, after: int) -> float:
        return (after - before) / 1e3


def rapl_counter(root: Path | None = None) -> tuple[Rapl | None, str | None]:
    """The machine's RAPL package domains, or None and why not."""
    root = Path(root or POWERCAP)
    tops = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)  # not the sub-domains
    packages = [p for p in tops if _read(p / "name", "").startswith("package")]
    if not packages:
        return None, f"no RAPL package counter under {root} (a CPU or kernel without powercap's intel-rapl)"
    domains = []
    for folder in packages:
        energy, span = folder / "energy_uj", _read(folder / "max_energy_range_uj", None)
        try:
            int(energy.read_text())
        except (OSError, ValueError) as err:
            return None, (f"{energy} is not readable ({type(err).__name__}; root only since Linux 5.10): "
                          f"`sudo chmod a+r {root}/intel-rapl:*/energy_uj` lets runs measure it")
        if span is None or not span.isdigit():
            return None, f"{folder / 'max_energy_range_uj'} is not readable, so a wrap could not be undone"
        domains.append((energy, int(span)))
    return Rapl(domains), None


def nvml_counter(device: torch.device) -> tuple[Nvml | None, str | None]:
    """The NVML counter of this process's GPU, found by UUID (right under CUDA_VISIBLE_DEVICES), or None and why."""
    try:
        import pynvml  # optional (nvidia-ml-py): only on a CUDA device, and a miss is reported
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'cramming[energy]')"
    try:
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # NotSupported before Volta
    except pynvml.NVMLError as err:
        return None, f"NVML has no energy counter for {device}: {err}"
    return Nvml(pynvml, handle), None


def find_counter(device: torch.device, local_rank: int = 0):
    """(counter, None) or (None, reason) for the device training runs on."""
    if device.type == "cuda":
        return nvml_counter(device)
    if device.type == "cpu":
        if local_rank != 0:
            return Quiet(), None  # the package counter is the machine's: its first process reads it
        return rapl_counter()
    return None, f"no energy counter is known for {device.type} devices"


class Quiet:
    """Another process's counter is read already (RAPL counts the whole machine): this one adds nothing."""

    source = "rapl"

    def read(self) -> int:
        return 0

    def joules(self, before, after) -> float:
        return 0.0


class EnergyMeter(Hook):
    """Joules while the budget clock runs: `begin` when the loop starts, `sample` between steps, `pause` and
    `resume` around a validation, `stop` at the end. `prior` is what earlier launches of the run measured
    (TrainState.energy_joules, all ranks); None there means one could not, so the run's total is unknown.
    As the loop's hook (hooks.py) it does each of those at its moment, and puts the run's joules so far into
    every checkpoint, for a resumed launch to go on from."""

    def __init__(self, counter, reason: str | None, clock=time.perf_counter):
        self.counter, self.reason, self.clock = counter, reason, clock
        self.joules = 0.0  # this process, this launch
        self.prior = 0.0
        self.last = self.last_time = None  # the reading the next delta starts from; None = paused

    @classmethod
    def for_device(cls, device: torch.device, local_rank: int = 0) -> "EnergyMeter":
        return cls(*find_counter(device, local_rank))

    @property
    def source(self) -> str | None:
        return self.counter.source if self.counter is not None else None

    def begin(self, prior: float | None) -> None:
        self.prior = prior
        self.resume()

    def resume(self) -> None:
        if self.counter is not None:
            self.last, self.last_time = self.counter.read(), self.clock()

    def sample(self, force: bool = False) -> None:
        if self.last is None or (not force and self.clock() - self.last_time < SAMPLE_SECONDS):
            return
        now = self.counter.read()
        self.joules += self.counter.joules(self.last, now)
        self.last, self.last_time = now, self.clock()

    def pause(self) -> None:
        self.sample(force=True)
        self.last = None

    stop = pause

    def on_begin(self, trainer, state) -> None:
        self.begin(state.energy_joules)

    def on_between(self, trainer, state) -> None:
        self.sample()

    def on_checkpoint(self, trainer, state) -> None:
        self.sample(force=True)
        state.energy_joules = self.run_joules(trainer.parts.engine, trainer.device)

    def on_pause(self) -> None:
        self.pause()

    def on_resume(self) -> None:
        self.resume()

    def on_end(self, trainer, state) -> None:
        self.stop()

    def run_joules(self, engine, device) -> float | None:
        """Earlier launches' joules plus this launch's on every rank (collective: every rank calls it)."""
        failed = engine.agree(float(self.counter is None or self.prior is None), device=device)[0]
        total = engine.mean(torch.tensor(self.joules, dtype=torch.float64, device=device)) * engine.world
        return None if failed else self.prior + float(total)

    def summary(self, engine, device, tokens: int) -> dict:
        """train_summary.json's energy keys (collective)."""
        joules = self.run_joules(engine, device)
        reason = None
        if joules is None:
            reason = self.reason or ("an earlier launch of this run (before resuming) had no energy counter"
                                     if self.prior is None else "another process had no energy counter")
            reason = engine.broadcast(reason)
        return {"energy_kwh": joules / JOULES_PER_KWH if joules is not None else None,
                "joules_per_token": joules / tokens if joules is not None and tokens else None,
                "energy_source": self.source if joules is not None else None,
                "energy_unavailable": reason}


def _read(path: Path, default):
    try:
        return path.read_text().strip()
    except OSError:
        return default
