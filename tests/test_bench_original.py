"""scripts/bench_original.py: without the original code it says how to give it and stops cleanly; bad input is one
error line; with a checkout laid out as the original's (a stand-in model in it) it runs end to end."""

import json
import statistics
import subprocess
import sys

import pytest
from conftest import REPO


def run(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "bench_original.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def test_without_the_original_it_says_how_to_give_it_and_exits_0():
    result = run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("skipped: give --original PATH") and "JonasGeiping/cramming" in result.stdout


def test_bad_input_is_one_error_line(tmp_path):
    for args, fragment in ((["--sizes", "4x256,6x384"], "--sizes 6x384"), (["--rounds", "0"], "must be positive"),
                           (["--original", str(tmp_path)], "no cramming/architectures/crammed_bert.py")):
        result = run(*args)
        assert result.returncode != 0 and result.stderr.strip().splitlines()[-1].startswith("error: "), result.stderr
        assert fragment in result.stderr


FAKE_MODEL = '''
import torch


class Tiny(torch.nn.Module):
    """Stands in for the original's crammed BERT: same call (input_ids, labels) and output ({"loss": ...})."""

    def __init__(self, arch, vocab):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, arch.hidden_size)
        self.norm = torch.nn.LayerNorm(arch.hidden_size)
        self.decoder = torch.nn.Linear(arch.hidden_size, vocab, bias=False)

    def forward(self, input_ids, labels=None, **kwargs):
        logits = self.decoder(self.norm(self.embedding(input_ids)))
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)}


def construct_crammed_bert(arch, vocab):
    return Tiny(arch, vocab)
'''
FAKE_CONFIGS = {
    "arch/crammed-bert.yaml": "num_transformer_layers: 16\nhidden_size: 768\nintermed_size: 3072\n"
                              "hidden_dropout_prob: 0.1\nembedding: {dropout_prob: 0.1}\n"
                              "attention: {num_attention_heads: 12, dropout_prob: 0.1}\n",
    "train/bert-o4.yaml": "optim: {lr: 1.0e-3, betas: [0.9, 0.98], eps: 1.0e-12, weight_decay: 0.01}\n"
                          "limited_decay_keys: [bias, norm]\n",
    "train/optim/adam.yaml": "type: AdamW\nlr: 1.0e-4\nbetas: [0.9, 0.999]\neps: 1.0e-8\nweight_decay: 0.0\n",
}


def test_a_whole_run_against_a_stand_in_original(tmp_path):
    """The script end to end, with a checkout laid out as the original's (a stand-in model in its place): both sides
    step, the ratio comes from both sides' step times, and every step passes each phase hook once on both sides."""
    root = tmp_path / "original" / "cramming"
    (root / "architectures").mkdir(parents=True)
    (root / "architectures" / "crammed_bert.py").write_text(FAKE_MODEL)
    for name, text in FAKE_CONFIGS.items():
        (root / "config" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "config" / name).write_text(text)
    out = tmp_path / "bench.json"
    result = run("--original", str(tmp_path / "original"), "--sizes", "4x256", "--rounds", "2", "--steps", "2",
                 "--warmup", "1", "--batch", "2", "--seq", "32", "--vocab", "512", "--json", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    [size] = json.loads(out.read_text())["results"]
    assert size["size"] == "4x256" and size["loss_impl"] in ("fused", "plain")
    assert len(size["rounds"]) == 2
    for rnd in size["rounds"]:
        assert [len(rnd["step_times"][side]) for side in ("ours", "original")] == [2, 2]
        assert rnd["ratio"] == pytest.approx(statistics.median(rnd["step_times"]["original"])
                                             / statistics.median(rnd["step_times"]["ours"]))
    for side in ("ours", "original"):
        phases = size["phases_ms"][side]
        assert list(phases) == ["forward", "backward", "optimizer", "rest"] and all(ms > 0 for ms in phases.values())
    assert size["params"]["original"] == 512 * 256 * 2 + 2 * 256  # the stand-in's, read off the built model
    assert "ours/original tokens/s: median" in result.stdout
