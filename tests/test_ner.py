"""eval=ner without a model: the CoNLL reader and its one-line errors, conlleval's entities (IOB1 and IOB2), the
entity F1 against hand-computed values, and the first-piece alignment on a hand-made WordPiece vocabulary."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from cramming.errors import UserError
from cramming.eval.config import EvalConfig, EvalRunConfig
from cramming.eval.finetune import predict
from cramming.eval.kinds import BENCHMARKS
from cramming.eval.ner import Sentence, load_ner_task, read_conll
from cramming.eval.ner_metrics import entities, entity_scores
from cramming.eval.token_head import IGNORED, Tagger, encode_words, token_loss, unseen
from cramming.hub import HubUnreachable
from cramming.validation.eval import validate_eval

TRAIN = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
"""


def write(folder, name, text):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder / name


# ---------------------------------------------------------------- entities and the metric


@pytest.mark.parametrize("tags, expected", [
    (["I-PER", "I-PER", "B-PER"], [("PER", 0, 2), ("PER", 2, 3)]),  # IOB1: B- only between same-type neighbours
    (["I-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),  # a change of type starts a new entity
    (["O", "B-ORG", "I-ORG"], [("ORG", 1, 3)]),  # an entity open at the sentence's end counts
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),  # IOB2
    (["B-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 3)]),  # B- closes the open entity
    (["O", "I-MISC", "O", "I-MISC"], [("MISC", 1, 2), ("MISC", 3, 4)]),  # I- after O starts one
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),
    (["O", "O"], []),
])
def test_entities_follow_conlleval(tags, expected):
    assert entities(tags) == expected


def test_entity_scores_match_hand_computed_values():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["I-ORG", "I-ORG", "B-ORG"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["I-ORG", "I-ORG", "I-ORG"]]
    # gold: PER 0-2, LOC 3-4, ORG 0-2, ORG 2-3 (4); predicted: PER 0-2, ORG 0-3 (2); right: PER only
    scores = entity_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(50.0)
    assert scores["recall"] == pytest.approx(25.0)
    assert scores["f1"] == pytest.approx(100 / 3)  # 2 * 0.5 * 0.25 / 0.75
    assert scores["f1_PER"] == pytest.approx(100.0)
    assert scores["f1_LOC"] == 0.0 and scores["f1_ORG"] == 0.0
    assert set(scores) == {"precision", "recall", "f1", "f1_PER", "f1_LOC", "f1_ORG"}


def test_iob1_and_iob2_spellings_of_the_same_entities_score_100():
    iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    assert entity_scores(iob1, iob2)["f1"] == pytest.approx(100.0)
    assert entity_scores([["O", "O"]], [["O", "O"]])["f1"] == 0.0  # no entities at all: 0, not a division by zero


def test_a_predicted_type_that_is_not_in_the_gold_counts_against_precision():
    scores = entity_scores([["B-PER", "O"]], [["B-PER", "B-LOC"]])
    assert scores["precision"] == pytest.approx(50.0) and scores["recall"] == pytest.approx(100.0)
    assert scores["f1_LOC"] == 0.0


# ---------------------------------------------------------------- the reader and its errors


def test_reader_skips_docstart_and_splits_sentences_on_blank_lines(tmp_path):
    sentences = read_conll(write(tmp_path, "train.txt", TRAIN))
    assert [s.words for s in sentences] == [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]
    assert [s.tags for s in sentences] == [["I-ORG", "O", "I-MISC", "O"], ["I-PER", "I-PER"]]
    assert sentences[1].at(1) == f"{tmp_path / 'train.txt'} line 9"


def test_any_column_count_works_if_the_tag_is_last_and_the_count_constant(tmp_path):
    text = "Paris\tB-LOC\nis\tO\n\n-DOCSTART-\tO\nBob\tB-PER\n"  # two tab-separated columns, no trailing blank
    assert [s.tags for s in read_conll(write(tmp_path, "t.txt", text))] == [["B-LOC", "O"], ["B-PER"]]


@pytest.mark.parametrize("text, message", [
    (TRAIN.replace("call NN I-NP O", "call NN O"), "train.txt line 6: 3 columns, expected 4 (as on line 3"),
    (TRAIN.replace("I-PER\n", "E-PER\n", 1), "train.txt line 8: tag 'E-PER' in the last column is not O, B-<type>"),
    ("EU\nrejects\n", "train.txt line 1: 1 column"),
    ("-DOCSTART- -X- -X- O\n\n", "train.txt: no sentences"),
])
def test_a_malformed_file_is_one_error_naming_file_and_line(tmp_path, text, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_conll(write(tmp_path, "train.txt", text))


def test_labels_are_o_then_both_prefixes_of_every_train_type(tmp_path):
    write(tmp_path, "train.txt", TRAIN)  # IOB1: only I- tags
    write(tmp_path, "valid.txt", "Peter B-PER\n")  # a B- the train file never writes is still a label
    task = load_ner_task("conll2003", str(tmp_path))
    assert task.source == f"{tmp_path} (train=train.txt, dev=valid.txt)"  # the folder: the card keeps its name
    assert task.label_names == ["O", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert task.head == "tokens" and task.main_metric == "f1" and list(task.dev) == ["dev"]
    assert task.scorer("dev", [["O"]], task.dev["dev"])["recall"] == 0.0


def test_a_dev_type_outside_the_train_types_names_its_file_and_line(tmp_path):
    write(tmp_path, "train.txt", TRAIN)
    write(tmp_path, "eng.testa", "-DOCSTART- -X- -X- O\n\nx X X O\n\nParis NNP B-NP I-PER\nis VBZ B-VP O\nsunny JJ B-NP I-LOC\n")
    with pytest.raises(UserError, match=r"eng\.testa line 7: tag 'I-LOC': its type 'LOC' does not occur in the train "
                                        r"data \(.*train\.txt; its types: MISC, ORG, PER\)"):
        load_ner_task("conll2003", str(tmp_path))


def test_missing_files_say_which_names_were_looked_for(tmp_path):
    write(tmp_path, "train.txt", TRAIN)
    with pytest.raises(UserError, match=r"conll2003: no dev file in .* \(looked for valid\.txt, dev\.txt, eng\.testa"):
        load_ner_task("conll2003", str(tmp_path))
    with pytest.raises(UserError, match=r"eval\.data_dir=.*nowhere: no such folder"):
        load_ner_task("conll2003", str(tmp_path / "nowhere"))


def test_the_hub_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachable, match=r"^conll2003: the hub dataset 'eriktks/conll2003' is unreachable .*"
                                             r"pass eval\.data_dir=") as caught:
        load_ner_task("conll2003", None)
    assert "\n" not in str(caught.value)


def test_the_hub_rows_become_sentences_with_the_features_tag_names(monkeypatch):
    """Mocked `load_dataset`: the hub's script dataset fails under datasets 4+, then its parquet conversion is read;
    tags come from the ClassLabel names, as eriktks/conll2003 declares them."""
    import datasets

    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    features = datasets.Features({"tokens": datasets.List(datasets.Value("string")),
                                  "ner_tags": datasets.List(datasets.ClassLabel(names=names))})
    train = datasets.Dataset.from_dict({"tokens": [["EU", "rejects", "German"], [], ["Bob", "Smith"]],
                                        "ner_tags": [[3, 0, 7], [], [1, 2]]},
                                       features=features)
    dev = datasets.Dataset.from_dict({"tokens": [["Peter", "Blackburn"]], "ner_tags": [[1, 2]]}, features=features)
    calls = []

    def load_dataset(path, config=None, **kwargs):
        calls.append((path, config, kwargs))
        if not kwargs:
            raise RuntimeError("Dataset scripts are no longer supported, but found conll2003.py")
        return datasets.DatasetDict({"train": train, "validation": dev})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr("cramming.hub.offline_reason", lambda: None)  # as if the hub were reachable
    task = load_ner_task("conll2003", None)
    assert calls == [("eriktks/conll2003", None, {}), ("eriktks/conll2003", None, {"revision": "refs/convert/parquet"})]
    assert [(s.words, s.tags) for s in task.train] == [(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
                                                       (["Bob", "Smith"], ["B-PER", "I-PER"])]  # empty rows dropped
    assert [s.tags for s in task.dev["dev"]] == [["B-PER", "I-PER"]]
    assert task.source == "hub:eriktks/conll2003" and task.label_names == ["O", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert task.dev["dev"][0].at(1) == "hub:eriktks/conll2003 validation row 0"


def test_ner_refuses_unknown_tasks():
    with pytest.raises(UserError, match=r"eval\.tasks='wnut' is not a valid option; choose one of: conll2003"):
        BENCHMARKS["ner"].validate(EvalConfig(kind="ner", tasks=["wnut"]))
    per_task = EvalConfig(kind="ner", tasks=["conll2003"], per_task={"wnut": {"epochs": 2}})
    with pytest.raises(UserError, match=r"eval\.per_task\.wnut=.* wnut is not in eval\.tasks"):
        validate_eval(EvalRunConfig(checkpoint="x", eval=per_task))
    validate_eval(EvalRunConfig(checkpoint="x", eval=EvalConfig(kind="ner", tasks=["conll2003"],
                                                                per_task={"conll2003": {"epochs": 2}})))


# ---------------------------------------------------------------- first-piece alignment


def tiny_wordpiece():
    """[CLS] words [SEP] with a WordPiece vocabulary small enough to know every split; non-ASCII is dropped (as
    Cramming's normaliser does), so "€" has no piece."""
    from transformers import PreTrainedTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "eu", "re", "##ject", "##s", "ger", "##man", "call", "bob"]
    raw = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    raw.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(Regex(r"[^\x00-\x7F]"), "")])
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                   ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]")


LABELS = {"O": 0, "B-ORG": 1, "B-MISC": 2}


def test_labels_sit_on_each_words_first_piece():
    sentence = Sentence(["EU", "rejects", "€", "German", "call"], ["B-ORG", "O", "O", "B-MISC", "O"], "x")
    encoded = encode_words(tiny_wordpiece(), [sentence], LABELS, max_length=32)
    # [CLS] eu re ##ject ##s ger ##man call [SEP]; "€" has no piece
    assert [w.ids for w in encoded] == [[2, 4, 5, 6, 7, 8, 9, 10, 3]]
    assert [w.labels for w in encoded] == [[IGNORED, 1, 0, IGNORED, IGNORED, 2, IGNORED, 0, IGNORED]]
    assert [w.firsts for w in encoded] == [[1, 2, -1, 5, 7]] and unseen(encoded) == 1


def test_truncated_words_are_unseen_and_predicted_o():
    sentence = Sentence(["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "O"], "x")
    encoded = encode_words(tiny_wordpiece(), [sentence], LABELS, max_length=7)  # [CLS] eu re ##ject ##s ger [SEP]
    assert [w.firsts for w in encoded] == [[1, 2, 5, -1]] and unseen(encoded) == 1
    assert [w.labels for w in encoded] == [[IGNORED, 1, 0, IGNORED, IGNORED, 2, IGNORED]]

    def model(input_ids, attention_mask):  # every position votes for label index 2 (B-MISC) except the first piece
        logits = torch.zeros(*input_ids.shape, 3)
        logits[..., 2] = 1.0
        logits[:, 1, 1] = 5.0
        return SimpleNamespace(logits=logits)

    task = SimpleNamespace(label_names=list(LABELS))
    tags = predict(Tagger(), model, encoded, task, 4, 0, "cpu", contextlib.nullcontext)
    assert tags == [["B-ORG", "B-MISC", "B-MISC", "O"]]  # the truncated "call" is O, read from no logits


def test_the_loss_is_the_mean_over_first_pieces_and_zero_without_any():
    logits = torch.randn(2, 4, 3, requires_grad=True)
    labels = torch.tensor([[IGNORED, 1, IGNORED, 2], [IGNORED, 0, IGNORED, IGNORED]])
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORED)
    assert token_loss(logits, labels).item() == pytest.approx(expected.item())
    empty = token_loss(logits, torch.full((2, 4), IGNORED))  # every word of the batch dropped by the tokenizer
    assert empty.item() == 0.0
    empty.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
