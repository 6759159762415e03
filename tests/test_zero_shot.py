"""Zero-shot multiple choice (cramming/eval/zero_shot.py, harness.py): the readers and their one-line errors, the
scorer against a hand computation from the logits, acc_norm's per-character rule, and the built-in scorer against
lm-evaluation-harness itself, item by item, on the same HellaSwag-style file."""

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from cramming.errors import UserError
from cramming.eval.harness import LmEvalOptions, lm_eval_module
from cramming.eval.zero_shot import (
    causal_refusal,
    choose,
    hellaswag_item,
    loglikelihoods,
    read_items,
    score_items,
    split_tokens,
)

# HellaSwag's own rows (its JSONL: activity_label, ctx_a, ctx_b, endings, label), with WikiHow's bracket markers, a
# string label as on the hub, an empty ctx_b, and one long context that is cut from the left at max_length 96.
LONG = " ".join(["The people walked along the river and talked."] * 12)
CHEF = "A female chef in white uniform shows a stack of baking pans."
SKI = ", a person board a ski lift, while two men hold the head of the person wearing winter clothes."
HELLASWAG = [
    {"activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow covering the window.",
     "ctx_b": "then", "label": 3, "endings": [", the man adds wax to the windshield and cuts it.", SKI,
                                              ", the man puts on a christmas coat.", ", the man removes the snow."]},
    {"activity_label": "Baking cookies", "ctx_a": CHEF, "ctx_b": "the pans", "label": "3",
     "endings": ["contain egg yolks.", "are sprinkled with sugar.", "are in a strainer.", "are filled with pastries."]},
    {"activity_label": "Home and Garden", "ctx_a": "[header] How to clean a grill [title] Heat the grill.",
     "ctx_b": "", "endings": ["[step] Scrape it with a brush.", "Eat it.", "[substeps] Let it cool [title] rinse.",
                              "Paint it blue."], "label": 0},
    {"activity_label": "Long story", "ctx_a": LONG, "ctx_b": "they", "label": 3,
     "endings": ["sat down.", "flew to the moon on a bicycle.", "ate.", "went home slowly."]},
    {"activity_label": "Playing piano", "ctx_a": "A woman sits at a piano.", "ctx_b": "she",
     "endings": ["plays a song.", "eats the keys.", "sings loudly while dancing on the roof.", "leaves."], "label": 0},
    {"activity_label": "Running", "ctx_a": "A man is running on a track.", "ctx_b": "he",
     "endings": ["runs.", "stops and drinks water from a bottle.", "jumps.", "falls asleep."], "label": 1},
]
GENERIC = [
    {"context": "The sky is", "endings": ["blue.", "a sandwich made of old shoes."], "label": 0},
    {"context": "Two plus two is", "endings": ["four.", "five.", "a fish."], "label": 0},
    {"context": "She opened the door and ", "endings": ["walked in.", "the door."], "label": 0},
]
NO_AUTOCAST = contextlib.nullcontext  # fp32, as Runtime.autocast gives for impl.precision=fp32
# A local lm-eval task (dataset_path json, data_files) with lm-eval's own HellaSwag preprocessing.
HELLASWAG_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
output_type: multiple_choice
validation_split: validation
process_docs: !function hs_utils.process_docs
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GENERIC_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
output_type: multiple_choice
validation_split: validation
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{endings}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_tasks(root: Path) -> tuple[Path, Path]:
    """(data_dir with hellaswag.jsonl and generic.jsonl, an lm-eval include_path with the same two as tasks)."""
    data = root / "data"
    write_jsonl(data / "hellaswag.jsonl", HELLASWAG)
    write_jsonl(data / "generic.jsonl", GENERIC)
    yamls = root / "yamls"
    yamls.mkdir()
    (yamls / "hs_utils.py").write_text("from lm_eval.tasks.hellaswag.utils import process_docs  # noqa: F401\n")
    (yamls / "zs_hellaswag.yaml").write_text(HELLASWAG_YAML.format(name="zs_hellaswag", path=data / "hellaswag.jsonl"))
    (yamls / "zs_generic.yaml").write_text(GENERIC_YAML.format(name="zs_generic", path=data / "generic.jsonl"))
    return data, yamls


def needs_lm_eval():
    try:
        lm_eval_module()
    except UserError as err:
        pytest.skip(f"lm-evaluation-harness is not importable ({err})")


def test_hellaswag_rows_are_cleaned_as_lm_eval_cleans_them():
    needs_lm_eval()
    import datasets
    from lm_eval.tasks.hellaswag.utils import process_docs

    theirs = process_docs(datasets.Dataset.from_list([{**r, "label": str(r["label"])} for r in HELLASWAG]))
    for row, doc in zip(HELLASWAG, theirs):
        assert hellaswag_item(row) == (doc["query"], doc["choices"])
    assert hellaswag_item(HELLASWAG[2])[1][0] == " Scrape it with a brush."  # the marker goes, its space stays


def test_both_file_kinds_read(tmp_path):
    data, _ = write_tasks(tmp_path)
    items = read_items(data / "hellaswag.jsonl")
    assert [i.gold for i in items] == [3, 3, 0, 3, 0, 1]
    assert items[0].context.startswith("Removing ice from car: Then, the man") and items[0].context.endswith(" Then")
    generic = read_items(data / "generic.jsonl")
    assert generic[1].context == "Two plus two is" and generic[1].endings == ["four.", "five.", "a fish."]


@pytest.mark.parametrize("row, fragment", [
    ("{not json", "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ({"context": "x", "label": 0}, "missing field(s) endings"),
    ({"context": "x", "endings": ["a", "b"], "label": 2}, "label 2 is not an index into its 2 endings"),
    ({"context": "x", "endings": ["a", "b"], "label": -1}, "label -1"),
    ({"context": "x", "endings": ["a", "b"], "label": True}, "label True"),
    ({"context": "x", "endings": "ab", "label": 0}, "endings must be a list of at least two strings"),
    ({"context": " ", "endings": ["a", "b"], "label": 0}, "empty context"),
    ({"context": "x", "endings": ["a", ""], "label": 0}, "an ending is empty"),
    ({"context": "x", "ctx_a": "y", "endings": ["a", "b"], "label": 0}, "missing field(s) activity_label, ctx_b"),
])
def test_a_bad_row_names_its_file_and_line(tmp_path, row, fragment):
    path = write_jsonl(tmp_path / "t.jsonl", [GENERIC[0], "", GENERIC[1], row])  # line 4: a blank line counts
    if isinstance(row, dict) and "ctx_a" in row:
        path = write_jsonl(tmp_path / "t.jsonl", [HELLASWAG[0], "", HELLASWAG[1], {k: v for k, v in row.items()
                                                                                   if k != "context"}])
    with pytest.raises(UserError, match="t.jsonl:4: ") as err:
        read_items(path)
    assert fragment in str(err.value)


def test_missing_and_empty_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_items(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="no items"):
        read_items(write_jsonl(tmp_path / "empty.jsonl", [""]))


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_the_token_split_is_lm_evals(kind):
    """split_tokens against lm-eval's own `_encode_pair` (its causal branch) on each tokenizer kind a causal checkpoint
    can ship; a context's trailing space moves into the continuation (byte-level BPE and unigram then differ)."""
    needs_lm_eval()
    from types import SimpleNamespace

    from lm_eval.api.model import TemplateLM

    from cramming.data.tokenizer import for_generation, train_tokenizer

    texts = ["the sky is blue and the sea is green.", "she opened the door and walked in.", "a man runs daily."] * 20
    tokenizer = for_generation(train_tokenizer(texts, kind, 120, 64))
    wrapper = SimpleNamespace(backend="causal", tok_encode=lambda text, **_: tokenizer.encode(text))
    for context, ending in [("The sky is", "blue."), ("She opened the door and ", "walked in."), ("A man", "runs")]:
        theirs = TemplateLM._encode_pair(wrapper, context, " " + ending)  # lm-eval adds the target delimiter
        assert split_tokens(tokenizer, context, ending) == tuple(theirs)



def test_a_long_pair_is_cut_from_the_left_as_lm_eval_cuts_it():
    """lm-eval's rule (HFLM._loglikelihood_tokens): the input is (context + ending)[-(max_length + 1):][:-1], so
    the model sees max_length tokens, the last one unfed, and each ending token is scored where the token before it
    stands. A model that gives each next id (input + 1) all its mass scores a counting ending at about 0."""
    fed = []

    class Counter(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            fed.extend(row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask))
            return type("Out", (), {"logits": F.one_hot(input_ids + 1, 64).float() * 50})

    pairs = [(list(range(1, 9)), [9, 10]), ([20, 21], [22])]  # one longer than max_length, one shorter
    scores = loglikelihoods(Counter(), pairs, 5, 2, 0, "cpu", NO_AUTOCAST)
    assert sorted(fed) == [[5, 6, 7, 8, 9], [20, 21]]
    assert scores == [pytest.approx(0.0, abs=1e-12)] * 2

def test_acc_norm_divides_by_the_ending_length_in_characters():
    # acc takes the best sum; acc_norm the best sum per character of the ending itself (not its " " delimiter):
    # -2/1 < -3.5/2, while with the delimiter counted -2/2 > -3.5/3 would pick the first.
    assert choose([-2.0, -3.5], ["a", "bb"]) == (0, 1)
    assert choose([-10.0, -12.0], ["ab", "abcdefgh"]) == (0, 1)
    assert choose([-1.0, -1.0], ["a", "b"]) == (0, 0)  # ties go to the first, as numpy's argmax


def test_the_scorer_refuses_a_model_without_a_causal_head(smoke_checkpoint, causal_checkpoint):
    refusal = causal_refusal(AutoConfig.from_pretrained(smoke_checkpoint, trust_remote_code=True))
    assert "no causal LM head" in refusal and "eval=glue" in refusal
    assert causal_refusal(AutoConfig.from_pretrained(causal_checkpoint, trust_remote_code=True)) is None


@pytest.fixture(scope="module")
def causal(causal_checkpoint):
    model = AutoModelForCausalLM.from_pretrained(causal_checkpoint, trust_remote_code=True).eval()
    return model, AutoTokenizer.from_pretrained(causal_checkpoint, trust_remote_code=True)


def test_an_endings_loglikelihood_is_the_hand_computed_sum(causal):
    model, tokenizer = causal
    context, ending = split_tokens(tokenizer, "A woman sits at a piano. She", "plays a song.")
    assert tokenizer.decode(ending).strip() == "plays a song." and context[0] == tokenizer.cls_token_id
    with torch.no_grad():
        logits = model(torch.tensor([context + ending])).logits[0]
    logprobs = F.log_softmax(logits.float(), dim=-1)
    by_hand = sum(logprobs[len(context) - 1 + k, token].item() for k, token in enumerate(ending))
    # In a batch with a longer and a shorter row, so this one is padded on the right and another is not.
    texts = [("The sky is", "blue."), ("A man runs on a long track every morning before work. He", "stops to drink.")]
    pairs = [split_tokens(tokenizer, c, e) for c, e in texts]
    scores = loglikelihoods(model, [pairs[0], (context, ending), pairs[1]], 128, 3, tokenizer.pad_token_id, "cpu",
                            NO_AUTOCAST)
    assert scores[1] == pytest.approx(by_hand, rel=1e-5)
    alone = loglikelihoods(model, [pairs[1]], 128, 1, tokenizer.pad_token_id, "cpu", NO_AUTOCAST)
    assert scores[2] == pytest.approx(alone[0], rel=1e-5)


def test_the_built_in_scorer_matches_lm_eval_item_by_item(causal, causal_checkpoint, tmp_path):
    """The strongest check: lm-eval's own HF wrapper on the same checkpoint and files (a local YAML task) gives the
    same per-ending log-likelihoods, so the same acc and acc_norm on every item, with left truncation at 96."""
    needs_lm_eval()
    from cramming.eval.harness import harness_lm, run_harness, task_metrics
    from cramming.impl import Runtime

    model, tokenizer = causal
    data, yamls = write_tasks(tmp_path)
    options = LmEvalOptions(include_path=str(yamls), batch_size=3)
    lm = harness_lm(str(causal_checkpoint), tokenizer, Runtime(torch.device("cpu"), "fp32", False), options, 96,
                    random_init=False)
    for task, file in (("zs_hellaswag", "hellaswag.jsonl"), ("zs_generic", "generic.jsonl")):
        theirs = run_harness(lm, task, options, seed=0, log_samples=True)
        ours = score_items(model, tokenizer, read_items(data / file), 96, 3, "cpu", NO_AUTOCAST)
        samples = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert len(samples) == len(ours["loglikelihoods"])
        for sample, lls in zip(samples, ours["loglikelihoods"]):
            assert lls == pytest.approx([r[0][0] for r in sample["resps"]], rel=1e-5, abs=1e-4)
        assert {"acc": ours["acc"], "acc_norm": ours["acc_norm"]} == pytest.approx(task_metrics(theirs, task))
        assert ours["acc"] == pytest.approx(100 * sum(s["acc"] for s in samples) / len(samples))
        assert ours["acc_norm"] == pytest.approx(100 * sum(s["acc_norm"] for s in samples) / len(samples))


def test_lm_evals_plain_command_agrees_with_ours(causal, causal_checkpoint, tmp_path):
    """`lm_eval --model hf --model_args pretrained=<ckpt>,trust_remote_code=True`, as a user types it: nothing to add
    (the tokenizer names [CLS] its bos token, lm-eval's prefix), and the same acc and acc_norm as eval=zero-shot."""
    needs_lm_eval()
    import lm_eval
    from lm_eval.tasks import TaskManager

    model, tokenizer = causal
    assert tokenizer.bos_token == tokenizer.cls_token and tokenizer.eos_token == tokenizer.sep_token
    data, yamls = write_tasks(tmp_path)
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={causal_checkpoint},trust_remote_code=True",
                                  tasks=["zs_hellaswag"], task_manager=TaskManager(include_path=str(yamls)),
                                  log_samples=True, device="cpu")  # --device cpu: the harness's default is cuda
    ours = score_items(model, tokenizer, read_items(data / "hellaswag.jsonl"), model.config.max_seq_length, 3, "cpu",
                       NO_AUTOCAST)
    samples = sorted(out["samples"]["zs_hellaswag"], key=lambda s: s["doc_id"])
    for sample, lls in zip(samples, ours["loglikelihoods"], strict=True):
        assert lls == pytest.approx([r[0][0] for r in sample["resps"]], rel=1e-5, abs=1e-4)
    from cramming.eval.harness import task_metrics

    assert {"acc": ours["acc"], "acc_norm": ours["acc_norm"]} == pytest.approx(task_metrics(out, "zs_hellaswag"))


def test_without_lm_eval_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'cramming\[lm-eval\]'"):
        lm_eval_module()


def test_an_ending_longer_than_max_length_is_one_line(causal, tmp_path):
    model, tokenizer = causal
    items = read_items(write_jsonl(tmp_path / "generic.jsonl", GENERIC))
    longest = max(len(split_tokens(tokenizer, i.context, e)[1]) for i in items for e in i.endings)
    score_items(model, tokenizer, items, longest, 3, "cpu", NO_AUTOCAST)  # an ending may fill the whole window
    with pytest.raises(UserError, match=f"eval.recipe.max_length={longest - 1}: an ending has {longest} tokens"):
        score_items(model, tokenizer, items, longest - 1, 3, "cpu", NO_AUTOCAST)


def test_lm_eval_task_problems_are_one_line_before_any_model(tmp_path):
    needs_lm_eval()
    from cramming.eval.harness import check_task, task_manager

    data, yamls = write_tasks(tmp_path)
    manager = task_manager(LmEvalOptions(include_path=str(yamls)))
    check_task("zs_generic", manager)
    with pytest.raises(UserError, match="lm-eval knows no task 'zs_nothing'"):
        check_task("zs_nothing", manager)
    write_jsonl(data / "generic.jsonl", [GENERIC[0], "{broken"])
    with pytest.raises(UserError, match="'zs_generic': its data could not be loaded: JSON parse error"):
        check_task("zs_generic", manager)
    (data / "generic.jsonl").unlink()
    with pytest.raises(UserError, match="'zs_generic': its data could not be loaded"):
        check_task("zs_generic", manager)
    with pytest.raises(UserError, match="eval.lm_eval.include_path='/nowhere' is not a folder"):
        task_manager(LmEvalOptions(include_path="/nowhere"))
