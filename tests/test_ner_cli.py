"""`python eval.py eval=ner` end to end on small CoNLL-2003 files (the original four columns, IOB1) with a two-step
checkpoint, MLM and causal, and its bad input: one `error:` line naming file and line, exit 2, no results."""

import csv
import functools
import json
import statistics

import conftest
import pytest
from conftest import last_line_path, one_line_error

FAST = ["impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=4", "eval.recipe.max_length=16"]
run_eval = functools.partial(conftest.run_eval, "eval=ner", *FAST)
SENTENCES = [  # (word, POS, chunk, IOB1 tag)
    [("EU", "NNP", "B-NP", "I-ORG"), ("rejects", "VBZ", "B-VP", "O"), ("German", "JJ", "B-NP", "I-MISC"),
     ("call", "NN", "I-NP", "O"), (".", ".", "O", "O")],
    [("Peter", "NNP", "B-NP", "I-PER"), ("Blackburn", "NNP", "I-NP", "I-PER")],
    [("BRUSSELS", "NNP", "B-NP", "I-LOC"), ("1996-08-22", "CD", "I-NP", "O")],
    [("Germany", "NNP", "B-NP", "I-LOC"), ("'s", "POS", "B-NP", "O"), ("representative", "NN", "I-NP", "O"),
     ("Werner", "NNP", "I-NP", "I-PER"), ("Zwingmann", "NNP", "I-NP", "I-PER"), ("said", "VBD", "B-VP", "O")],
    [("Spanish", "JJ", "B-NP", "I-MISC"), ("Farm", "NNP", "I-NP", "I-ORG"), ("Minister", "NNP", "I-NP", "O"),
     ("Loyola", "NNP", "I-NP", "I-PER"), ("de", "NNP", "I-NP", "I-PER"), ("Palacio", "NNP", "I-NP", "I-PER")],
]
LONG = [(w, "NN", "I-NP", "O") for w in ("the european commission said on thursday it disagreed with german advice "
                                          "to consumers to shun british lamb until scientists determine").split()]


def conll(sentences) -> str:
    """A CoNLL-2003 file: -DOCSTART-, then one sentence per block."""
    blocks = ["\n".join(" ".join(row) for row in sentence) for sentence in sentences]
    return "-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks) + "\n"


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "conll"
    folder.mkdir()
    (folder / "train.txt").write_text(conll(SENTENCES * 3), encoding="utf-8")
    (folder / "valid.txt").write_text(conll([*SENTENCES, LONG, [("€", "SYM", "O", "O"), ("5", "CD", "I-NP", "O")]]),
                                      encoding="utf-8")
    return folder


def test_ner_end_to_end(smoke_checkpoint, data_dir, tmp_path):
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data_dir}", "eval.seeds=2",
                      "eval.baseline=random-init", tmp_path=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    task = results["models"]["pretrained"]["tasks"]["conll2003"]
    assert task["main_metric"] == "f1" and task["recipe"]["lr"] == 5e-5 and task["recipe"]["epochs"] == 1
    finals = [run["final"]["dev"] for run in task["runs"]]
    for final in finals:
        p, r = final["precision"], final["recall"]
        assert final["f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)
        assert {"f1_PER", "f1_LOC", "f1_ORG", "f1_MISC"} <= set(final)
    # max_length 16 cuts the long dev sentence; "€" has no piece at all (non-ASCII is dropped): both count as unseen
    assert all(run["unseen_words"]["dev"] >= len(LONG) - 14 + 1 for run in task["runs"])
    assert results["models"]["pretrained"]["scores"]["conll2003"] == pytest.approx(statistics.median(
        f["f1"] for f in finals))
    assert set(results["models"]) == {"pretrained", "random-init"}
    assert "| model | CoNLL-2003 | avg |" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [row["model"] for row in rows] == ["pretrained", "random-init"]
    assert float(rows[0]["conll2003"]) == pytest.approx(results["models"]["pretrained"]["scores"]["conll2003"], abs=0.01)


@pytest.mark.parametrize("mangle, fragments", [
    (lambda d: (d / "valid.txt").write_text(conll(SENTENCES).replace("Blackburn NNP I-NP I-PER", "Blackburn I-PER")),
     ["valid.txt line 10: 2 columns, expected 4 (as on line 3"]),
    (lambda d: (d / "valid.txt").write_text(conll(SENTENCES).replace("BRUSSELS NNP B-NP I-LOC", "BRUSSELS NNP B-NP I-GPE")),
     ["valid.txt line 12: tag 'I-GPE': its type 'GPE' does not occur in the train data"]),
    (lambda d: (d / "valid.txt").unlink(), ["conll2003: no dev file in", "valid.txt, dev.txt, eng.testa"]),
])
def test_bad_conll_input_is_one_line_exit_2_and_no_results(smoke_checkpoint, data_dir, tmp_path, mangle, fragments):
    mangle(data_dir)
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={data_dir}", tmp_path=tmp_path, in_process=True)
    one_line_error(result, *fragments)
    assert not (tmp_path / "eval" / "results.json").exists() and not (tmp_path / "results.csv").exists()


def test_a_causal_checkpoint_tags_words_too(causal_checkpoint, data_dir, tmp_path):
    """A GPT-style checkpoint loads as a token classifier (each first piece sees its left context) and is scored."""
    assert json.loads((causal_checkpoint / "config.json").read_text())["objective"] == "clm"
    result = run_eval(f"checkpoint={causal_checkpoint}", f"eval.data_dir={data_dir}", tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    final = results["models"]["pretrained"]["tasks"]["conll2003"]["runs"][0]["final"]["dev"]
    assert 0.0 <= final["f1"] <= 100.0 and results["models"]["pretrained"]["scores"]["conll2003"] == final["f1"]
