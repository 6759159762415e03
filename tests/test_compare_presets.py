"""The presets' comparison (scripts/compare_presets.py): its smoke mode end to end, with RTE and without GLUE."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, needs_shared

pytestmark = [pytest.mark.slow, pytest.mark.tooling]  # whole pretraining and eval.py runs, as test_record's smoke

sys.path.insert(0, str(REPO / "scripts"))

import compare_presets


def run(out: Path, shared: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "compare_presets.py"), "--smoke", "--out", str(out),
                           "--shared", str(shared), *extra],
                          capture_output=True, text=True, timeout=900, cwd=REPO, check=False)


def rows(report: str) -> dict[str, list[str]]:
    table = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| preset")]
    return {cells[0].strip("* "): cells for cells in (line.strip("|").split(" | ") for line in table)}


def test_smoke_comparison_has_a_row_of_numbers_per_preset_taken_from_the_runs(tmp_path):
    out = tmp_path / "presets"
    done = run(out, needs_shared("glue").parent)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = (out / "presets.md").read_text()
    table = rows(report)
    assert set(table) == {"crammed-bert-tiny", "modernbert-tiny", "crammed-bert-tiny (again)", "bert-tiny",
                          "gpt-tiny", "llama-tiny"}, report
    for name, (preset, _, ref) in compare_presets.RUNS.items():
        summary = json.loads((out / "runs" / name / "train_summary.json").read_text())
        row = table[preset if name == preset else f"{preset} (again)"]
        assert row[4] == f"{summary['steps']:,}" and row[7] == f"{summary['val_loss']:.3f}", row
        assert summary["steps"] > 0 and summary["tokens"] > 0
        if name in compare_presets.FINETUNED:
            results = json.loads((out / "rte" / name / "results.json").read_text())
            median = results["models"]["pretrained"]["tasks"]["rte"]["summary"]["dev"]["median"]
            assert row[9].startswith(f"{median:.1f} ("), row
        if ref:
            base = json.loads((out / "runs" / ref / "train_summary.json").read_text())
            delta = f"{summary['val_loss'] - base['val_loss']:+.3f}".replace("-", "−")
            assert row[8] == delta, row
    # one prepared token set for every run: a single data cache
    assert len([p for p in (out / "cache").iterdir() if p.is_dir()]) == 1
    assert "Command: `python scripts/compare_presets.py --smoke" in report


def test_without_glue_or_prose_it_pretrains_on_python_docs_and_says_why_rte_is_skipped(tmp_path):
    out = tmp_path / "presets"
    done = run(out, tmp_path / "no-shared")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = (out / "presets.md").read_text()
    assert "RTE not fine-tuned: no GLUE data" in report
    assert all(row[9] == "—" for row in rows(report).values())
    assert json.loads((out / "state.json").read_text())["corpus"]["prose_files"] == 0
