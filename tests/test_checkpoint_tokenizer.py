"""The tokenizer a checkpoint ships, as a Hugging Face user meets it: causal checkpoints prompt like the start of a
document and decode with spaces; MLM checkpoints keep [CLS] ... [SEP] for GLUE; loading it neither prompts nor warns."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from transformers import PreTrainedTokenizerFast

from cramming.data.tokenizer import for_generation, train_tokenizer
from cramming.pretraining import pretrain
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = ["arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128", "impl=cpu",
        "train=cpu-smoke", "train.batch_size=16", "train.max_steps=3", "train.validation_sequences=16", "data=sanity",
        "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1"]
PROMPT = "The python standard library"


def checkpoint(tmp_path_factory, arch: str) -> Path:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = load_config(compose(config_name="pretrain", overrides=[f"arch={arch}", *TINY]))
    return Path(pretrain(config, tmp_path_factory.mktemp(arch))["checkpoint"])


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory):
    return checkpoint(tmp_path_factory, "gpt-tiny")


@pytest.fixture(scope="module")
def mlm_checkpoint(tmp_path_factory):
    return checkpoint(tmp_path_factory, "crammed-bert-tiny")


def fresh_python(script: str, cwd: Path) -> dict:
    """Run `script` where cramming was never imported, stdin closed (a prompt would read EOF), and return the JSON
    it prints after `RESULT `, with everything it wrote."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=False, capture_output=True,
                            text=True, cwd=cwd, stdin=subprocess.DEVNULL, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.rpartition("RESULT ")[2])
    return {**out, "stdout": result.stdout, "stderr": result.stderr}


GENERATE = """
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    path, prompt = {path!r}, {prompt!r}
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    assert "cramming" not in sys.modules
    # only whole words may come next, so the expected text is known from the tokens alone
    not_words = [i for t, i in tok.get_vocab().items() if not t.isalpha()]
    enc = tok(prompt, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=4, do_sample=False, suppress_tokens=not_words, pad_token_id=0)
    only_sep = [i for i in range(len(tok)) if i != tok.sep_token_id]  # the model ends the document at once
    ended = model.generate(**enc, max_new_tokens=4, do_sample=False, suppress_tokens=only_sep, pad_token_id=0)
    pipe = pipeline("text-generation", model=path, trust_remote_code=True)
    text = pipe(prompt, max_new_tokens=4, do_sample=False, suppress_tokens=not_words)[0]["generated_text"]
    new = out[0, enc["input_ids"].shape[1]:]
    pair = tok("a b", "c d")["input_ids"]
    print("RESULT " + json.dumps(dict(
        prompt_ids=enc["input_ids"][0].tolist(), out=out[0].tolist(), text=text, cls=tok.cls_token_id,
        sep=tok.sep_token_id, new_tokens=tok.convert_ids_to_tokens(new),
        decoded=tok.decode(out[0], skip_special_tokens=True), pair_tokens=tok.convert_ids_to_tokens(pair),
        ended=ended[0].tolist())))
"""


def test_causal_checkpoint_prompts_like_a_document_start_and_generates_spaced_text(causal_checkpoint):
    got = fresh_python(GENERATE.format(path=str(causal_checkpoint), prompt=PROMPT), causal_checkpoint.parent)
    ids, out = got["prompt_ids"], got["out"]
    assert ids[0] == got["cls"] and got["sep"] not in ids, got["prompt_ids"]  # [CLS] prompt, never closed
    assert out[:len(ids)] == ids and len(out) == len(ids) + 4
    assert got["ended"] == ids + [got["sep"]]  # [SEP] ends a document, so generation stops there
    words = got["new_tokens"]
    assert all(w.isalpha() for w in words), words
    # the pipeline appends decode(new tokens) to the prompt: one space before each word
    assert got["text"] == PROMPT + "".join(" " + w for w in words), got["text"]
    assert got["decoded"].strip() == " ".join([PROMPT.lower(), *words])
    assert got["pair_tokens"] == ["[CLS]", "a", "b", "[SEP]", "c", "d"]  # two texts: one document after another


def test_mlm_checkpoint_keeps_cls_and_sep(mlm_checkpoint):
    tok = PreTrainedTokenizerFast.from_pretrained(mlm_checkpoint)
    assert tok.convert_ids_to_tokens(tok("a b")["input_ids"]) == ["[CLS]", "a", "b", "[SEP]"]
    assert tok.convert_ids_to_tokens(tok("a b", "c d")["input_ids"]) == ["[CLS]", "a", "b", "[SEP]", "c", "d", "[SEP]"]
    assert tok.decode(tok("the python standard library.")["input_ids"], skip_special_tokens=True) == (
        "the python standard library.")


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_generation_tokenizer_spaces_a_continuation_for_every_kind(kind):
    """What the pipeline does, for each built-in kind: decode the new tokens and append them to the prompt."""
    tok = for_generation(train_tokenizer(["the quick brown fox jumps over the lazy dog, again."] * 20, kind, 120, 32))
    prompt, whole = tok("the quick")["input_ids"], tok("the quick brown fox")["input_ids"]
    assert tok.convert_ids_to_tokens(prompt)[0] == "[CLS]" and tok.sep_token_id not in whole
    assert whole[:len(prompt)] == prompt
    assert "the quick" + tok.decode(whole[len(prompt):]) == "the quick brown fox"


LOAD = """
    import json, sys, time
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    path, start = {path!r}, time.time()
    auto = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    plain = PreTrainedTokenizerFast.from_pretrained(path)
    seconds = time.time() - start
    same = auto("a b")["input_ids"] == plain("a b")["input_ids"] and len(auto) == len(plain)
    print("RESULT " + json.dumps(dict(fast=[isinstance(t, PreTrainedTokenizerFast) for t in (auto, plain)], same=same,
                                      load_seconds=seconds)))
"""


def test_the_documented_tokenizer_loads_neither_prompt_nor_warn(mlm_checkpoint):
    """The two ways docs/pretraining.md gives to load a checkpoint's tokenizer: quick, quiet, with stdin closed, no cramming."""
    got = fresh_python(LOAD.format(path=str(mlm_checkpoint)), mlm_checkpoint.parent)
    assert got["fast"] == [True, True] and got["same"]
    assert "[y/N]" not in got["stdout"] and "custom code" not in got["stdout"] + got["stderr"]
    assert "model of type" not in got["stderr"] + got["stdout"], got["stderr"][-2000:]
    assert got["load_seconds"] < 15, got["load_seconds"]  # a prompt at a terminal alone waits 15 s


def test_without_the_flag_transformers_still_asks(mlm_checkpoint):
    """What docs/pretraining.md warns about: transformers 5's AutoTokenizer loads config.json before the tokenizer files,
    and a config with custom code makes it ask. If this starts passing quietly, that warning can go."""
    script = f"from transformers import AutoTokenizer; AutoTokenizer.from_pretrained({str(mlm_checkpoint)!r})"
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, cwd=mlm_checkpoint.parent, timeout=120)
    assert "Do you wish to run the custom code? [y/N]" in result.stdout, result.stdout[-2000:]
