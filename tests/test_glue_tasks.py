"""GLUE task loading from the original glue_data/ layout, the hub's offline error, and the custom task."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import needs_shared

from cramming import hub
from cramming.errors import UserError
from cramming.eval import tasks
from cramming.eval.custom import load_custom_task
from cramming.eval.tasks import GLUE_TASKS, load_task

FIXTURES = Path(__file__).parent / "fixtures" / "glue_data"


def read_task_file(name, path):
    """The labelled examples of one TSV of a task (a dev file whose train file is absent: load_task refuses it)."""
    return tasks._read_tsv(GLUE_TASKS[name], path)[0]


def counts(examples):
    return dict(Counter(e.label for e in examples))


def test_registry_lists_all_nine_tasks():
    assert sorted(GLUE_TASKS) == sorted(["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"])
    with pytest.raises(UserError, match="unknown GLUE task 'glu'.*cola"):
        load_task("glu", str(FIXTURES))


# ---------------------------------------------------------------- real files (shared data), counts from SOURCE.md

# task -> (train rows, dev rows, train label counts, dev label counts); label index in the hub's order
REAL = {
    "cola": (8551, 1043, {1: 6023, 0: 2528}, {1: 721, 0: 322}),
    "sst2": (67349, 872, {1: 37569, 0: 29780}, {1: 444, 0: 428}),
    "rte": (2490, 277, {0: 1249, 1: 1241}, {0: 146, 1: 131}),  # entailment=0
    "wnli": (635, 71, {1: 312, 0: 323}, {0: 40, 1: 31}),  # 1 = entailment, as on the hub
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_classification_tasks(name):
    glue = needs_shared("glue")
    n_train, n_dev, train_counts, dev_counts = REAL[name]
    task = load_task(name, str(glue))
    assert (len(task.train), len(task.dev["dev"])) == (n_train, n_dev)
    assert counts(task.train) == train_counts and counts(task.dev["dev"]) == dev_counts
    assert task.source == str(glue / GLUE_TASKS[name].folder)
    assert all(e.text_a and e.text_a == e.text_a.strip() for e in task.train)
    assert all((e.text_b is None) == (name in ("cola", "sst2")) for e in task.train)


def test_real_task_specifics():
    glue = needs_shared("glue")
    cola = load_task("cola", str(glue))  # headerless; dev.tsv has no final newline
    assert (cola.label_names, cola.metric_names, cola.main_metric) == (["unacceptable", "acceptable"], ["matthews"], "matthews")
    assert cola.dev["dev"][-1].text_a.endswith(".")
    sst2 = load_task("sst2", str(glue))  # trailing space before the tab is stripped
    assert sst2.train[0].text_a == "hide new secretions from the parental units"
    rte = load_task("rte", str(glue))
    assert rte.label_names == ["entailment", "not_entailment"] and rte.train[0].label == 1  # not_entailment


def test_real_stsb_regression():
    glue = needs_shared("glue")
    task = load_task("stsb", str(glue))
    assert (len(task.train), len(task.dev["dev"])) == (5749, 1500)
    assert task.label_names is None and task.metric_names == ["pearson", "spearman"] and task.main_metric == "pearson"
    assert task.train[0].label == 5.0 and task.train[1].label == 3.8
    assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in task.train + task.dev["dev"])


def test_real_qnli_dev_only_and_missing_train():
    glue = needs_shared("glue")
    dev = read_task_file("qnli", glue / "QNLI" / "dev.tsv")
    assert len(dev) == 5463 and counts(dev) == {0: 2702, 1: 2761}  # entailment=0, not_entailment=1
    with pytest.raises(UserError, match=r"^qnli: missing .*QNLI/train\.tsv; ") as err:
        load_task("qnli", str(glue))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- fixtures for tasks not in the shared data


def test_mrpc_with_bom():
    assert (FIXTURES / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")
    task = load_task("mrpc", str(FIXTURES))
    assert (len(task.train), len(task.dev["dev"])) == (5, 3)
    assert [e.label for e in task.train] == [1, 0, 1, 0, 1]
    assert task.train[0].text_a == 'The minister called the plan " a first step " , aides said .'
    assert (task.metric_names, task.main_metric) == (["accuracy", "f1"], "f1")
    assert task.label_names == ["not_equivalent", "equivalent"]


def test_qqp_skips_and_counts_malformed_rows():
    task = load_task("qqp", str(FIXTURES))
    assert (len(task.train), len(task.dev["dev"])) == (4, 2)  # 5 train rows, one with a missing field
    assert "skipped 1 malformed row" in task.source
    assert task.train[1].text_a == 'How do I control my "horny" emotions?' and task.train[1].label == 1
    assert (task.metric_names, task.main_metric) == (["accuracy", "f1"], "f1")


def test_mnli_matched_and_mismatched_use_gold_label():
    task = load_task("mnli", str(FIXTURES))
    assert set(task.dev) == {"matched", "mismatched"}
    assert task.label_names == ["entailment", "neutral", "contradiction"]
    assert [e.label for e in task.train] == [1, 0, 2, 0]
    # the last matched row has label1=neutral but gold_label=entailment; mismatched has no final newline
    assert [e.label for e in task.dev["matched"]] == [1, 2, 0]
    assert [e.label for e in task.dev["mismatched"]] == [2, 0]
    assert task.dev["matched"][2].text_a == "The boy ran home quickly." and task.dev["matched"][2].text_b == "The boy went home."


def test_columns_found_by_header_name(tmp_path):
    (tmp_path / "RTE").mkdir()
    rows = "label\tsentence2\tindex\tsentence1\nentailment\tA cat sat.\t0\tA cat sat on a mat.\n"
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / "RTE" / name).write_text(rows + "not_entailment\tNo cat.\t1\tA cat sat.")
    task = load_task("rte", str(tmp_path))
    assert [(e.text_a, e.text_b, e.label) for e in task.dev["dev"]] == [("A cat sat on a mat.", "A cat sat.", 0), ("A cat sat.", "No cat.", 1)]


# ---------------------------------------------------------------- errors


def _rte_folder(tmp_path, dev_text):
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n")
    (folder / "dev.tsv").write_text(dev_text)
    return folder


def one_line_error(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_malformed_row_names_file_and_line(tmp_path):
    folder = _rte_folder(tmp_path, "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n1\tA \"quoted\" one.\tentailment\n")
    message = one_line_error(lambda: load_task("rte", str(tmp_path)))
    assert f"{folder / 'dev.tsv'} line 3: malformed row (3 fields, expected 4)" in message


def test_empty_text_and_bad_score(tmp_path):
    _rte_folder(tmp_path, "index\tsentence1\tsentence2\tlabel\n0\t  \tB.\tentailment\n")
    assert "dev.tsv line 2: malformed row (empty text in column 'sentence1')" in one_line_error(lambda: load_task("rte", str(tmp_path)))
    stsb = tmp_path / "STS-B"
    stsb.mkdir()
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    (stsb / "train.tsv").write_text(header + "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t4.0\n")
    (stsb / "dev.tsv").write_text(header + "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t4.0\n1\tg\tf\ty\t0\tn\tn\tA.\tB.\tfour\n")
    assert "dev.tsv line 3: malformed row (score 'four' is not a number)" in one_line_error(lambda: load_task("stsb", str(tmp_path)))


def test_bad_label_names_file_line_label_and_choices(tmp_path):
    _rte_folder(tmp_path, "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tneutral\n")
    message = one_line_error(lambda: load_task("rte", str(tmp_path)))
    assert "dev.tsv line 2: label 'neutral' is not one of entailment, not_entailment" in message


def test_missing_folder_file_and_column(tmp_path):
    message = one_line_error(lambda: load_task("wnli", str(tmp_path)))
    assert f"missing task folder {tmp_path / 'WNLI'}" in message
    (tmp_path / "MNLI").mkdir()
    for name in ("train.tsv", "dev_matched.tsv"):
        shutil.copy(FIXTURES / "MNLI" / name, tmp_path / "MNLI" / name)
    assert f"missing {tmp_path / 'MNLI' / 'dev_mismatched.tsv'}" in one_line_error(lambda: load_task("mnli", str(tmp_path)))
    _rte_folder(tmp_path, "index\tsentence1\tsentence2\n0\tA.\tB.\n")  # a test file given as dev
    assert "header lacks column(s) 'label'" in one_line_error(lambda: load_task("rte", str(tmp_path)))


def test_hub_offline_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached copy to fall back on
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    message = one_line_error(lambda: load_task("rte", None))
    assert "'nyu-mll/glue' is unreachable" in message and "eval.data_dir=<glue_data folder>" in message


# ---------------------------------------------------------------- custom task


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_custom_csv_two_fields_binary_classification(tmp_path):
    train = write(tmp_path / "train.csv", 'premise,hypothesis,label\n"A, quoted ""premise""",B,yes\nC,D,no\nE,F,yes\n')
    dev = write(tmp_path / "dev.csv", "premise,hypothesis,label\nG,H,no\n")
    task = load_custom_task(train, dev, ["premise", "hypothesis"], "label")
    assert task.name == "custom" and task.label_names == ["no", "yes"]
    assert task.train[0].text_a == 'A, quoted "premise"' and task.train[0].text_b == "B" and task.train[0].label == 1
    assert task.dev == {"dev": [type(task.train[0])("G", "H", 0)]}
    assert (task.metric_names, task.main_metric) == (["accuracy", "f1", "matthews"], "accuracy")


def test_custom_tsv_one_field_multiclass_keeps_integer_order(tmp_path):
    rows = "text\tlabel\nsays \"hi\"\t2\nb\t10\nc\t1\n"
    task = load_custom_task(write(tmp_path / "t.tsv", rows), write(tmp_path / "d.tsv", "text\tlabel\nd\t10\n"), ["text"], "label")
    assert task.label_names == ["1", "2", "10"]  # whole numbers sort numerically
    assert [(e.text_a, e.text_b, e.label) for e in task.train] == [('says "hi"', None, 1), ("b", None, 2), ("c", None, 0)]
    assert task.dev["dev"][0].label == 2 and task.metric_names == ["accuracy", "matthews"]


def test_custom_jsonl_regression_inferred_and_overridden(tmp_path):
    train = write(tmp_path / "t.jsonl", "\n".join(json.dumps({"a": f"s{i}", "y": y}) for i, y in enumerate([0.5, 1, 2.25])) + "\n")
    dev = write(tmp_path / "d.jsonl", json.dumps({"a": "x", "y": "3.5"}) + "\n\n")
    task = load_custom_task(train, dev, ["a"], "y")
    assert task.label_names is None and [e.label for e in task.train] == [0.5, 1.0, 2.25] and task.dev["dev"][0].label == 3.5
    assert (task.metric_names, task.main_metric) == (["pearson", "spearman"], "pearson")
    whole = write(tmp_path / "w.jsonl", "\n".join(json.dumps({"a": "s", "y": y}) for y in [0, 1, 1.0]))
    assert load_custom_task(whole, whole, ["a"], "y").label_names == ["0", "1"]  # all whole -> classification
    forced = load_custom_task(whole, whole, ["a"], "y", task_type="regression")
    assert forced.label_names is None and [e.label for e in forced.train] == [0.0, 1.0, 1.0]
    assert load_custom_task(train, train, ["a"], "y", task_type="classification").label_names == ["0.5", "1", "2.25"]


def test_custom_errors(tmp_path):
    train = write(tmp_path / "t.csv", "text,label\na,pos\nb,neg\n")
    dev = write(tmp_path / "d.csv", "text,label\nc,pos\nd,neutral\n")
    assert f"{dev} line 3: label 'neutral' does not occur in the train file (train labels: neg, pos)" in one_line_error(
        lambda: load_custom_task(train, dev, ["text"], "label"))
    assert "header lacks field(s) sentence" in one_line_error(lambda: load_custom_task(train, train, ["sentence"], "label"))
    assert "missing file" in one_line_error(lambda: load_custom_task(str(tmp_path / "no.csv"), train, ["text"], "label"))
    assert "one or two text fields" in one_line_error(lambda: load_custom_task(train, train, ["a", "b", "c"], "label"))
    assert "not one of classification, regression" in one_line_error(lambda: load_custom_task(train, train, ["text"], "label", "ranking"))
    assert "is not a number" in one_line_error(lambda: load_custom_task(train, train, ["text"], "label", "regression"))
    bad = write(tmp_path / "b.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n')
    assert f"{bad} line 2: missing field(s) label" in one_line_error(lambda: load_custom_task(bad, bad, ["text"], "label"))
    assert ".csv, .tsv or .jsonl" in one_line_error(lambda: load_custom_task(write(tmp_path / "x.txt", "t"), train, ["text"], "label"))


def test_hub_rows_map_to_examples(monkeypatch):
    """The hub path with a stand-in for load_dataset (no network): columns, splits and label types."""
    import datasets

    def fake_load_dataset(path, config):
        assert (path, config) == ("nyu-mll/glue", "mnli")
        rows = {"premise": ["P0", "P1"], "hypothesis": ["H0", "H1"], "label": [2, 0], "idx": [0, 1]}
        return datasets.DatasetDict({s: datasets.Dataset.from_dict(rows) for s in (
            "train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(hub, "offline_reason", lambda: None)  # as if the hub were reachable
    task = load_task("mnli", None)
    assert task.source == "hub:nyu-mll/glue/mnli" and set(task.dev) == {"matched", "mismatched"}
    assert [(e.text_a, e.text_b, e.label) for e in task.dev["mismatched"]] == [("P0", "H0", 2), ("P1", "H1", 0)]
