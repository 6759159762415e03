"""scripts/bench_kernels.py end to end in its --smoke mode: tiny shapes on CPU under the Triton interpreter, so every
code path (each kernel; forward, backward, fwd+bwd; tables; JSON; the docs block; targets) runs without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_kernels.py"
DOCS = REPO / "docs" / "benchmarks.md"
BEFORE, AFTER = "# Benchmarks\n\nIntro.\n\n## Kernels\n\n", "\n\n## Later section\n\nKept as it is.\n"


def bench(*args):
    """Run the script as a user would, on CPU even where a GPU exists (hidden), so every machine checks the same."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_smoke_run_writes_results_and_replaces_only_the_docs_block(tmp_path):
    pytest.importorskip("triton")
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"{BEFORE}<!-- kernels:begin -->\nstale text\n<!-- kernels:end -->{AFTER}", encoding="utf-8")
    real_docs = DOCS.read_bytes() if DOCS.exists() else None
    out = tmp_path / "out"

    result = bench("--smoke", "--out", str(out), "--write-docs", str(docs))

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (DOCS.read_bytes() if DOCS.exists() else None) == real_docs, "the smoke run touched docs/benchmarks.md"
    data = json.loads((out / "kernels.json").read_text(encoding="utf-8"))
    assert data["smoke"] is True and data["dtype"] == "float32" and data["device"]["copy_gbps"] > 0
    assert {"torch", "triton", "cuda"} <= data["versions"].keys()
    assert data["import_errors"] == {"flash_attention": None, "apply_rotary_triton": None}, data["import_errors"]

    attention = data["attention"]
    assert [(r["seq"], r["head_dim"], r["causal"], r["batch"], r["heads"]) for r in attention] == [
        (16, 16, False, 1, 2), (16, 16, True, 1, 2), (32, 16, False, 1, 2), (32, 16, True, 1, 2)]
    for row in attention:
        for impl in ("sdpa", "eager", "ours"):
            fields = row["impls"][impl]
            assert fields["status"] == "ok", (impl, fields["status"])
            assert all(fields[f"{p}_tflops"] > 0 for p in ("fwd", "bwd", "fwdbwd")), fields
        assert row["ratio_fwdbwd"] > 0
        assert row["max_abs_diff_out"] < 1e-2 and row["max_abs_diff_grad"] < 1e-2, row

    rotary = data["rotary"]
    assert [(r["head_dim"], r["rotary_pct"], r["seq"]) for r in rotary] == [
        (16, 0.25, 16), (16, 0.25, 32), (16, 1.0, 16), (16, 1.0, 32)]
    for row in rotary:
        for impl in ("ours", "eager"):
            fields = row["impls"][impl]
            assert fields["status"] == "ok" and fields["gbps"] > 0 and fields["called_gbps"] > 0, fields
        assert row["max_abs_diff_out"] < 1e-5 and row["max_abs_diff_grad"] < 1e-5, row
        assert all(row[key] > 0 for key in ("speedup", "speedup_called", "frac_peak", "frac_copy"))

    targets = {t["name"].split(" >=")[0].split(",")[0]: t for t in data["targets"]}
    assert len(data["targets"]) == 5
    assert all(t["status"] in {"PASS", "FAIL", "INFO"} for t in data["targets"][1:]), data["targets"]
    assert targets["attention fwd+bwd"]["status"] in {"PASS", "FAIL"}

    markdown = (out / "kernels.md").read_text(encoding="utf-8")
    assert markdown.startswith("**Smoke run") and "### Targets" in markdown
    assert sum(line.startswith("| ") for line in markdown.splitlines()) == 2 + 4 + 4  # two headers, the rows
    text = docs.read_text(encoding="utf-8")
    assert text == f"{BEFORE}<!-- kernels:begin -->\n{markdown.strip()}\n<!-- kernels:end -->{AFTER}"
    assert "Targets" in result.stdout and "wrote" in result.stdout.splitlines()[-1]


def test_without_a_gpu_and_without_smoke_it_says_so_in_one_line(tmp_path):
    result = bench("--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "bench_kernels: needs a CUDA GPU (use --smoke for a CPU dry run)"]
    assert not (tmp_path / "out").exists()
