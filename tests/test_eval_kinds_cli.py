"""Every benchmark `eval.kind` names, end to end through `python eval.py` (in this process) on tiny data in its own
format: one row per kind, and a kind registered without a row fails. Each run keeps the contract every benchmark
shares: results.json complete, each trained task scored by each seed on each of its dev splits with its median,
the printed table the one results.json's scores make (the benchmark's columns, in order), one CSV row with those
scores, the model card's new entry, and `results:` last. What a kind does beyond that (RACE's levels, SQuAD's
answers, NER's unseen words, SuperGLUE's diagnostics) is tested in its own file."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import glue_folder, last_line_path, run_eval
from test_ner_cli import SENTENCES, conll
from test_squad_cli import write_squad
from test_superglue_cli import FIXTURES as SUPERGLUE
from test_swag_race import write_race, write_swag
from test_zero_shot import write_tasks

from cramming.eval.kinds import BENCHMARKS
from cramming.eval.results import markdown_table

pytestmark = pytest.mark.slow
FAST = ["impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=8", "eval.recipe.max_length=64"]
TWO_SEEDS = ["eval.seeds=2"]  # the fine-tuned kinds: a median over seeds; the scored ones are deterministic


def rte(root: Path) -> list[str]:
    return [f"eval.data_dir={glue_folder(root, train=24, dev=8)}", "eval.tasks=[rte]", *TWO_SEEDS]


def custom(root: Path) -> list[str]:
    rows = ["text,label"] + [f"{'a fine film' if i % 2 else 'a dull film'} {i},{i % 2}" for i in range(24)]
    (root / "reviews.csv").write_text("\n".join(rows) + "\n")
    return [f"eval.train_file={root / 'reviews.csv'}", f"eval.dev_file={root / 'reviews.csv'}", *TWO_SEEDS]


def ner(root: Path) -> list[str]:
    (root / "conll").mkdir()
    (root / "conll" / "train.txt").write_text(conll(SENTENCES * 2))
    (root / "conll" / "valid.txt").write_text(conll(SENTENCES))
    return [f"eval.data_dir={root / 'conll'}", *TWO_SEEDS]


def lm_eval(root: Path) -> list[str]:
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm-evaluation-harness is not installed (pip install -e '.[lm-eval]')")
    return [f"eval.lm_eval.include_path={write_tasks(root)[1]}", "eval.tasks=[zs_hellaswag]"]


# kind -> (the checkpoint fixture it scores, its data as overrides, the tasks it trains)
ROWS = {
    "glue": ("smoke_checkpoint", rte, ["rte"]),
    "superglue": ("smoke_checkpoint", lambda root: [f"eval.data_dir={SUPERGLUE}", "eval.tasks=[boolq,rte,axb]",
                                    *TWO_SEEDS],
                  ["boolq", "rte"]),
    "custom": ("smoke_checkpoint", custom, ["custom"]),
    "ner": ("smoke_checkpoint", ner, ["conll2003"]),
    "swag": ("smoke_checkpoint", lambda root: [f"eval.data_dir={write_swag(root / 'swag')}", *TWO_SEEDS], ["swag"]),
    "race": ("smoke_checkpoint", lambda root: [f"eval.data_dir={write_race(root / 'race', articles=1)}",
                                               "eval.recipe.max_length=128", *TWO_SEEDS], ["race"]),
    "squad": ("smoke_checkpoint", lambda root: [f"eval.data_dir={write_squad(root / 'squad', 'v1.1', n=6)}",
                                                "eval.tasks=[squad]", "eval.squad.doc_stride=16",
                                                "eval.squad.max_query_length=16", *TWO_SEEDS], ["squad"]),
    "zero-shot": ("causal_checkpoint", lambda root: [f"eval.data_dir={write_tasks(root)[0]}",
                                                     "eval.tasks=[hellaswag]"], ["hellaswag"]),
    "lm-eval": ("causal_checkpoint", lm_eval, ["zs_hellaswag"]),
}


def test_every_benchmark_has_a_row():
    assert set(ROWS) == set(BENCHMARKS), "a benchmark without an end-to-end row here (or a row for none)"


@pytest.mark.parametrize("kind", list(ROWS))
def test_every_benchmark_runs_end_to_end_and_reports_alike(kind, request, tmp_path):
    fixture, data, trained = ROWS[kind]
    checkpoint = request.getfixturevalue(fixture)
    cards_before = len(json.loads((checkpoint / "eval_results.json").read_text())) \
        if (checkpoint / "eval_results.json").is_file() else 0
    result = run_eval(f"eval={kind}", f"checkpoint={checkpoint}", *FAST, *data(tmp_path), tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    assert results["complete"] is True and results["settings"]["eval"]["kind"] == kind
    model = results["models"]["pretrained"]
    assert list(model["tasks"]) == trained
    seeds = results["settings"]["eval"]["seeds"]
    for name, task in model["tasks"].items():
        assert len(task["runs"]) == seeds, name
        for split, stats in task["summary"].items():
            per_seed = [run["final"][split][task["main_metric"]] for run in task["runs"]]
            assert stats["values"] == per_seed and stats["min"] <= stats["median"] <= stats["max"], (name, split)
    benchmark = BENCHMARKS[kind]
    summary = model.get(benchmark.summary_key)
    row = {**model["scores"], **({"average": summary["average"]} if summary else {})}
    assert markdown_table({"pretrained": row}, benchmark.columns) in result.stdout
    with open(tmp_path / "results.csv", newline="") as f:
        (line,) = csv.DictReader(f)
    assert line["model"] == "pretrained" and line["results"] == str(last_line_path(result, "results: "))
    assert {k: float(line[k]) for k in model["scores"]} == {k: round(v, 2) for k, v in model["scores"].items()}
    entries = json.loads((checkpoint / "eval_results.json").read_text())
    assert len(entries) > cards_before and any(e["kind"] == kind and e["scores"] == row for e in entries)
