"""The record run (scripts/record.py): its pieces, and its smoke mode end to end, resumed and refused."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, needs_shared

sys.path.insert(0, str(REPO / "scripts"))

import record_hf
import record_report


def test_hf_schedule_is_linear_warmup_then_linear_decay_over_the_budget():
    f = record_hf.linear_with_warmup
    assert f(0.0, 0.1) == 0.0 and f(0.05, 0.1) == pytest.approx(0.5) and f(0.1, 0.1) == pytest.approx(1.0)
    assert f(0.55, 0.1) == pytest.approx(0.5) and f(1.0, 0.1) == 0.0


@pytest.mark.parametrize("target", [1_705_217, 4_721_153, 3_000_000])
def test_hf_twin_has_our_parameter_count(target):
    from transformers import BertForMaskedLM

    arch = {"num_layers": 4, "hidden_size": 128, "num_heads": 2, "parameters": target}
    meta = {"vocab_size": 8192, "seq_length": 128, "special_ids": {"pad": 0}}
    config = record_hf.equal_parameters_config(arch, meta)
    with torch.device("meta"):
        count = sum(p.numel() for p in BertForMaskedLM(config).parameters())
    # one unit of intermediate size is 2 x 4 x 128 + 4 parameters: the nearest count is within half of that
    assert abs(count - target) <= (2 * 4 * 128 + 4) / 2 + 1
    assert config.hidden_size == 128 and config.num_hidden_layers == 4 and config.max_position_embeddings == 128


def test_hf_decay_groups_leave_biases_and_layernorm_undecayed():
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32))
    decayed, plain = record_hf.decay_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in plain["params"])
    assert not any(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in decayed["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(names)


def test_time_to_loss_interpolates_between_validations():
    points = [(0.0, 0, 9.0), (60.0, 100, 7.0), (120.0, 200, 6.0)]
    assert record_report.time_to(points, 6.5) == pytest.approx(90.0)
    assert record_report.time_to(points, 7.0) == pytest.approx(60.0)
    assert record_report.time_to(points, 5.0) is None  # never reached


def test_replace_between_fills_only_the_marked_block_and_refuses_a_page_without_one(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- record:start -->\nold\n<!-- record:end -->\nafter\n")
    record_report.replace_between(page, "record", "new table\n")
    assert page.read_text() == "intro\n<!-- record:start -->\nnew table\n<!-- record:end -->\nafter\n"
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- record:start -->"):
        record_report.replace_between(page, "record", "x")


def test_the_docs_carry_the_record_blocks_the_report_fills():
    for page in (REPO / "README.md", REPO / "docs" / "results.md"):
        text = page.read_text()
        assert "<!-- record:start -->" in text and "<!-- record:end -->" in text, page
    assert "docs/results.md" in (REPO / "scripts" / "quickstart.sh").read_text()


def run_record(out: Path, *extra) -> subprocess.CompletedProcess:
    glue = needs_shared("glue")
    return subprocess.run([sys.executable, str(REPO / "scripts" / "record.py"), "--smoke", "--out", str(out),
                           "--shared", str(glue.parent), "--tasks", "rte,stsb", *extra],
                          capture_output=True, text=True, timeout=900, cwd=REPO, check=False)


@pytest.mark.slow
def test_smoke_record_runs_end_to_end_resumes_and_refuses_other_settings(tmp_path):
    out = tmp_path / "record"
    first = run_record(out)
    assert first.returncode == 0, (first.stdout[-2000:], first.stderr[-2000:])
    state = json.loads((out / "state.json").read_text())
    assert all(state[s]["done"] for s in ("corpus", "prepare", "pretrain", "finetune", "report"))
    report = (out / "results.md").read_text()
    # every cell of the table is what eval.py's results.json holds for that model and task
    for task, title in (("rte", "RTE (acc)"), ("stsb", "STS-B (Pearson)")):
        ours = json.loads((out / "glue" / f"ours-{task}" / "results.json").read_text())["models"]
        hf = json.loads((out / "glue" / f"hf-{task}" / "results.json").read_text())["models"]
        cells = [m["tasks"][task]["summary"]["dev"]["median"] for m in (ours["pretrained"], hf["pretrained"],
                                                                          ours["random-init"])]
        row = next(line for line in report.splitlines() if line.startswith(f"| {title} |"))
        assert row.split(" | ")[1:4] == [f"{c:.1f}" for c in cells], row
    summary = json.loads((out / "ours" / "train_summary.json").read_text())
    assert f"{summary['val_loss']:.3f}" in report and (out / "loss_by_time.png").stat().st_size > 0
    hf_summary = json.loads((out / "hf" / "summary.json").read_text())
    # equal parameters, unless HF's fixed parts (position table, head transform) alone outgrow a model this tiny
    assert (abs(hf_summary["parameters"] - summary["parameters"]) / summary["parameters"] < 0.02
            or hf_summary["intermediate_size"] == 1)
    events = [json.loads(line) for line in (out / "ours" / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "validation" for e in events)  # the loss curve is measured, not drawn

    # an interrupted fine-tuning stage redoes only the jobs without a complete results.json
    (out / "glue" / "hf-rte" / "results.json").unlink()
    state["finetune"]["done"] = False
    (out / "state.json").write_text(json.dumps(state))
    again = run_record(out)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "fine-tuning: 1 eval.py jobs" in again.stdout and "pretraining ours" not in again.stdout

    other = run_record(out, "--tasks", "rte")
    assert other.returncode != 0 and "holds a record run with other settings (tasks=['rte', 'stsb'])" in other.stderr
