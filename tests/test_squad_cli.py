"""`python eval.py eval=squad` end to end on tiny SQuAD v1.1 and v2.0 files in the official JSON layout, written
here, with a two-step checkpoint (MLM, and a causal one); and a misplaced answer: one `error:` line, exit 2, no
results.json, no CSV row."""

import functools
import json
import random

import conftest
import pytest
from conftest import last_line_path, one_line_error

FAST = ["impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=4", "eval.recipe.max_length=64",
        "eval.squad.doc_stride=16", "eval.squad.max_query_length=16"]
run_eval = functools.partial(conftest.run_eval, "eval=squad")
WORDS = ["river", "mountain", "city", "king", "queen", "north", "south", "bridge", "tower", "garden", "market", "winter", "summer", "lake"]


def paragraph(rng, k: int, impossible: bool) -> dict:
    """A context of ~80 words (longer than one 64-token window) with the answer somewhere inside."""
    words = [rng.choice(WORDS) for _ in range(80)]
    at = rng.randrange(5, 75)
    words[at:at + 2] = ["Saint", f"Name{k}"]
    context = " ".join(words) + " ."
    qas = [{"id": f"q{k}", "question": f"Which saint is near the {words[at + 3]} ?", "answers": []}]
    if impossible:
        qas[0]["is_impossible"] = True
        qas[0]["question"] = f"Which saint lives under the {rng.choice(WORDS)} ?"
    else:
        answer = f"Saint Name{k}"
        qas[0]["answers"] = [{"text": answer, "answer_start": context.index(answer)}]
    return {"context": context, "qas": qas}


def write_squad(folder, version: str, n: int = 12, seed: int = 0):
    rng = random.Random(seed)
    folder.mkdir(exist_ok=True)
    for split in ("train", "dev"):
        paragraphs = [paragraph(rng, k, version == "v2.0" and k % 3 == 0) for k in range(n)]
        document = {"version": version.removeprefix("v"), "data": [{"title": split, "paragraphs": paragraphs}]}
        (folder / f"{split}-{version}.json").write_text(json.dumps(document, indent=1))
    return folder


def test_squad_v11_and_v20_end_to_end(smoke_checkpoint, tmp_path):
    data = write_squad(write_squad(tmp_path / "squad", "v1.1"), "v2.0")
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", "eval.tasks=[squad,squad_v2]", *FAST,
                      tmp_path=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    path = last_line_path(result, "results: ")
    model = json.loads(path.read_text())["models"]["pretrained"]
    v1, v2 = (model["tasks"][t]["runs"][0] for t in ("squad", "squad_v2"))
    assert set(v1["final"]["dev"]) == {"exact", "f1"}
    assert set(v2["final"]["dev"]) == {"exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"}
    assert v1["train_windows"] > 12  # every 80-word context needs more than one 64-token window
    for task, run in (("squad", v1), ("squad_v2", v2)):
        assert model["scores"][task] == pytest.approx(run["final"]["dev"]["f1"])
        assert run["predictions_files"] == {"dev": f"predictions-{task}-seed0.json"}
        predictions = json.loads((path.parent / f"predictions-{task}-seed0.json").read_text())
        assert set(predictions) == {f"q{k}" for k in range(12)}
        assert all(isinstance(text, str) for text in predictions.values())
        assert "predictions" not in run
    assert "| model | SQuAD1.1 | SQuAD2.0 | avg |" in result.stdout  # the CSV row: test_eval_kinds_cli


def test_a_causal_checkpoint_fine_tunes_on_squad(causal_checkpoint, tmp_path):
    data = write_squad(tmp_path / "squad", "v2.0", n=6)
    result = run_eval(f"checkpoint={causal_checkpoint}", f"eval.data_dir={data}",
                      "eval.tasks=[squad_v2]", *FAST, tmp_path=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (last_line_path(result, "results: ").parent / "predictions-squad_v2-seed0.json").is_file()


def test_a_misplaced_answer_is_one_line_exit_2_and_leaves_no_results(smoke_checkpoint, tmp_path):
    data = write_squad(tmp_path / "squad", "v1.1")
    path = data / "dev-v1.1.json"
    document = json.loads(path.read_text())
    document["data"][0]["paragraphs"][4]["qas"][0]["answers"][0]["answer_start"] += 1
    path.write_text(json.dumps(document, indent=1))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"q4"' in text)
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", *FAST, tmp_path=tmp_path,
                      in_process=True)
    one_line_error(result, f"{path} line {line}: data[0].paragraphs[4].qas[0] (question id q4) answers[0]",
                   "answer 'Saint Name4' is not at answer_start")
    assert not (tmp_path / "eval" / "results.json").exists() and not (tmp_path / "results.csv").exists()
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data}", *FAST, "eval.squad.doc_stride=44",
                      tmp_path=tmp_path, in_process=True)
    one_line_error(result, "eval.squad.doc_stride=44", "must be below max_length - max_query_length - 4 = 44")
