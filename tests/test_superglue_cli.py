"""`python eval.py eval=superglue` end to end on the fixtures (tests/fixtures/superglue, the original layout) with a
two-step checkpoint, and its bad input: one `error:` line, exit 2, before any training."""

import functools
import json
import shutil
import statistics
from pathlib import Path

import conftest
import pytest
import torch
from conftest import last_line_path, one_line_error
from safetensors.torch import load_file

from cramming.eval.span_head import build_span_model
from cramming.eval.superglue_metrics import DIAGNOSTICS, SUPERGLUE_SET

FIXTURES = Path(__file__).parent / "fixtures" / "superglue"
FAST = ["impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=4", "eval.recipe.max_length=64"]
run_eval = functools.partial(conftest.run_eval, "eval=superglue")
METRICS = {"boolq": {"accuracy"}, "cb": {"accuracy", "f1_macro"}, "copa": {"accuracy"},
           "multirc": {"f1a", "exact_match"}, "record": {"f1", "exact_match"}, "rte": {"accuracy"},
           "wic": {"accuracy"}, "wsc": {"accuracy"}}


def test_superglue_end_to_end(smoke_checkpoint, tmp_path):
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={FIXTURES}", *FAST, tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    model = results["models"]["pretrained"]
    assert set(model["tasks"]) == set(SUPERGLUE_SET)  # the diagnostics are not fine-tuned: RTE's model predicts them
    assert set(model["scores"]) == set(SUPERGLUE_SET) | set(DIAGNOSTICS)
    for task, metrics in METRICS.items():
        final = model["tasks"][task]["runs"][0]["final"]
        assert set(final["dev"]) == metrics | {"score"}, task
        assert model["scores"][task] == pytest.approx(final["dev"]["score"])
    rte = model["tasks"]["rte"]["runs"][0]["final"]
    assert set(rte["axb"]) == {"matthews", "score"} and set(rte["axg"]) == {"accuracy", "gender_parity", "score"}
    cb = model["tasks"]["cb"]["runs"][0]["final"]["dev"]
    assert cb["score"] == pytest.approx((cb["accuracy"] + cb["f1_macro"]) / 2)
    summary = model["superglue"]
    assert summary["average"] == pytest.approx(statistics.mean(model["scores"][t] for t in SUPERGLUE_SET))
    assert summary["diagnostics"] == {d: model["scores"][d] for d in DIAGNOSTICS}
    assert "glue" not in model and results["comparable"] is True
    assert "| model | BoolQ | CB | COPA | MultiRC | ReCoRD | RTE | WiC | WSC | AX-b | AX-g | avg |" in result.stdout
    assert f"{summary['average']:.1f} |" in result.stdout
    assert "average,results" in (tmp_path / "results.csv").read_text().splitlines()[0]


def test_bad_superglue_input_is_one_line_and_exit_2(smoke_checkpoint, tmp_path):
    data = Path(shutil.copytree(FIXTURES, tmp_path / "superglue"))
    shutil.rmtree(data / "WSC")
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", *FAST, tmp_path=tmp_path, in_process=True)
    one_line_error(result, "wsc: missing task folder", "WSC")
    shutil.copytree(FIXTURES / "WSC", data / "WSC")
    (data / "AX-b" / "AX-b.jsonl").unlink()
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", *FAST, tmp_path=tmp_path, in_process=True)
    one_line_error(result, "axb: missing", "AX-b.jsonl")
    shutil.copytree(FIXTURES / "AX-b", data / "AX-b", dirs_exist_ok=True)
    with open(data / "COPA" / "train.jsonl", "a") as f:
        f.write('{"premise": "x", "choice1": "a", "choice2": "b", "question": "why", "idx": 9, "label": 0}\n')
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", *FAST, tmp_path=tmp_path, in_process=True)
    one_line_error(result, "COPA/train.jsonl line 5", "question 'why' is not one of cause, effect")
    assert not list(tmp_path.glob("eval/results.json"))


def test_the_span_head_starts_from_the_pretrained_encoder(smoke_checkpoint):
    weights = load_file(smoke_checkpoint / "model.safetensors")["encoder.tokens.weight"]
    pretrained = build_span_model(str(smoke_checkpoint), dropout=0.1, random_init=False)
    assert torch.equal(pretrained.encoder.tokens.weight, weights)
    untrained = build_span_model(str(smoke_checkpoint), dropout=0.1, random_init=True)
    assert not torch.equal(untrained.encoder.tokens.weight, weights)
    assert pretrained.encoder.config.hidden_dropout == 0.1  # fine-tuning turns dropout on, as for the classifier
