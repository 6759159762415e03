"""`python eval.py eval=zero-shot` and `eval=lm-eval` end to end on a two-step causal checkpoint and small files in
HellaSwag's format, and their bad input: one `error:` line, exit 2, no results.json and no CSV row."""

import functools
import json

import conftest
import pytest
from conftest import last_line_path, one_line_error
from test_zero_shot import HELLASWAG, needs_lm_eval, write_jsonl, write_tasks

run_eval = functools.partial(conftest.run_eval, "impl=cpu")


def assert_nothing_written(tmp_path):
    assert not (tmp_path / "eval" / "results.json").exists() and not (tmp_path / "results.csv").exists()


def test_zero_shot_end_to_end(causal_checkpoint, tmp_path):
    data, _ = write_tasks(tmp_path)
    result = run_eval("eval=zero-shot", f"checkpoint={causal_checkpoint}", f"eval.data_dir={data}",
                      "eval.tasks=[hellaswag,generic]", "eval.baseline=random-init", tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    for label in ("pretrained", "random-init"):
        model = results["models"][label]
        for task, items in (("hellaswag", len(HELLASWAG)), ("generic", 3)):
            final = model["tasks"][task]["runs"][0]["final"]["dev"]
            assert len(final["loglikelihoods"]) == items
            assert model["scores"][f"{task}/acc"] == final["acc"]
            assert model["scores"][f"{task}/acc_norm"] == final["acc_norm"]
            assert model["tasks"][task]["runs"][0]["curve"] == []  # nothing was trained
    assert results["models"]["pretrained"]["tasks"]["hellaswag"]["runs"][0]["final"]["dev"]["loglikelihoods"] != \
        results["models"]["random-init"]["tasks"]["hellaswag"]["runs"][0]["final"]["dev"]["loglikelihoods"]
    assert "| model | generic/acc | generic/acc_norm | hellaswag/acc | hellaswag/acc_norm | avg |" in result.stdout
    header, *rows = (tmp_path / "results.csv").read_text().splitlines()
    assert "hellaswag/acc_norm" in header and len(rows) == 2


@pytest.mark.parametrize("row, fragment", [
    ({k: v for k, v in HELLASWAG[0].items() if k != "endings"}, "hellaswag.jsonl:3: missing field(s) endings"),
    ({**HELLASWAG[0], "label": 4}, "hellaswag.jsonl:3: label 4 is not an index into its 4 endings"),
    ("{broken", "hellaswag.jsonl:3: not valid JSON"),
])
def test_bad_zero_shot_data_is_one_line_and_exit_2(causal_checkpoint, tmp_path, row, fragment):
    data = tmp_path / "data"
    write_jsonl(data / "hellaswag.jsonl", [HELLASWAG[1], HELLASWAG[2], row])
    result = run_eval("eval=zero-shot", f"checkpoint={causal_checkpoint}", f"eval.data_dir={data}", tmp_path=tmp_path,
                      in_process=True)
    one_line_error(result, fragment)
    assert_nothing_written(tmp_path)


def test_zero_shot_refusals_are_one_line(smoke_checkpoint, causal_checkpoint, tmp_path):
    data, _ = write_tasks(tmp_path)
    result = run_eval("eval=zero-shot", f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", tmp_path=tmp_path,
                      in_process=True)
    one_line_error(result, "no causal LM head", "eval=glue")  # an MLM checkpoint
    result = run_eval("eval=zero-shot", f"checkpoint={causal_checkpoint}", f"eval.data_dir={data}", "eval.seeds=3",
                      tmp_path=tmp_path, in_process=True)
    one_line_error(result, "eval.seeds=3", "deterministic")
    result = run_eval("eval=zero-shot", f"checkpoint={causal_checkpoint}", f"eval.data_dir={data}",
                      "eval.tasks=[piqa]", tmp_path=tmp_path, in_process=True)
    one_line_error(result, "piqa.jsonl does not exist")
    assert_nothing_written(tmp_path)


def test_lm_eval_end_to_end_offline(causal_checkpoint, tmp_path):
    """A local YAML task over local files: lm-eval runs offline, and its scores land in our results and table,
    equal to the built-in scorer's on the same file."""
    needs_lm_eval()
    data, yamls = write_tasks(tmp_path)
    result = run_eval("eval=lm-eval", f"checkpoint={causal_checkpoint}", "eval.tasks=[zs_hellaswag]",
                      f"eval.lm_eval.include_path={yamls}", "eval.lm_eval.batch_size=4", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads(last_line_path(result, "results: ").read_text())["models"]["pretrained"]["scores"]
    assert set(scores) == {"zs_hellaswag/acc", "zs_hellaswag/acc_norm"}
    assert "| model | zs_hellaswag/acc | zs_hellaswag/acc_norm | avg |" in result.stdout
    builtin = run_eval("eval=zero-shot", f"checkpoint={causal_checkpoint}", f"eval.data_dir={data}",
                       tmp_path=tmp_path / "builtin", in_process=True)
    assert builtin.returncode == 0, builtin.stderr[-3000:]
    ours = json.loads(last_line_path(builtin, "results: ").read_text())["models"]["pretrained"]["scores"]
    assert ours == pytest.approx({k.replace("zs_", ""): v for k, v in scores.items()})
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 2


def test_lm_eval_refusals_are_one_line(causal_checkpoint, tmp_path):
    needs_lm_eval()
    _, yamls = write_tasks(tmp_path)
    result = run_eval("eval=lm-eval", f"checkpoint={causal_checkpoint}", "eval.tasks=[no_such_task]",
                      f"eval.lm_eval.include_path={yamls}", tmp_path=tmp_path, in_process=True)
    one_line_error(result, "lm-eval knows no task 'no_such_task'")
    (tmp_path / "data" / "hellaswag.jsonl").unlink()
    result = run_eval("eval=lm-eval", f"checkpoint={causal_checkpoint}", "eval.tasks=[zs_hellaswag]",
                      f"eval.lm_eval.include_path={yamls}", tmp_path=tmp_path, in_process=True)
    one_line_error(result, "lm-eval task 'zs_hellaswag': its data could not be loaded")
    assert_nothing_written(tmp_path)
