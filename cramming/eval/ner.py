"""`eval=ner`: named-entity recognition on CoNLL-2003 (or any file in its column format), from a data_dir or the hub.

The column format: one word per line, columns separated by spaces (or tabs), the tag in the LAST column (CoNLL-2003:
word, POS, chunk, NER), the same number of columns on every word line of a file; blank lines end sentences;
`-DOCSTART-` lines (document boundaries) are skipped. Tags are IOB1 or IOB2 (ner_metrics.py). The labels are `O` and
B-/I- of each entity type in the train file; a dev tag of another type is an error. Dev (CoNLL's testa) is scored; the
test file (testb) is never read. The model is the token classifier of token_head.py.
"""

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..hub import hub_dataset
from ..untrusted import text_lines
from .files import files_source
from .ner_metrics import entity_scores, valid_tag
from .tasks import TaskData


@dataclass(frozen=True)
class NerTask:
    """CoNLL-format named-entity recognition (docs/ner.md): eval.data_dir's train and dev files, else the hub's."""

    hub: str  # the hub dataset read without eval.data_dir


NER_TASKS = {"conll2003": NerTask("eriktks/conll2003")}  # eval.tasks of eval=ner (CoNLL-2003 English)
# Accepted file names in eval.data_dir, first found wins: the hub zip's, the original release's (eng.*), plain.
TRAIN_FILES = ("train.txt", "eng.train", "train")
DEV_FILES = ("valid.txt", "dev.txt", "eng.testa", "testa", "testa.txt", "valid", "dev")
METRICS = ["precision", "recall", "f1"]


@dataclass
class Sentence:
    words: list[str]
    tags: list[str]  # one per word, as written
    origin: str  # the file, or the hub split and row
    line: int | None = None  # the file line of its first word (words follow on consecutive lines)

    def at(self, word: int) -> str:
        """Where word `word` of this sentence was read, for errors."""
        return self.origin if self.line is None else f"{self.origin} line {self.line + word}"


def read_conll(path: Path) -> list[Sentence]:
    """Every sentence of a column-format file; a malformed line is one UserError naming file and line."""
    sentences, words, tags, columns, first, start = [], [], [], None, 0, 0
    for number, line in enumerate(text_lines(path), start=1):  # UTF-8, each line bounded
        fields = line.split()
        if fields and fields[0] == "-DOCSTART-":
            fields = []  # a document boundary ends a sentence, as a blank line does
        if not fields:
            if words:
                sentences.append(Sentence(words, tags, str(path), start))
                words, tags = [], []
            continue
        if columns is None:
            columns, first = len(fields), number
            if columns < 2:
                raise UserError(f"{path} line {number}: 1 column; a CoNLL file needs the word first and the "
                                "tag last, separated by spaces")
        elif len(fields) != columns:
            raise UserError(f"{path} line {number}: {len(fields)} columns, expected {columns} "
                            f"(as on line {first}, the file's first word line)")
        if not valid_tag(fields[-1]):
            raise UserError(f"{path} line {number}: tag {fields[-1]!r} in the last column is not O, B-<type> or "
                            "I-<type> (IOB1 or IOB2)")
        start = start if words else number
        words.append(fields[0])
        tags.append(fields[-1])
    if words:
        sentences.append(Sentence(words, tags, str(path), start))
    if not sentences:
        raise UserError(f"{path}: no sentences (a CoNLL file has one word and its tag per line)")
    return sentences


def label_set(train: list[Sentence]) -> list[str]:
    """O first (the tag of a word the model never sees), then B- and I- of every entity type in the train data, by
    type. Both prefixes of a type, even one the train file never writes: in IOB1 (the original CoNLL-2003) `B-` is
    rare, and a dev `B-PER` must not fail a run whose train file happens to hold only `I-PER`."""
    kinds = sorted({t[2:] for s in train for t in s.tags if t != "O"})
    return ["O", *(f"{prefix}-{kind}" for kind in kinds for prefix in "BI")]


def check_dev_tags(dev: list[Sentence], labels: list[str], train_source: str) -> None:
    """A dev entity type the train data never has could not be predicted: an error, at its line."""
    known = set(labels)
    for sentence in dev:
        for offset, tag in enumerate(sentence.tags):
            if tag not in known:
                kinds = ", ".join(dict.fromkeys(label[2:] for label in labels[1:])) or "none"
                raise UserError(f"{sentence.at(offset)}: tag {tag!r}: its type {tag[2:]!r} does not occur in the train "
                                f"data ({train_source}; its types: {kinds}), so the model could never predict it")


def _find(folder: Path, names: tuple[str, ...], what: str, task: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise UserError(f"{task}: no {what} file in {folder} (looked for {', '.join(names)}); eval.data_dir must hold "
                    "CoNLL-format train and dev files")


def _load_local(task: str, folder: Path):
    if not folder.is_dir():
        raise UserError(f"eval.data_dir={folder}: no such folder; give a folder with CoNLL-format train and dev files "
                        f"({TRAIN_FILES[0]}, {DEV_FILES[0]})")
    train_path, dev_path = _find(folder, TRAIN_FILES, "train", task), _find(folder, DEV_FILES, "dev", task)
    return read_conll(train_path), read_conll(dev_path), str(train_path), files_source(train_path, dev_path)


def _load_hub(task: str):
    """Splits train and validation, tags as `ner_tags` indices into the feature's names."""
    dataset_id = NER_TASKS[task].hub
    splits = hub_dataset(task, dataset_id, fix="eval.data_dir=<folder with CoNLL train and dev files>")
    loaded = {}
    for split in ("train", "validation"):
        names = splits[split].features["ner_tags"].feature.names
        loaded[split] = [Sentence(list(row["tokens"]), [names[t] for t in row["ner_tags"]],
                                  f"hub:{dataset_id} {split} row {i}") for i, row in enumerate(splits[split])
                         if row["tokens"]]
    return loaded["train"], loaded["validation"], f"hub:{dataset_id} train", f"hub:{dataset_id}"


def load_ner_task(task: str, data_dir: str | None) -> TaskData:
    """Train and dev sentences (all read and checked here, before any training) as a TaskData for the tokens head."""
    if data_dir is None:
        train, dev, train_source, source = _load_hub(task)
    else:
        train, dev, train_source, source = _load_local(task, Path(data_dir))
    labels = label_set(train)
    check_dev_tags(dev, labels, train_source)
    return TaskData(task, train, {"dev": dev}, labels, list(METRICS), "f1", source,
                    scorer=lambda split, predicted, rows: entity_scores([s.tags for s in rows], predicted),
                    head="tokens")
