"""SWAG's CSV and RACE's folders read as the originals are laid out, every bad-data error one line naming file and
line, RACE's blank filling, the encoding that keeps every choice whole, and accuracy against hand-computed values."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from cramming.errors import UserError
from cramming.eval.config import EvalConfig
from cramming.eval.finetune import score
from cramming.eval.kinds import BENCHMARKS, HEADS
from cramming.eval.multiple_choice_head import (
    CandidateScoring,
    ChoiceExample,
    MultipleChoice,
    Question,
    collate_choices,
    encode_choices,
    softmax_loss,
    token_limit,
)
from cramming.eval.swag_race import fill_blank, load_race, load_swag

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]


def swag_row(i: int, label: int, sent1: str = "Someone opens the hood.", endings=None) -> list:
    """Row i of swagaf's CSV, its right ending at `label`."""
    wrong = ["flies away", "eats the car", "sings loudly"]
    endings = endings or [*wrong[:label], f"looks at the engine {i}", *wrong[label:]]
    return [str(i), f"lsmdc{i}", str(i), f"{sent1} He", sent1, "He", "gold", *endings, str(label)]


def write_swag(folder: Path, train_rows=None, val_rows=None) -> Path:
    """train.csv and val.csv in swagaf's layout (csv module quoting: a field may hold commas, quotes, newlines)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.csv", train_rows), ("val.csv", val_rows)):
        rows = rows if rows is not None else [swag_row(i, i % 4) for i in range(8)]
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([HEADER, *rows])
    return folder


def race_article(n: int, answers="ABCD", **overrides) -> dict:
    record = {"article": f"Tom went to school number {n}. It was far, far away.",
              "questions": [f"Where did Tom go {k}?" if k % 2 else f"Tom went to _ {k}." for k in range(len(answers))],
              "options": [["school", "home", "the park", "the sea"] for _ in answers],
              "answers": list(answers), "id": f"x{n}.txt"}
    return record | overrides


def write_race(folder: Path, articles: int = 2) -> Path:
    """RACE/{train,dev}/{high,middle}/<n>.txt, each a JSON article with its questions."""
    for split in ("train", "dev", "test"):
        for level in ("high", "middle"):
            where = folder / split / level
            where.mkdir(parents=True, exist_ok=True)
            for n in range(articles):
                (where / f"{n + 1}.txt").write_text(json.dumps(race_article(n)))
    return folder


def test_swag_reads_context_and_four_choices(tmp_path):
    rows = [swag_row(0, 2, sent1='She says "hi, there"\nand waves.'), swag_row(1, 0)]
    data = write_swag(tmp_path, rows, rows)
    task = load_swag(str(data))
    first = task.train[0]
    assert first.context == 'She says "hi, there"\nand waves.'  # a quoted field with a comma, a quote and a newline
    assert first.choices == ["He flies away", "He eats the car", "He looks at the engine 0", "He sings loudly"]
    assert first.label == 2 and task.train[1].label == 0
    assert set(task.dev) == {"dev"} and task.head == "multiple-choice" and task.main_metric == "accuracy"


@pytest.mark.parametrize("row, fragment", [
    (swag_row(1, 1, endings=["a", "b", "", "d"]), "line 3: ending2 empty (a SWAG row needs four endings)"),
    (swag_row(1, 4), "line 3: label '4' is not one of 0, 1, 2, 3"),
    (swag_row(1, 1)[:-2] + ["1"], "line 3: 11 fields, expected 12"),
])
def test_a_bad_swag_row_names_its_file_and_line(tmp_path, row, fragment):
    """A row's line is where it starts: quoted fields may hold newlines (then CSV lines are not file lines)."""
    write_swag(tmp_path, [swag_row(0, 0), row])
    with pytest.raises(UserError, match=re.escape(f"train.csv {fragment}")):
        load_swag(str(tmp_path))
    multiline = swag_row(0, 0, sent1="two\nlines")  # startphrase and sent1 hold a newline: lines 2-4
    spanning = [*row[:4], "a\nb", *row[5:]]  # the bad row: lines 5-6
    write_swag(tmp_path, [multiline, spanning])
    with pytest.raises(UserError, match=re.escape(f"train.csv {fragment.replace('line 3', 'line 5')}")):
        load_swag(str(tmp_path))


def test_swag_header_and_files(tmp_path):
    write_swag(tmp_path)
    (tmp_path / "val.csv").write_text(",video-id,sent1,sent2,ending0,ending1,ending2,label\n0,v,a,b,c,d,e,1\n")
    with pytest.raises(UserError, match=r"val.csv line 1: header lacks column\(s\) ending3"):
        load_swag(str(tmp_path))
    (tmp_path / "val.csv").unlink()
    with pytest.raises(UserError, match="swag: missing .*val.csv"):
        load_swag(str(tmp_path))


def test_race_blank_filling():
    assert fill_blank("Tom went to _ .", "school") == "Tom went to school ."
    assert fill_blank("The best title is ____", "A Day") == "The best title is A Day"  # a run is one blank
    assert fill_blank("Where did Tom go?", "home") == "Where did Tom go? home"
    assert fill_blank("_ is right", r"C:\path") == r"C:\path is right"  # the option is text, not a pattern


def test_race_reads_both_levels_and_scores_each(tmp_path):
    write_race(tmp_path)
    task = load_race("race", str(tmp_path))
    assert len(task.train) == 2 * 2 * 4 and set(task.dev) == {"dev", "race-high", "race-middle"}
    assert len(task.dev["dev"]) == 16 and len(task.dev["race-high"]) == len(task.dev["race-middle"]) == 8
    assert {q.level for q in task.dev["race-middle"]} == {"middle"}
    question = task.train[0]
    assert question.context.startswith("Tom went to school number 0.")
    assert question.choices == ["Tom went to school 0.", "Tom went to home 0.", "Tom went to the park 0.",
                                "Tom went to the sea 0."] and question.label == 0
    assert task.train[1].choices[2] == "Where did Tom go 1? the park" and task.train[3].label == 3
    high = load_race("race-high", str(tmp_path))
    assert set(high.dev) == {"dev"} and {q.level for q in high.train + high.dev["dev"]} == {"high"}


@pytest.mark.parametrize("text, fragment", [
    ('{"article": "a",\n "questions": [}', r"1.txt line 2: not valid JSON"),
    (json.dumps(race_article(0, answers="AB") | {"answers": ["A"]}), "1 answers: expected lists of one length"),
    (json.dumps(race_article(0, answers="AE")), "1.txt question 2: answer 'E' is not one of A, B, C, D"),
    (json.dumps(race_article(0, answers="A") | {"options": [["x", "y", "z"]]}), "question 1: 3 options, expected 4"),
    (json.dumps(race_article(0, answers="A") | {"options": ["abcd"]}), "question 1: options 'abcd' is not a list of 4"),
    (json.dumps(race_article(0) | {"answers": "ABCD"}), "4 questions, 4 option lists and str answers"),
    (json.dumps({"article": "a", "questions": []}), "1.txt: missing field"),
    ("[1, 2]", "1.txt: expected a JSON object, got list"),
])
def test_a_bad_race_file_names_itself(tmp_path, text, fragment):
    write_race(tmp_path)
    (tmp_path / "dev" / "middle" / "1.txt").write_text(text)
    with pytest.raises(UserError, match=re.escape(fragment)):
        load_race("race", str(tmp_path))


def test_race_needs_its_folders(tmp_path):
    write_race(tmp_path)
    for path in (tmp_path / "dev" / "high").iterdir():
        path.unlink()
    with pytest.raises(UserError, match=r"race: no .*dev/high/\*.txt"):
        load_race("race", str(tmp_path))
    load_race("race-middle", str(tmp_path))  # one level's task does not read the other


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace tokenizer with BERT's pair template: one token per word, so lengths are countable by hand."""
    words = [f"w{i}" for i in range(40)] + ["c0", "c1", "c2", "c3", "long"]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]")


def test_the_context_is_cut_and_every_choice_survives():
    tokenizer = word_tokenizer()
    context = " ".join(f"w{i}" for i in range(30))
    example = ChoiceExample(context, ["c0", "c1 c1", "c2 c2 c2 c2 c2 c2", " ".join(["long"] * 12)], 1)
    rows = encode_choices(tokenizer, [example], max_length=10)[0]
    assert all(len(r) == 10 for r in rows)
    for row, choice in zip(rows[:3], example.choices):  # 6 words of 7 free places: one context word is left
        words = tokenizer.decode(row).split()
        assert words[-len(choice.split()) - 1:-1] == choice.split()  # the choice whole before the last [SEP]
        assert words[:2] == ["[CLS]", "w0"]  # the context's beginning kept, its end cut
    assert "long" in tokenizer.decode(rows[3]) and "w0" in tokenizer.decode(rows[3])  # too long: both sides cut
    (edge,) = encode_choices(tokenizer, [ChoiceExample(context, [" ".join(["long"] * 7)], 0)], max_length=10)
    assert len(edge[0]) == 10 and "w0" in tokenizer.decode(edge[0])  # 7 + 3 special tokens leave no context word
    batch = collate_choices(encode_choices(tokenizer, [example, ChoiceExample("w1", ["c0"] * 4, 0)], 10), 0, "cpu")
    assert batch["input_ids"].shape == (2, 4, 10) and batch["attention_mask"][1].sum(-1).tolist() == [5] * 4



def test_a_question_is_as_long_as_its_padded_rows():
    """Both choice heads bucket a question by what padding it costs: its rows times the longest (finetune.predict
    sorts by it too); a question of many short rows is not shorter than one of two long ones."""
    many_short, two_long = Question([[1] * 3] * 8, 0), Question([[1] * 9, [1] * 5], 1)
    for head in (MultipleChoice(), CandidateScoring(softmax_loss)):
        assert head.length(many_short) == 24 and head.length(two_long) == 18
        cells = head.collate([two_long], 0, "cpu")["input_ids"].numel()
        assert head.length(two_long) == cells

def test_accuracy_is_the_percentage_of_right_picks(tmp_path):
    rows = [swag_row(i, label) for i, label in enumerate((0, 3, 2, 1, 1))]
    task = load_swag(str(write_swag(tmp_path, rows, rows)))
    picks = np.array([0, 3, 1, 1, 0])  # 3 of 5 right
    assert score(task, "dev", picks) == {"accuracy": pytest.approx(60.0)}
    assert task.head in HEADS


def test_benchmarks_refuse_unknown_or_overlapping_tasks():
    race = BENCHMARKS["race"]
    race.validate(EvalConfig(kind="race", tasks=["race-high", "race-middle"]))
    with pytest.raises(UserError, match="race already scores race-high"):
        race.validate(EvalConfig(kind="race", tasks=["race", "race-high"]))
    with pytest.raises(UserError, match="eval.tasks='mnli' is not a valid option"):
        BENCHMARKS["swag"].validate(EvalConfig(kind="swag", tasks=["mnli"]))


class _Config:
    model_type, layout, max_seq_length = "crammed", ["attention"], 128

    def __init__(self, position):
        self.position = position


def test_token_limit_is_the_position_table():
    assert token_limit(_Config("scaled-sinusoidal")) == 128 and token_limit(_Config("learned")) == 128
    assert token_limit(_Config("rotary")) is None


# ---------------------------------------------------------------- hub (mocked: not run against the real hub)


def test_the_hub_paths_ask_for_allenai_swag_and_ehovy_race(monkeypatch, tmp_path):
    """Hub rows (SWAG: the CSV's columns with an int label; RACE: one row per question, the answer a letter) give
    the same examples as the original files."""
    import datasets

    write_swag(tmp_path / "swag")
    write_race(tmp_path / "race")
    calls = []

    def fake_load_dataset(path, config, split):
        calls.append((path, config, split))
        if path == "allenai/swag":
            rows = read_csv_rows(tmp_path / "swag" / {"train": "train.csv", "validation": "val.csv"}[split])
            return [row | {"label": int(row["label"])} for row in rows]
        folder = tmp_path / "race" / {"train": "train", "validation": "dev"}[split] / config
        records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.txt"))]
        return [{"example_id": r["id"], "article": r["article"], "question": q, "options": o, "answer": a}
                for r in records for q, o, a in zip(r["questions"], r["options"], r["answers"])]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("cramming.hub.offline_reason", lambda: None)
    hub, local = load_swag(None), load_swag(str(tmp_path / "swag"))
    assert hub.train == local.train and hub.dev == local.dev and hub.source == "hub:allenai/swag/regular"
    hub, local = load_race("race", None), load_race("race", str(tmp_path / "race"))
    assert hub.train == local.train and hub.dev == local.dev and hub.source == "hub:ehovy/race"
    assert sorted(calls) == sorted([("allenai/swag", "regular", s) for s in ("train", "validation")]
                                   + [("ehovy/race", c, s) for c in ("high", "middle") for s in ("train", "validation")])


def read_csv_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_offline_without_a_folder_is_one_line():
    """HF_HUB_OFFLINE=1 (conftest) and nothing cached: the hub's failure becomes one line saying what to pass."""
    with pytest.raises(UserError, match=r"swag: the hub dataset 'allenai/swag' is unreachable .*eval.data_dir="):
        load_swag(None)
    with pytest.raises(UserError, match=r"race: the hub dataset 'ehovy/race' is unreachable .*eval.data_dir="):
        load_race("race", None)
