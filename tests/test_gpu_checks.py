"""scripts/gpu_checks.sh in rehearsal (the same steps on CPU at tiny sizes), so its plumbing cannot rot before the
GPU machine sees it: the pre-flight names what is missing in one line and runs nothing after it; a full run leaves
at most 8 files in its results folder (--out, else outputs/gpu_checks/<date>_<time>/ in the checkout), none in a
folder, a summary that lists every step, the figures and a tarball of logs; and the checks run without `datasets`
(the GPU machine may lack it); bench.py's GPU section leaves the kernels to it. Its options, the shell wrapper and
the instructions, in seconds: tests/test_gpu_checks_cli.py."""

import importlib.util
import json
import os
import shutil
import subprocess
import tarfile
from types import SimpleNamespace

import pytest
from conftest import REPO, glue_folder

spec = importlib.util.spec_from_file_location("gpu_checks", REPO / "scripts" / "gpu_checks.py")
gpu_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_checks)
STEPS = ["product", "product_eval", "product_sdpa", "kernels", "bench_gpu", *gpu_checks.ENGINES,
         *gpu_checks.FEATURES]


def rehearse(tmp_path, hide: list[str], wheels) -> subprocess.CompletedProcess:
    """Run the rehearsal with the modules in `hide` made unimportable (a package of that name that raises)."""
    shadow = tmp_path / "shadow"
    for module in hide:
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{module}' (hidden by the test)\", name={module!r})\n")
    env = {**os.environ, "PYTHONPATH": str(shadow), "GPU_CHECKS_REHEARSAL": "1"}
    env.pop("GLUE_DIR", None)
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_checks.sh"), "--out", str(tmp_path / "out"),
                           "--wheels", str(wheels), "--glue", str(glue_folder(tmp_path))], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)


def carried_wheels(tmp_path, leave_out: str):
    """.whl/ as scripts/fetch_wheels.py made it, less one package (its wheel would undo the hiding); empty in CI."""
    folder = tmp_path / "whl"
    folder.mkdir()
    for wheel in (REPO / ".whl").glob("*.whl"):
        if not wheel.name.startswith(f"{leave_out}-"):
            shutil.copy(wheel, folder)
    return folder


def test_layout_problems_name_what_breaks_a_few_small_files(tmp_path):
    for i in range(gpu_checks.MAX_FILES):
        (tmp_path / f"f{i}.md").write_text("x")
    assert gpu_checks.layout_problems(tmp_path) == []
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "ok.txt").write_text("x")
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "f0.md").write_bytes(b"x" * (gpu_checks.MAX_BYTES + 1))
    assert gpu_checks.layout_problems(tmp_path) == [f"10 files (at most {gpu_checks.MAX_FILES})",
                                                    f"f0.md is {gpu_checks.MAX_BYTES + 1} bytes",
                                                    "a/b/c/deep.txt is too deep"]


@pytest.mark.slow
def test_preflight_names_what_is_missing_in_one_line_and_stops(tmp_path):
    result = rehearse(tmp_path, hide=["hydra", "hjson"], wheels=tmp_path / "none")
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "hydra-core (ModuleNotFoundError" in errors[0] and "hjson (" in errors[0]
    assert "scripts/fetch_wheels.py" in errors[0] and "transformers" not in errors[0]  # only what is missing
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| preflight | FAILED | 2 |" in summary and "wheels: none in" in summary
    assert not any(f"| {step} |" in summary for step in STEPS)  # nothing ran after it


@pytest.mark.slow
def test_rehearsal_runs_every_step_and_leaves_a_few_small_files(tmp_path):
    result = rehearse(tmp_path, hide=["datasets"], wheels=carried_wheels(tmp_path, leave_out="datasets"))
    out = tmp_path / "out"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(p.name for p in out.rglob("*")) == ["bench.json", "benchmarks.md", "kernels.json", "logs.tar.gz",
                                                      "summary.md"]
    assert gpu_checks.layout_problems(out) == []
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU checks: complete") and "optional datasets not importable" in summary
    for step in ["preflight", *STEPS]:
        assert f"| {step} | ok | 0 |" in summary, summary
    for engine in [*gpu_checks.ENGINES, *gpu_checks.FEATURES]:  # each smoke run's own summary, read back
        assert f"- {engine}: {gpu_checks.STEPS['rehearsal']} steps on cpu, validation loss" in summary
    profiled = summary.split("## Where the end-to-end step's time goes")[1].split("##")[0]  # bench.json's profile
    assert profiled.count("ms per step") == 8 and "aten::" in profiled
    product = summary.split("## The product")[1]  # the product's figures, read back from its runs
    assert "- product: " in product and "- product_sdpa: " in product and "microbatch" in product
    assert "- product_eval: RTE " in product and "- impl.attention=auto / sdpa: " in product
    assert json.loads((out / "kernels.json").read_text())["smoke"] is True
    assert json.loads((out / "bench.json").read_text())["sections"]["gpu"]["status"] == "smoke-cpu"
    assert "Smoke run (`--smoke`" in (out / "benchmarks.md").read_text()  # the Kernels block was rewritten
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"logs/{step}.log" for step in ["preflight", *STEPS]} <= names
    assert {f"runs/{engine}/metrics.jsonl" for engine in [*gpu_checks.ENGINES, *gpu_checks.FEATURES]} <= names


def test_the_benchmarks_gpu_section_runs_the_kernels_unless_kernel_seconds_is_0(monkeypatch, tmp_path):
    """gpu_checks runs bench_kernels.py itself and passes --kernel-seconds 0: the section must not run it again."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from bench_sections import gpu

    calls, figures = [], {"tokens_per_s": 1.0, "mfu_datasheet": 0.5, "mfu_measured": 0.5, "datasheet_peak": 1e15,
                          "measured_peak": 1e15, "seq": 128, "precision": "bf16", "compile": True, "batch": 1,
                          "arch": "crammed-bert", "step_s": 1.0}
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "kernels", lambda out, seconds: calls.append(seconds) or ([], ""))
    monkeypatch.setattr(gpu, "end_to_end", lambda *args, smoke, loss="auto", profile=False: {
        **figures, "loss": "plain" if loss == "auto" else loss, "device": "cuda", "top_kernels": "a faked GPU"})
    monkeypatch.setattr(gpu, "fp8_run", lambda *args: (None, "not measured: a faked GPU"))  # asks the device
    for seconds, expected in ((0, []), (30, [30])):
        calls.clear()
        gpu.run(SimpleNamespace(smoke=False, gpu_batch=1, kernel_seconds=seconds), tmp_path)
        assert calls == expected


def test_the_profile_ranks_cuda_kernels_by_their_own_device_time(monkeypatch):
    """On CUDA only the device's kernels count (the host ops that launch them overlap them), per step, with their
    share of all kernel time; a kernel that took no time is left out."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from bench_sections import gpu

    cuda, cpu = gpu.torch.autograd.DeviceType.CUDA, gpu.torch.autograd.DeviceType.CPU

    def event(key, device_type, device_us, cpu_us, count):
        return SimpleNamespace(key=key, device_type=device_type, self_device_time_total=device_us,
                               self_cpu_time_total=cpu_us, count=count)

    events = [event("aten::mm", cpu, 600, 5000, 6),  # the host op that launched the gemm: its time again
              event("triton_poi_fused_gelu", cuda, 300, 0, 3), event("sm90_xmma_gemm_bf16", cuda, 600, 0, 6),
              event("memset", cuda, 0, 0, 3)]
    assert gpu.top_kernels(events, "cuda", steps=3) == [
        {"name": "sm90_xmma_gemm_bf16", "ms_per_step": pytest.approx(0.2), "calls_per_step": 2, "share": 600 / 900},
        {"name": "triton_poi_fused_gelu", "ms_per_step": pytest.approx(0.1), "calls_per_step": 1, "share": 300 / 900}]
    assert [k["name"] for k in gpu.top_kernels(events, "cpu", steps=3)] == ["aten::mm"]  # CPU: ops by CPU time
    assert len(gpu.top_kernels(events * 5, "cuda", steps=1, count=3)) == 3


def test_a_profile_that_fails_says_why_instead_of_costing_the_figures(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from bench_sections import gpu

    def step():
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED\nmore detail")

    failed = "profile failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"  # its first line only
    assert gpu.profile_steps(step, gpu.torch.device("cpu")) == failed
    steps, a = [], gpu.torch.ones(256, 256)  # made outside the step: the product is all a step does
    kernels = gpu.profile_steps(lambda: steps.append(a @ a), gpu.torch.device("cpu"))
    assert len(steps) == gpu.PROFILE_STEPS and kernels[0]["name"] == "aten::mm" and kernels[0]["calls_per_step"] == 1
