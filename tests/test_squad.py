"""eval=squad's pure parts: the official JSON reader and its one-line errors, the windows over a long context, the
answer decoding, and the official metrics against hand-computed values."""

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from cramming.errors import UserError
from cramming.eval.squad import Window, best_span, decode_answers, encode_windows, fit_length
from cramming.eval.squad_data import (
    SQUAD_TASKS,
    SquadExample,
    SquadOptions,
    load_squad_examples,
    read_squad_file,
    read_squad_hub,
)
from cramming.eval.squad_metrics import f1, normalize_answer, question_scores, squad_scores


def word_tokenizer(words) -> PreTrainedTokenizerFast:
    """A fast tokenizer with one token per word and BERT's pair template: [CLS] q [SEP] c [SEP]."""
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *sorted(set(words))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def squad_file(tmp_path, qas, context="Paris is the capital of France .", name="dev-v1.1.json"):
    path = tmp_path / name
    document = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(document, indent=1))
    return path


def qa(qid, answers, **extra):
    return {"id": qid, "question": "What is the capital?", "answers": answers, **extra}


def test_reader_reads_v11_and_v20_questions(tmp_path):
    answers = [{"text": "Paris", "answer_start": 0}, {"text": "France", "answer_start": 24}]
    path = squad_file(tmp_path, [qa("a", answers)])
    (example,) = read_squad_file(path, 1)
    assert (example.id, example.answers) == ("a", [("Paris", 0), ("France", 24)])
    path = squad_file(tmp_path, [qa("b", [], is_impossible=True), qa("c", [{"text": "capital", "answer_start": 13}],
                                                                       is_impossible=False)], name="dev-v2.0.json")
    assert [(e.id, e.answers) for e in read_squad_file(path, 2)] == [("b", []), ("c", [("capital", 13)])]


@pytest.mark.parametrize("qas, version, fragments", [
    ([qa("x1", [{"text": "Paris", "answer_start": 0}]), qa("bad", [{"text": "Paris", "answer_start": 3}])], 1,
     ["data[0].paragraphs[0].qas[1] (question id bad) answers[0]", "answer 'Paris' is not at answer_start 3",
      "reads 'is is'"]),
    ([{"id": "bad", "answers": []}], 2, ["data[0].paragraphs[0].qas[0] (question id bad)", "missing key 'question'"]),
    ([qa("bad", [])], 1, ["(question id bad)", "no answers (SQuAD v1.1 needs at least one"]),
])
def test_bad_questions_name_file_line_path_and_id(tmp_path, qas, version, fragments):
    path = squad_file(tmp_path, qas)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"bad"' in text)
    with pytest.raises(UserError) as err:
        read_squad_file(path, version)
    message = str(err.value)
    assert message.startswith(f"{path} line {line}: ") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_a_file_that_is_not_json_names_its_line(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text('{"data": [\n  oops\n]}')
    with pytest.raises(UserError, match=r"dev-v1.1.json line 2: not JSON"):
        read_squad_file(path, 1)


CONTEXT = " ".join(f"w{i}" for i in range(40)) + " the answer is Mount Everest indeed"


@pytest.mark.parametrize("words", range(34, 48))  # the answer at every place in the windows, split by some
def test_windows_cover_a_long_context_and_label_the_answer_where_it_is(words):
    context = " ".join([*(f"w{i}" for i in range(words)), "the answer is Mount Everest", *(f"x{i}" for i in range(9))])
    tok = word_tokenizer(context.split() + ["where", "is", "it", "?"])
    start = context.index("Mount Everest")
    example = SquadExample("q", "where is it ?", context, [("Mount Everest", start)])
    options = SquadOptions(doc_stride=5, max_query_length=8)
    windows = encode_windows(tok, [example], 20, options)
    assert len(windows) > 3 and all(len(w.ids) <= 20 for w in windows)
    spans = [[o for o in w.offsets if o is not None] for w in windows]
    for before, after in itertools.pairwise(spans):  # neighbours share doc_stride tokens
        assert len(set(before) & set(after)) == options.doc_stride
    labelled = [w for w in windows if w.start]
    assert labelled and all(w.offsets[w.start] is not None for w in labelled)
    for w in labelled:  # the labels read back to the answer's characters
        assert context[w.offsets[w.start][0]:w.offsets[w.end][1]] == "Mount Everest"
    holding = [w for w in windows if (start, start + 5) in w.offsets and (start + 6, start + 13) in w.offsets]
    assert labelled == holding  # every window holding the whole answer, and only those
    assert all((w.start, w.end) == (0, 0) for w in windows if w not in labelled)


def test_offsets_read_each_context_token_back():
    tok = word_tokenizer(CONTEXT.split() + ["q"])
    (window,) = encode_windows(tok, [SquadExample("q", "q", CONTEXT)], 128, SquadOptions(doc_stride=8))
    words = [CONTEXT[o[0]:o[1]] for o in window.offsets if o is not None]
    assert words == CONTEXT.split()
    assert window.offsets[:3] == [None, None, None]  # [CLS] q [SEP] are not context


def test_a_long_question_is_cut_to_max_query_length():
    tok = word_tokenizer(["a", "b", "c", "d", "x"])
    options = SquadOptions(doc_stride=8, max_query_length=2)
    (window,) = encode_windows(tok, [SquadExample("q", "a b c d", "x")], 32, options)
    assert tok.convert_ids_to_tokens(window.ids) == ["[CLS]", "a", "b", "[SEP]", "x", "[SEP]"]


def test_the_best_valid_span_wins():
    offsets = [None, (0, 4), (5, 9), (10, 14), None]
    start = np.array([9.0, 0.0, 4.0, 0.0, 8.0])
    end = np.array([9.0, 6.0, 0.0, 3.0, 8.0])
    # (2, 1) would score 10 but ends before it starts; [CLS] and [SEP] (None) are never answers
    assert best_span(offsets, start, end, 20, 30) == (7.0, 5, 14)  # start 2 (4) + end 3 (3)
    assert best_span(offsets, start, end, 20, 1) == (6.0, 0, 4)  # one token at most: (1, 1) beats (2, 2)
    assert best_span(offsets, start, end, 1, 30) is None  # only [CLS] among the top-1 candidates


def test_v2_answers_nothing_when_the_null_score_wins_by_more_than_the_threshold():
    example = SquadExample("q", "?", "alpha beta", [])
    windows = [Window([], 0, [None, (0, 5), (6, 10)]), Window([], 0, [None, (0, 5)])]
    # window 0: null 4, best span alpha..beta 2.5; window 1: null 7, its span alpha 0; the null score is the lowest
    start, end = [np.array([2.0, 1.5, 0.0]), np.array([3.5, 0.0])], [np.array([2.0, 0.0, 1.0]), np.array([3.5, 0.0])]
    for threshold, version, expected in ((0.0, 2, ""), (1.5, 2, "alpha beta"), (0.0, 1, "alpha beta")):
        options = SquadOptions(null_threshold=threshold)
        assert decode_answers([example], windows, start, end, options, version) == {"q": expected}


def test_normalisation_and_f1_by_hand():
    assert normalize_answer("  The  Eiffel-Tower, an icon!") == "eiffeltower icon"
    assert f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 1.0 * 0.75 / 1.75)  # 3 of 3 / 3 of 4
    assert f1("", "", version=2) == 1.0 and f1("", "", version=1) == 0.0 and f1("cat", "", version=2) == 0.0
    assert question_scores(["Paris", "the city of Paris"], "city of paris", 1) == (1, 1.0)
    assert question_scores(["New York City"], "York", 1) == (0, pytest.approx(0.5))  # p 1, r 1/3
    assert question_scores(["The", "cat"], "", 2) == (0, 0.0)  # v2.0 drops a gold that normalises to nothing


def test_squad_scores_by_hand():
    examples = [SquadExample("a", "", "", [("Denver Broncos", 0)]), SquadExample("b", "", "", [("blue", 0)]),
                SquadExample("c", "", "", []), SquadExample("d", "", "", [])]
    predictions = {"a": "the Broncos", "b": "blue", "c": "", "d": "red"}
    v2 = squad_scores(predictions, examples, 2)
    assert v2 == pytest.approx({"exact": 50.0, "f1": 100 * (2 / 3 + 1 + 1 + 0) / 4, "HasAns_exact": 50.0,
                                "HasAns_f1": 100 * (2 / 3 + 1) / 2, "NoAns_exact": 50.0, "NoAns_f1": 50.0})
    v1 = squad_scores({"a": "Denver", "b": "blue"}, examples[:2] + [SquadExample("e", "", "", [("x", 0)])], 1)
    assert v1 == pytest.approx({"exact": 100 / 3, "f1": 100 * (2 / 3 + 1 + 0) / 3})  # e: no prediction scores 0


def test_hub_rows_are_read_and_checked_like_the_files(monkeypatch):
    import datasets

    rows = {"validation": [{"id": "h1", "question": "q?", "context": "alpha beta",
                            "answers": {"text": ["beta", "beta"], "answer_start": [6, 6]}},
                           {"id": "h2", "question": "q?", "context": "alpha beta",
                            "answers": {"text": [], "answer_start": []}}]}
    asked = []

    def load_dataset(name, config, split):
        asked.append((name, split))
        return rows[split]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr("cramming.hub.offline_reason", lambda: None)  # as if the hub were reachable
    examples = read_squad_hub(SQUAD_TASKS["squad_v2"], "validation")
    assert asked == [("rajpurkar/squad_v2", "validation")]
    assert [(e.id, e.answers) for e in examples] == [("h1", [("beta", 6), ("beta", 6)]), ("h2", [])]
    with pytest.raises(UserError, match=r"hub:rajpurkar/squad validation row 1 \(question id h2\).*no answers"):
        read_squad_hub(SQUAD_TASKS["squad"], "validation")  # v1.1: every question has one
    rows["validation"][0]["answers"]["answer_start"][1] = 5
    with pytest.raises(UserError, match=r"row 0 \(question id h1\) answers\[1\]: answer 'beta' is not at answer_start"):
        read_squad_hub(SQUAD_TASKS["squad_v2"], "validation")


def test_offline_without_files_is_one_line_naming_the_hub_dataset_and_the_fix():
    with pytest.raises(UserError) as err:
        load_squad_examples("squad", None)
    assert "'rajpurkar/squad' is unreachable" in str(err.value) and "eval.data_dir=" in str(err.value)


def test_a_computed_position_table_grows_to_max_length_and_a_learned_one_refuses():
    config = SimpleNamespace(max_seq_length=128, position="scaled-sinusoidal", layout=["transformer"])
    fit_length(config, 384)
    assert config.max_seq_length == 384  # sinusoids are computed from the config: SQuAD's 384 tokens fit
    for position, layout, what in (("learned", "transformer", "learned position table"),
                                   ("rotary", ["gmlp"], "gmlp blocks' sequence-sized weights"),
                                   ("learned", ["gmlp", "attention"],
                                    "learned position table and gmlp blocks' sequence-sized weights")):
        with pytest.raises(UserError, match=rf"eval.recipe.max_length=384 is longer than this checkpoint's {what} "
                                            r"\(max_seq_length=128\); set eval.recipe.max_length=128"):
            fit_length(SimpleNamespace(max_seq_length=128, position=position, layout=layout), 384)
