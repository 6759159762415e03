"""SuperGLUE: every task's loader on fixtures in the original release's layout (tests/fixtures/superglue, written
for these tests; no real data ships), the hub path with the loader mocked, the official metrics against
hand-computed values, the preset (its refusals: the table in tests/test_refusals.py), and the heads' losses and
span pooling."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from cramming.cli import CONF
from cramming.errors import UserError
from cramming.eval import superglue
from cramming.eval import superglue_metrics as m
from cramming.eval.multiple_choice_head import logistic_loss, softmax_loss
from cramming.eval.span_head import SpanPairClassifier
from cramming.eval.superglue import SUPERGLUE_TASKS, load_superglue_task
from cramming.validation.eval import load_eval_config

FIXTURES = Path(__file__).parent / "fixtures" / "superglue"


def load(name, diagnostics=()):
    return load_superglue_task(name, str(FIXTURES), diagnostics)


# ---------------------------------------------------------------- loaders


def test_boolq_and_cb_map_labels_in_the_hubs_order():
    boolq = load("boolq")
    assert [e.label for e in boolq.train] == [1, 0, 1, 0]  # JSON true/false -> the hub's False=0, True=1
    assert boolq.train[0].text_a == "is the sky blue" and boolq.train[0].text_b.startswith("The sky is blue")
    cb = load("cb")
    assert [e.label for e in cb.train] == [0, 1, 2, 0]  # entailment, contradiction, neutral
    assert cb.label_names == ["entailment", "contradiction", "neutral"] and list(cb.dev) == ["dev"]
    assert cb.source == str(FIXTURES / "CB")


def test_multirc_is_one_binary_example_per_answer_grouped_by_question():
    task = load("multirc")
    assert len(task.train) == 7 and [e.label for e in task.train] == [1, 0, 1, 1, 0, 1, 0]
    assert [e.group for e in task.dev["dev"]] == [(0, 0), (0, 0), (0, 1), (0, 1), (0, 1)]
    first = task.train[0]
    assert first.text_a.startswith("Sent 1: Tom has a red car.")
    assert first.text_b == "What colour is Tom's car? Red"
    assert task.train[5].group == (1, 0)  # the second paragraph's question


def test_copa_runs_the_premise_into_a_connector_and_scores_each_choice():
    task = load("copa")
    assert task.head == "choice" and task.label_names is None
    first = task.train[0]
    assert first.context == "My body cast a shadow over the grass because"
    assert first.options == ["The sun was rising.", "The grass was cut."] and first.gold == [0]
    effect = task.dev["dev"][0]
    assert effect.context == "The man turned on the faucet so" and effect.gold == [1]


def test_record_substitutes_each_entity_and_marks_the_gold_ones():
    task = load("record")
    assert task.head == "candidates"
    first = task.train[0]  # entity offsets are inclusive: "Paris" is text[0:4+1]
    assert first.names == ["Berlin", "France", "Germany", "Paris"]
    assert first.options[3] == "Paris is the capital of France" and first.gold == [3]
    assert "@highlight" not in first.context and "France.- Berlin" in first.context
    dev = task.dev["dev"]
    assert dev[0].names == ["Mount Everest", "Nepal"]  # an entity marked twice is one option
    assert dev[1].answers == ["Nepal"] and dev[1].gold == [1]


def test_wic_marks_the_word():
    task = load("wic")
    assert task.train[0].text_a == "bank: He sat on the river bank."
    assert task.train[0].text_b == "She works at the bank."
    assert [e.label for e in task.train] == [0, 1, 0]


def test_wsc_spans_become_character_ranges_of_their_words():
    task = load("wsc")
    assert task.head == "span-pair"
    for example, noun, pronoun in [(task.train[0], "Mark", "He"), (task.train[1], "the brown suitcase", "it"),
                                   (task.dev["dev"][1], "Paul", "he")]:
        assert example.text[slice(*example.span1)] == noun
        assert example.text[slice(*example.span2)] == pronoun
    assert [e.label for e in task.train] == [1, 0, 1]


def test_rte_carries_the_diagnostics_as_its_extra_dev_splits():
    task = load("rte", ("axb", "axg"))
    assert list(task.dev) == ["dev", "axb", "axg"]
    assert [e.label for e in task.dev["axb"]] == [0, 1, 0, 1]
    assert task.dev["axb"][1].text_b == "The dog did not run."
    assert [e.group for e in task.dev["axg"]] == [1, 1, 2, 2]
    preds = np.array([0, 0, 1, 0])  # the axg scorer sees pairs, the axb one Matthews, RTE's dev plain accuracy
    assert task.scorer("axg", preds, task.dev["axg"])["gender_parity"] == 50.0
    assert set(task.scorer("axb", preds, task.dev["axb"])) == {"matthews", "score"}
    assert task.scorer("dev", np.array([0, 1]), task.dev["dev"]) == {"accuracy": 100.0, "score": 100.0}
    assert list(load("rte").dev) == ["dev"]


def copy_fixtures(tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(FIXTURES, tmp_path / "superglue"))


def test_a_missing_folder_or_file_names_it(tmp_path):
    root = copy_fixtures(tmp_path)
    (root / "CB" / "val.jsonl").unlink()
    (root / "CB" / "train.jsonl").write_text("{broken\n")  # every file is looked for before any is parsed
    with pytest.raises(UserError, match=r"cb: missing .*CB/val.jsonl"):
        load_superglue_task("cb", str(root))
    with pytest.raises(UserError, match=r"boolq: missing task folder .*nowhere/BoolQ"):
        load_superglue_task("boolq", str(tmp_path / "nowhere"))
    (root / "AX-g" / "AX-g.jsonl").unlink()
    with pytest.raises(UserError, match=r"axg: missing .*AX-g/AX-g.jsonl"):
        load_superglue_task("rte", str(root), ("axg",))


@pytest.mark.parametrize("task, folder, line, fragment", [
    ("boolq", "BoolQ", "{not json", "line 3: not valid JSON"),
    ("cb", "CB", '{"premise": "a", "hypothesis": "b", "label": "maybe", "idx": 9}',
     "line 3: label 'maybe' is not one of"),
    ("rte", "RTE", '{"premise": "a", "label": "entailment", "idx": 9}', "line 3: missing field 'hypothesis'"),
    ("multirc", "MultiRC", '{"idx": 9, "passage": {"text": "x"}}', "line 2: malformed multirc record"),
    ("wsc", "WSC", ('{"text": "A b.", "target": {"span1_index": 7, "span1_text": "A", "span2_index": 1, '
                    '"span2_text": "b."}, "idx": 9, "label": true}'), "line 3: span1_index 7"),
    ("record", "ReCoRD", ('{"idx": 9, "passage": {"text": "Ab", "entities": [{"start": 0, "end": 0}]}, '
                          '"qas": [{"query": "no slot", "idx": "9-0", "answers": []}]}'),
     "line 2: the query has no @placeholder"),
])
def test_a_malformed_line_names_file_and_line(tmp_path, task, folder, line, fragment):
    root = copy_fixtures(tmp_path)
    path = root / folder / "val.jsonl"
    rows = path.read_text().splitlines()
    keep = 1 if task in ("multirc", "record") else 2
    path.write_text("\n".join(rows[:keep] + [line]) + "\n")
    with pytest.raises(UserError, match="val.jsonl " + fragment.replace("(", r"\(")):
        load_superglue_task(task, str(root))


# ---------------------------------------------------------------- hub (mocked: not run against the real hub)


def test_the_hub_path_asks_aps_super_glue_for_each_tasks_config_and_split(monkeypatch):
    """The hub serves flat rows with class indices; the mock serves the fixtures' rows so, and the examples must
    come out as from the local files."""
    import datasets

    calls = []
    local_split = {"train": "train", "validation": "dev", "test": None}

    def fake_load_dataset(path, config, split):
        calls.append((path, config, split))
        spec = next(s for s in SUPERGLUE_TASKS.values() if s.hub_config == config)
        rows = superglue._read_local(FIXTURES, spec, local_split[split] or spec.name)
        return [row for row, _ in rows]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("cramming.hub.offline_reason", lambda: None)  # as if the hub were reachable
    for name in m.SUPERGLUE_SET:
        extra = m.DIAGNOSTICS if name == "rte" else ()
        hub, local = load_superglue_task(name, None, extra), load(name, extra)
        assert hub.train == local.train and hub.dev == local.dev, name
        assert hub.source == f"hub:aps/super_glue/{name}"
    expected = [("aps/super_glue", n, s) for n in m.SUPERGLUE_SET for s in ("train", "validation")]
    expected += [("aps/super_glue", "axb", "test"), ("aps/super_glue", "axg", "test")]
    assert sorted(calls) == sorted(expected)


def test_an_unlabelled_hub_split_is_refused(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda path, config, split: [
        {"question": "q", "passage": "p", "idx": 0, "label": -1}])
    monkeypatch.setattr("cramming.hub.offline_reason", lambda: None)
    with pytest.raises(UserError, match=r"label -1 is not a class index"):
        load_superglue_task("boolq", None)


# ---------------------------------------------------------------- metrics, by hand


def test_cb_averages_accuracy_and_macro_f1():
    scores = m.cb_scores([0, 1, 2, 0], [0, 1, 1, 2])
    # accuracy 2/4; F1 per class: 0: P 1/2 R 1 -> 2/3; 1: P 1 R 1/2 -> 2/3; 2: 0 -> macro 4/9
    assert scores["accuracy"] == pytest.approx(50.0)
    assert scores["f1_macro"] == pytest.approx(400 / 9)
    assert scores["score"] == pytest.approx((50.0 + 400 / 9) / 2)


def test_multirc_exact_match_is_per_question():
    refs = [1, 0, 1, 1, 0]
    preds = [1, 0, 0, 1, 0]
    questions = ["q1", "q1", "q1", "q2", "q2"]
    scores = m.multirc_scores(preds, refs, questions)
    assert scores["f1a"] == pytest.approx(80.0)  # tp 2, fp 0, fn 1: 2*2 / (2*2 + 1)
    assert scores["exact_match"] == pytest.approx(50.0)  # q1 has a wrong answer, q2 none (per answer: 80)
    assert scores["score"] == pytest.approx(65.0)


def test_record_normalises_and_takes_the_best_gold_answer():
    assert m.squad_f1("Eiffel Tower in Paris", "the Eiffel Tower", version=1) == pytest.approx(2 / 3)  # P 1, R 1/2
    scores = m.record_scores(["Eiffel Tower", "Paris"], [["Eiffel", "the Eiffel Tower"], ["London"]])
    assert scores["f1"] == pytest.approx(50.0)  # max(2/3, 1) for the first query, 0 for the second
    assert scores["exact_match"] == pytest.approx(50.0)
    assert m.record_scores(["x"], [[]])["f1"] == 0.0  # no gold answer: nothing matches


def test_axb_is_matthews_and_axg_reports_parity_beside_accuracy():
    # tp 2, tn 1, fp 1, fn 0: (2*1 - 1*0) / sqrt(3*2*2*1)
    assert m.axb_scores([0, 1, 1, 1], [0, 1, 0, 1])["matthews"] == pytest.approx(100 * 2 / math.sqrt(12))
    scores = m.axg_scores([0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1], [1, 1, 2, 2, 3, 3])
    assert scores["gender_parity"] == pytest.approx(200 / 3)  # pairs 1 and 3 agree, pair 2 does not
    assert scores["accuracy"] == pytest.approx(500 / 6) and scores["score"] == scores["accuracy"]
    with pytest.raises(ValueError, match="two members"):
        m.axg_scores([0, 1, 1], [0, 1, 1], [1, 1, 2])


def test_the_superglue_average_is_the_eight_tasks_and_leaves_the_diagnostics_out():
    scores = {task: 10.0 * (i + 1) for i, task in enumerate(m.SUPERGLUE_SET)} | {"axb": 100.0, "axg": 0.0}
    summary = m.superglue_average(scores)
    assert summary["average"] == pytest.approx(45.0)  # mean of 10..80
    assert summary["tasks_counted"] == list(m.SUPERGLUE_SET)
    assert summary["diagnostics"] == {"axb": 100.0, "axg": 0.0}


# ---------------------------------------------------------------- config


def eval_config(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_eval_config(compose(config_name="eval", overrides=["checkpoint=x", "eval=superglue", *overrides]))


def test_the_superglue_preset_selects_every_task():
    config = eval_config()
    assert config.eval.kind == "superglue"
    assert config.eval.tasks == ["boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc", "axb", "axg"]


# ---------------------------------------------------------------- heads


def test_copa_trains_a_softmax_over_its_choices_and_record_each_candidate_alone():
    logits = torch.tensor([0.0, math.log(3.0), 1.0, 2.0, 3.0])
    # question 1: options 0-1, its gold 1: -log(3/4); question 2: options 2-4, its gold 2 (logit 3):
    q2 = -math.log(math.e**3 / (math.e + math.e**2 + math.e**3))
    assert softmax_loss(logits, [2, 3], [[1], [2]]).item() == pytest.approx((-math.log(0.75) + q2) / 2, rel=1e-5)
    zero = torch.zeros(5)  # targets 1 at options 0 and 3: every option's loss is log 2 at logit 0
    assert logistic_loss(zero, [2, 3], [[0], [1]]).item() == pytest.approx(math.log(2))
    sure = torch.tensor([20.0, -20.0, -20.0, 20.0, -20.0])
    assert logistic_loss(sure, [2, 3], [[0], [1]]).item() < 1e-6  # the gold options are 0 and 2 + 1


class Fixed(torch.nn.Module):
    """An encoder that returns the hidden states it was given."""

    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden

    def forward(self, input_ids, attention_mask):
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=self.hidden)


def test_the_span_head_sees_only_its_spans():
    torch.manual_seed(0)
    hidden = torch.randn(1, 6, 8)
    spans = torch.zeros(1, 2, 6, dtype=torch.bool)
    spans[0, 0, 1:3] = True  # the noun phrase: tokens 1-2
    spans[0, 1, 4] = True  # the pronoun: token 4
    model = SpanPairClassifier(Fixed(hidden), 8, dropout=0.0).eval()
    ids, mask = torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)
    before = model(ids, mask, spans)
    for outside in (0, 3, 5):
        model.encoder.hidden = hidden.clone()
        model.encoder.hidden[0, outside] += 10.0
        assert torch.allclose(model(ids, mask, spans), before)
    for inside in (1, 4):
        model.encoder.hidden = hidden.clone()
        model.encoder.hidden[0, inside] += 10.0
        assert not torch.allclose(model(ids, mask, spans), before)
