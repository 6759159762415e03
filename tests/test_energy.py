"""Energy from the hardware counters: RAPL's wrap-around undone, only the budget clock's running time counted,
nulls with a reason where no counter can be read, and the keys in a real run's train_summary.json."""

import pytest
import torch
from test_resume import NAN_RUN, TINY, config_for, sigterm_at  # noqa: F401  (sigterm_at: a fixture)

from cramming import pretraining
from cramming.engines import Engine
from cramming.errors import RunStopped
from cramming.train import energy
from cramming.train.energy import EnergyMeter, rapl_counter

RANGE = 1_000_000  # µJ: the fake counters' max_energy_range_uj, their largest reading (they wrap 1 µJ later)


def fake_powercap(root, packages=2):
    """A powercap tree as Linux lays it out: package domains, a core sub-domain and a psys domain (neither of
    which may be counted again), one counter file each."""
    for n in range(packages):
        domain = root / f"intel-rapl:{n}"
        (domain / f"intel-rapl:{n}:0").mkdir(parents=True)
        (domain / "name").write_text(f"package-{n}\n")
        (domain / "max_energy_range_uj").write_text(f"{RANGE}\n")
        (domain / "energy_uj").write_text("0\n")
        (domain / f"intel-rapl:{n}:0" / "name").write_text("core\n")
        (domain / f"intel-rapl:{n}:0" / "energy_uj").write_text("0\n")
    (root / f"intel-rapl:{packages}").mkdir()
    (root / f"intel-rapl:{packages}" / "name").write_text("psys\n")
    (root / f"intel-rapl:{packages}" / "energy_uj").write_text("0\n")
    return root


def set_counter(root, n, microjoules):
    (root / f"intel-rapl:{n}" / "energy_uj").write_text(f"{microjoules}\n")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rapl_wrap_around_and_paused_intervals(tmp_path, monkeypatch):
    root = fake_powercap(tmp_path)
    monkeypatch.setattr(energy, "POWERCAP", root)
    counter, reason = rapl_counter()
    assert reason is None and [p.parent.name for p, _ in counter.domains] == ["intel-rapl:0", "intel-rapl:1"]
    clock = Clock()
    meter = EnergyMeter(counter, None, clock)
    set_counter(root, 0, 900_000)
    set_counter(root, 1, 100_000)
    meter.begin(0.0)
    clock.now = 5.0
    set_counter(root, 0, 200_000)  # wrapped: 0.1 J to the top of the range, 1 µJ back to 0, then 0.2 J
    set_counter(root, 1, 400_000)  # 0.3 J
    meter.sample()
    assert meter.joules == pytest.approx(0.600001, abs=1e-9)
    meter.pause()  # a validation: the budget clock stops, and so does the meter
    set_counter(root, 0, 700_000)
    set_counter(root, 1, 900_000)
    meter.sample(force=True)
    meter.resume()
    clock.now = 10.0
    set_counter(root, 0, 100_000)  # wrapped again: 0.4 J and the 1 µJ step from the top back to 0
    meter.stop()
    assert meter.joules == pytest.approx(1.000002, abs=1e-9)
    summary = meter.summary(Engine(), torch.device("cpu"), tokens=1000)
    assert summary == {"energy_kwh": pytest.approx(1.000002 / 3.6e6), "joules_per_token": pytest.approx(1.000002e-3),
                       "energy_source": "rapl", "energy_unavailable": None}


def test_a_rapl_wrap_spans_the_range_plus_one(tmp_path):
    """Linux's powercap ABI: energy_uj reads 0..max_energy_range_uj, so the step from the largest reading back to
    0 is one more microjoule, and a counter that comes back to the same reading has gone round range + 1."""
    counter, _ = rapl_counter(fake_powercap(tmp_path, packages=1))
    assert counter.joules((RANGE,), (0,)) * 1e6 == pytest.approx(1)
    assert counter.joules((RANGE - 5,), (3,)) * 1e6 == pytest.approx(9)
    assert counter.joules((0,), (RANGE,)) * 1e6 == pytest.approx(RANGE)  # no wrap: the plain difference


def test_readings_within_a_second_wait_for_the_next(tmp_path, monkeypatch):
    root = fake_powercap(tmp_path, packages=1)
    clock = Clock()
    meter = EnergyMeter(rapl_counter(root)[0], None, clock)
    meter.begin(2.0)  # an earlier launch's joules
    set_counter(root, 0, 500_000)
    clock.now = 0.5
    meter.sample()  # too soon: not read
    assert meter.joules == 0.0
    clock.now = 1.5
    meter.sample()
    assert meter.joules == pytest.approx(0.5)
    assert meter.run_joules(Engine(), torch.device("cpu")) == pytest.approx(2.5)


@pytest.mark.parametrize("case", ["no tree", "unreadable", "no range"])
def test_no_readable_counter_gives_nulls_and_a_reason(tmp_path, case):
    root = tmp_path / "powercap"
    if case != "no tree":
        fake_powercap(root, packages=1)
    if case == "unreadable":  # root reads any file, so a folder stands in for a counter it may not read
        (root / "intel-rapl:0" / "energy_uj").unlink()
        (root / "intel-rapl:0" / "energy_uj").mkdir()
    if case == "no range":
        (root / "intel-rapl:0" / "max_energy_range_uj").unlink()
    counter, reason = rapl_counter(root)
    assert counter is None
    assert {"no tree": "no RAPL package counter", "unreadable": "energy_uj is not readable",
            "no range": "max_energy_range_uj is not readable"}[case] in reason
    meter = EnergyMeter(counter, reason)
    meter.begin(0.0)
    meter.sample(force=True)
    meter.stop()
    assert meter.summary(Engine(), torch.device("cpu"), tokens=100) == {
        "energy_kwh": None, "joules_per_token": None, "energy_source": None, "energy_unavailable": reason}


def test_an_unmeasured_earlier_launch_makes_the_total_unknown(tmp_path):
    meter = EnergyMeter(rapl_counter(fake_powercap(tmp_path, packages=1))[0], None)
    meter.begin(None)
    summary = meter.summary(Engine(), torch.device("cpu"), tokens=100)
    assert summary["energy_kwh"] is None and "earlier launch" in summary["energy_unavailable"]


def test_nvml_missing_is_a_reason_not_a_failure(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    counter, reason = energy.nvml_counter(torch.device("cuda", 0))
    assert counter is None and "nvidia-ml-py is not installed" in reason


def test_a_real_run_reports_the_energy_of_its_training(tmp_path, monkeypatch):
    """The counter advances 1 mJ per reading: a run reads it while training (not while validating), so the
    summary holds a positive energy from `rapl`, and joules per token is that over the tokens trained."""
    root = fake_powercap(tmp_path / "powercap", packages=1)
    monkeypatch.setattr(energy, "POWERCAP", root)
    monkeypatch.setattr(energy, "SAMPLE_SECONDS", 0.0)
    reads = []

    def advancing(self):
        reads.append(1)
        return (1000 * len(reads),)

    monkeypatch.setattr(energy.Rapl, "read", advancing)
    summary = pretraining.pretrain(config_for(*TINY, "train.max_steps=3", "train.batch_size=16",
                                              "impl.microbatch_size=16", "train.checkpoint_every_minutes=null"),
                                   tmp_path / "run")
    assert summary["energy_source"] == "rapl" and summary["energy_unavailable"] is None
    joules = summary["energy_kwh"] * 3.6e6
    # begin, then one reading after each of the 3 steps and one at the end: 4 intervals of 1 mJ
    assert len(reads) == 5 and joules == pytest.approx(0.004)
    assert summary["joules_per_token"] == pytest.approx(joules / summary["tokens"])


def test_the_report_shows_energy_and_says_why_a_run_has_none(tmp_path):
    import json

    from test_report import write_run

    from cramming.report import collect_runs
    from cramming.report_plots import energy_notes, markdown_table

    root = tmp_path / "sweep"
    for job, (name, kwh) in enumerate((("0_measured", 2e-5), ("1_unmeasured", None))):
        write_run(root / name, "rotary", 0.001 * (job + 1), 1_000_000, True, job)
        path = root / name / "train_summary.json"
        summary = json.loads(path.read_text())
        summary.update({"energy_kwh": kwh, "joules_per_token": kwh and kwh * 3.6e6 / summary["tokens"],
                        "energy_source": kwh and "rapl",
                        "energy_unavailable": None if kwh else "no RAPL package counter under /x"})
        path.write_text(json.dumps(summary))
    runs = collect_runs([str(root)])
    table = markdown_table(runs, [])
    assert table.splitlines()[0].endswith("| kWh | J/token |")
    assert table.splitlines()[2].endswith("| 2e-05 | 7.2e-05 |") and table.splitlines()[3].endswith("| – | – |")
    notes = " ".join(energy_notes(runs))
    assert "(rapl;" in notes and "No energy for 1 finished run(s): no RAPL package counter under /x." in notes


def test_nvml_reads_the_gpu_found_by_uuid_in_millijoules(monkeypatch):
    """No GPU here: a stand-in pynvml with NVML's calls. The GPU is found by its UUID (CUDA_VISIBLE_DEVICES may
    renumber devices; NVML's indices do not follow), and its counter is in millijoules."""
    import sys
    import types

    readings = iter([5_000, 5_000, 12_500])
    fake = types.ModuleType("pynvml")
    fake.NVMLError = type("NVMLError", (Exception,), {})
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: {"handle": uuid}
    fake.nvmlDeviceGetTotalEnergyConsumption = lambda handle: next(readings)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid="1234-abcd"))
    counter, reason = energy.nvml_counter(torch.device("cuda", 0))
    assert reason is None and counter.handle == {"handle": "GPU-1234-abcd"}
    meter = EnergyMeter(counter, None)
    meter.begin(0.0)
    meter.stop()
    assert meter.joules == pytest.approx(7.5) and meter.source == "nvml"

    def unsupported(handle):
        raise fake.NVMLError("Not Supported")

    fake.nvmlDeviceGetTotalEnergyConsumption = unsupported
    counter, reason = energy.nvml_counter(torch.device("cuda", 0))
    assert counter is None and "NVML has no energy counter for cuda:0: Not Supported" in reason


def test_a_resumed_run_adds_the_energy_of_the_launch_before(sigterm_at, tmp_path, monkeypatch):  # noqa: F811
    """Stopped after step 2 of 6, resumed: the checkpoint carries the first launch's joules and the summary adds
    the second launch's (the counter advances 1 mJ per reading; 3 intervals in each launch)."""
    monkeypatch.setattr(energy, "POWERCAP", fake_powercap(tmp_path / "powercap", packages=1))
    monkeypatch.setattr(energy, "SAMPLE_SECONDS", 0.0)
    reads = []
    monkeypatch.setattr(energy.Rapl, "read", lambda self: reads.append(1) or (1000 * len(reads),))
    run = [*NAN_RUN, "train.checkpoint_every_minutes=null", "train.max_steps=4"]
    sigterm_at.append(2)
    with pytest.raises(RunStopped):
        pretraining.pretrain(config_for(*run), tmp_path / "run")
    sigterm_at.clear()
    first = len(reads)  # begin, after step 1, at the checkpoint after step 2: 2 intervals
    summary = pretraining.pretrain(config_for(*run), tmp_path / "run")
    assert summary["resumed_from"].endswith("step-00000002")
    second = len(reads) - first  # begin, after steps 3 and 4, at the end: 3 intervals
    assert (first, second) == (3, 4)
    assert summary["energy_kwh"] * 3.6e6 == pytest.approx(0.002 + 0.003)
