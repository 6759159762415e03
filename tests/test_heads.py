"""The token-classification, question-answering and multiple-choice heads (model/heads.py), for MLM and causal
checkpoints: shapes, losses against hand computations, the encoder loaded from a checkpoint, what a causal encoder
lets each position see, and loading through the Auto classes where cramming was never imported."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from cramming.model import (
    CrammedConfig,
    CrammedForCausalLM,
    CrammedForMaskedLM,
    CrammedForMultipleChoice,
    CrammedForQuestionAnswering,
    CrammedForTokenClassification,
    auto_map_of,
)
from cramming.pretraining import pretrain
from cramming.validation import load_config

TINY = {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "ffn_size": 64, "max_seq_length": 16}
HEADS = [CrammedForTokenClassification, CrammedForQuestionAnswering, CrammedForMultipleChoice]
HEAD_WEIGHTS = {"classifier.weight", "classifier.bias", "qa_outputs.weight", "qa_outputs.bias",
                "classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight",
                "classifier.out_proj.bias"}


def tiny(objective: str, cls, **overrides):
    torch.manual_seed(0)
    return cls(CrammedConfig(**TINY, objective=objective, **overrides)).eval()


def ids(*shape, seed=0):
    return torch.randint(5, 97, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_token_classifier_shapes_and_loss(objective):
    model = tiny(objective, CrammedForTokenClassification, num_labels=5)
    x = ids(3, 10)
    labels = torch.randint(0, 5, (3, 10), generator=torch.Generator().manual_seed(1))
    labels[:, :2] = -100  # [CLS] and a continuation piece: no label
    labels[1, 6] = -100
    out = model(x, labels=labels)
    assert out.logits.shape == (3, 10, 5)
    keep = labels != -100
    logp = out.logits.log_softmax(-1)[keep]
    want = -logp[torch.arange(int(keep.sum())), labels[keep]].mean()
    torch.testing.assert_close(out.loss, want)


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_question_answering_shapes_and_bert_clamped_loss(objective):
    model = tiny(objective, CrammedForQuestionAnswering)
    x = ids(4, 10)
    start = torch.tensor([2, 50, -3, 7])  # 50: the answer was truncated away; -3 clamps to position 0
    end = torch.tensor([4, 60, 1, 10])  # 10 == seq: also outside the sequence
    out = model(x, start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == (4, 10)

    def ce(logits, positions):  # BERT: clamp into [0, seq]; seq itself is ignored
        terms = [-logits[i].log_softmax(-1)[p] for i, p in enumerate(positions.clamp(0, 10).tolist()) if p != 10]
        return torch.stack(terms).mean()

    want = (ce(out.start_logits, start) + ce(out.end_logits, end)) / 2
    torch.testing.assert_close(out.loss, want)


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_multiple_choice_scores_each_choice_alone(objective):
    """Each choice's score is the pooled head on that choice encoded by itself; the loss is CE over the choices."""
    model = tiny(objective, CrammedForMultipleChoice)
    x = ids(2, 4, 9)
    labels = torch.tensor([3, 1])
    out = model(x, labels=labels)
    assert out.logits.shape == (2, 4)
    for b in range(2):
        for c in range(4):
            hidden = model.encoder(x[b, c][None]).last_hidden_state[0]
            token = hidden[-1] if objective == "clm" else hidden[0]
            score = model.classifier.out_proj(model.classifier.dense(token).tanh())[0]
            torch.testing.assert_close(out.logits[b, c], score, rtol=1e-5, atol=1e-6)
    want = -(out.logits.log_softmax(-1)[torch.arange(2), labels]).mean()
    torch.testing.assert_close(out.loss, want)


def test_causal_multiple_choice_pools_the_last_real_token():
    """Padding on the right moves no score: the pooled token is the last real one, which saw the whole choice."""
    model = tiny("clm", CrammedForMultipleChoice)
    x = ids(1, 3, 8)
    padded = torch.cat([x, torch.zeros(1, 3, 4, dtype=x.dtype)], dim=2)
    mask = torch.cat([torch.ones(1, 3, 8), torch.zeros(1, 3, 4)], dim=2).long()
    mask[0, 1, 6:] = 0  # the second choice is shorter
    padded[0, 1, 6:8] = 0
    got = model(padded, attention_mask=mask).logits
    torch.testing.assert_close(got[0, [0, 2]], model(x).logits[0, [0, 2]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[0, 1], model(x[:, 1:2, :6]).logits[0, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_a_causal_token_classifier_sees_only_the_left_context(objective):
    model = tiny(objective, CrammedForTokenClassification, num_labels=3)
    x = ids(2, 12)
    changed = x.clone()
    changed[:, 7:] = ids(2, 5, seed=5)
    before, after = model(x).logits, model(changed).logits
    if objective == "clm":
        torch.testing.assert_close(before[:, :7], after[:, :7])
    else:  # bidirectional: every token reads the later ones
        assert not torch.allclose(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


@pytest.mark.parametrize("objective, pretrained", [("mlm", CrammedForMaskedLM), ("clm", CrammedForCausalLM)])
@pytest.mark.parametrize("head", HEADS)
def test_heads_take_the_checkpoints_encoder(objective, pretrained, head, tmp_path):
    """from_pretrained fills the encoder from the checkpoint (nothing of it missing) and initialises only the head."""
    source = tiny(objective, pretrained)
    source.config.auto_map = auto_map_of(source)
    source.save_pretrained(tmp_path)
    model, info = head.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) <= HEAD_WEIGHTS and info["missing_keys"], info
    weights = load_file(tmp_path / "model.safetensors")
    for name, tensor in model.encoder.state_dict().items():
        assert torch.equal(tensor, weights[f"encoder.{name}"]), name


CONF = Path(__file__).resolve().parents[1] / "conf"
RUN = ["arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128", "impl=cpu",
       "train=cpu-smoke", "train.batch_size=16", "train.max_steps=2", "train.validation_sequences=16", "data=sanity",
       "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1"]

LOAD_HEADS = """
    import json, sys, torch
    from safetensors.torch import load_file
    from transformers import AutoModelForMultipleChoice, AutoModelForQuestionAnswering, AutoModelForTokenClassification
    path = {path!r}
    weights = load_file(path + "/model.safetensors")
    x = torch.randint(5, 200, (2, 3, 12))
    out = {{}}
    for auto in (AutoModelForTokenClassification, AutoModelForQuestionAnswering, AutoModelForMultipleChoice):
        model, info = auto.from_pretrained(path, trust_remote_code=True, num_labels=4, output_loading_info=True)
        model.eval()
        same = all(torch.equal(t, weights["encoder." + n]) for n, t in model.encoder.state_dict().items())
        result = model(x) if auto is AutoModelForMultipleChoice else model(x[:, 0])
        shapes = [list(v.shape) for k, v in result.items() if k.endswith("logits")]
        out[auto.__name__] = [type(model).__name__, same, sorted(info["missing_keys"]), shapes]
    assert "cramming" not in sys.modules
    print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["crammed-bert-tiny", "gpt-tiny"])
def test_a_checkpoint_loads_as_each_head_in_a_fresh_interpreter(arch, tmp_path):
    """pretrain's checkpoint folder carries heads.py and names the heads in auto_map; Python without cramming loads
    each with the checkpoint's encoder."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = load_config(compose(config_name="pretrain", overrides=[f"arch={arch}", *RUN]))
    path = pretrain(config, tmp_path / "run")["checkpoint"]
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD_HEADS.format(path=path))], check=False,
                            capture_output=True, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.rpartition("RESULT ")[2])
    assert out == {
        "AutoModelForTokenClassification": ["CrammedForTokenClassification", True,
                                            ["classifier.bias", "classifier.weight"], [[2, 12, 4]]],
        "AutoModelForQuestionAnswering": ["CrammedForQuestionAnswering", True,
                                          ["qa_outputs.bias", "qa_outputs.weight"], [[2, 12], [2, 12]]],
        "AutoModelForMultipleChoice": ["CrammedForMultipleChoice", True,
                                       ["classifier.dense.bias", "classifier.dense.weight",
                                        "classifier.out_proj.bias", "classifier.out_proj.weight"],
                                       [[2, 3]]],
    }
