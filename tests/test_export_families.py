"""Export to transformers' own architectures (cramming/families/, cramming/export_families.py): each family's
model gives our logits within families.TOLERANCE in fp32 on a padded batch (the issue's "exactly representable"),
each option a family cannot represent is refused naming it and the preset that can, and an exported folder has no
code and loads, generates and fills masks in a fresh interpreter where cramming cannot be imported."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import REPO, built_once, last_line_path, one_line_error, run_pretrain

from cramming.export_families import converted, logits_difference
from cramming.families import FAMILIES, TOLERANCE
from cramming.impl import Runtime
from cramming.model.arch import ArchConfig, AttentionConfig, RotaryConfig
from cramming.run import build_model

SPECIAL = {"pad": 0, "cls": 2, "sep": 3, "mask": 4}
TOKENIZER = types.SimpleNamespace(pad_token_id=0, cls_token_id=2, sep_token_id=3, mask_token_id=4, bos_token_id=None,
                                  eos_token_id=None)
SMALL = {"num_layers": 3, "hidden_size": 32, "num_heads": 4, "ffn_size": 64, "max_seq_length": 64}
LLAMA = {"objective": "clm", "norm": "rmsnorm", "ffn": "glu", "activation": "silu", "position": "rotary",
         "embedding_norm": False}
NEOX = {"objective": "clm", "ffn": "mlp", "position": "rotary", "rotary": RotaryConfig(pct=0.25),
        "embedding_norm": False}
MODERNBERT = {"position": "rotary", "first_attention_norm": False, "head_transform": True,
              "attention": AttentionConfig(pattern=["global", "local", "local"], window=4)}
BERT = {"ffn": "mlp", "norm_position": "post", "final_norm": False, "bias": True, "position": "learned",
        "head_transform": True}

# Each family with the variants the issue names: partial rotary, windows, tied and untied embeddings, biases or
# none, post- and pre-norm (BERT's and the others'), other activations and bases.
VARIANTS = [
    ("llama", LLAMA), ("llama", {**LLAMA, "tie_embeddings": False, "activation": "gelu", "norm_eps": 1e-6}),
    ("llama", {**LLAMA, "rotary": RotaryConfig(base=500.0)}),
    ("gpt-neox", NEOX), ("gpt-neox", {**NEOX, "rotary": RotaryConfig(pct=0.5), "tie_embeddings": False}),
    ("gpt-neox", {**NEOX, "rotary": RotaryConfig(pct=1.0), "activation": "relu"}),
    ("modernbert", MODERNBERT), ("modernbert", {**MODERNBERT, "bias": True, "tie_embeddings": False}),
    ("modernbert", {**MODERNBERT, "attention": AttentionConfig(pattern=["local", "global"], window=2)}),
    ("bert", BERT), ("bert", {**BERT, "bias": False, "tie_embeddings": False, "activation": "relu"}),
]


def our_model(seed=0, **options):
    """Ours at random weights, every tensor (norm gains and biases too) moved off its initial value, so a tensor
    mapped to the wrong place or a zero bias left out shows in the logits."""
    torch.manual_seed(seed)
    model = build_model(ArchConfig(**{**SMALL, **options}), 100, SPECIAL, Runtime(torch.device("cpu"), "fp32", False))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


@pytest.mark.parametrize("name,options", VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(VARIANTS)])
def test_each_family_gives_our_logits_on_a_padded_batch(name, options):
    model = our_model(**options)
    assert FAMILIES[name].misfit(model.config) is None
    theirs = converted(model, FAMILIES[name], TOKENIZER)
    assert type(theirs).__name__ == FAMILIES[name].model_class
    assert logits_difference(model, theirs, 100) <= TOLERANCE
    ours = model.state_dict()
    back = FAMILIES[name].back(theirs.state_dict(), model.config, {k: tuple(v.shape) for k, v in ours.items()})
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)  # read back exactly
    with torch.no_grad():  # the check itself sees one tensor a hair off
        next(p for n, p in theirs.named_parameters() if "layers.1" in n or "layer.1" in n).mul_(1.01)
    assert logits_difference(model, theirs, 100) > TOLERANCE


@pytest.mark.parametrize("name,options", [("gpt-neox", NEOX), ("bert", {**BERT, "bias": False})])
def test_an_export_whose_zeros_were_trained_since_is_not_read_back(name, options):
    """A tensor we lack is exported as zeros; trained since as the in-library class, it holds more than ours can."""
    model = our_model(**options)
    theirs = converted(model, FAMILIES[name], TOKENIZER).state_dict()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert FAMILIES[name].back(theirs, model.config, shapes) is not None
    zero = next(k for k, v in theirs.items() if k.endswith("bias") and not v.any())
    assert FAMILIES[name].back({**theirs, zero: theirs[zero] + 0.01}, model.config, shapes) is None
    wider = next(k for k in theirs if k.endswith("weight") and theirs[k].dim() == 2)
    assert FAMILIES[name].back({**theirs, wider: torch.zeros(3, 3)}, model.config, shapes) is None


def test_a_causal_family_gives_our_logits_on_a_left_padded_batch_too():
    model = our_model(**LLAMA)
    theirs = converted(model, FAMILIES["llama"], TOKENIZER)
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        ours, their = model(ids, attention_mask=mask).logits, theirs(input_ids=ids, attention_mask=mask).logits
    assert (ours - their).abs()[mask.bool()].max() <= TOLERANCE


# (options, family, the option named): the first option without a counterpart is the one the line names.
MISFITS = [
    ({}, "modernbert", "arch.position='scaled-sinusoidal'"),
    ({}, "bert", "arch.position='scaled-sinusoidal'"),
    ({"position": "learned"}, "bert", "arch.norm_position='pre'"),
    ({}, "llama", "arch.objective='mlm'"),
    ({**MODERNBERT, "first_attention_norm": True}, "modernbert", "arch.first_attention_norm=True"),
    ({**MODERNBERT, "head_transform": False}, "modernbert", "arch.head_transform=False"),
    ({**MODERNBERT, "attention": AttentionConfig(pattern=["stepped"])}, "modernbert", "arch.attention.pattern"),
    ({**LLAMA, "rotary": RotaryConfig(pct=0.5)}, "llama", "arch.rotary.pct=0.5"),
    ({**LLAMA, "bias": True}, "llama", "arch.bias=True"),
    ({**LLAMA, "embedding_norm": True}, "llama", "arch.embedding_norm=True"),
    ({**LLAMA, "rotary": RotaryConfig(interleaved=True)}, "llama", "arch.rotary.interleaved=True"),
    ({**NEOX, "bias": True}, "gpt-neox", "arch.bias=True"),
    ({**NEOX, "rotary": RotaryConfig(pct=0.375)}, "gpt-neox", "arch.rotary.pct=0.375"),
    ({**LLAMA, "value_embeddings": 1}, "llama", "arch.value_embeddings=1"),
    ({**LLAMA, "unet_skips": True}, "llama", "arch.unet_skips=True"),
    ({**LLAMA, "logit_softcap": 15.0}, "llama", "arch.logit_softcap=15.0"),
    ({**LLAMA, "qk_norm": True}, "llama", "arch.qk_norm=True"),
    ({**LLAMA, "parametrization": "mup"}, "llama", "arch.parametrization='mup'"),
    ({**LLAMA, "linear": "lowrank"}, "llama", "arch.linear='lowrank'"),
    ({**BERT, "layout": ["gmlp"]}, "bert", "arch.layout=['gmlp']"),
    ({**BERT, "objective": "rtd"}, "bert", "arch.objective='rtd'"),
]


@pytest.mark.parametrize("options,family,named", MISFITS)
def test_an_option_without_a_counterpart_is_named_with_the_presets_that_export(options, family, named):
    config = build_model(ArchConfig(**{**SMALL, **options}), 100, SPECIAL,
                         Runtime(torch.device("cpu"), "fp32", False)).config
    problem = FAMILIES[family].misfit(config)
    assert problem is not None and problem.startswith(named), problem
    presets = FAMILIES[family].presets
    assert f"arch={presets[0]}" in problem and f"arch={presets[1]}" in problem


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_familys_presets_train_a_model_it_exports(name):
    """The presets a refusal names build models the family fits (composed as Hydra composes them)."""
    from hydra import compose, initialize_config_dir

    from cramming.validation import load_config

    for preset in FAMILIES[name].presets:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            config = load_config(compose(config_name="pretrain", overrides=[f"arch={preset}", "impl=cpu"]))
        model = build_model(config.arch, 100, SPECIAL, Runtime(torch.device("cpu"), "fp32", False))
        assert FAMILIES[name].misfit(model.config) is None, preset


# ---------------------------------------------------------------- the command, on checkpoints of the presets


def preset_checkpoint(tmp_path_factory, preset: str):
    def build(folder):
        result = run_pretrain(f"arch={preset}", "impl=cpu", "train=cpu-smoke", "data=sanity", "train.max_steps=2",
                              "train.checkpoint_every_minutes=0.0001", f"name=export-{preset}",
                              run_dir=folder / "run", in_process=True)
        assert result.returncode == 0, result.stderr[-3000:]
        return str(last_line_path(result, "checkpoint: "))

    return Path(built_once(tmp_path_factory, f"export-{preset}", build))


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    return preset_checkpoint(tmp_path_factory, "llama-tiny")


@pytest.fixture(scope="module")
def modernbert_checkpoint(tmp_path_factory):
    return preset_checkpoint(tmp_path_factory, "modernbert-tiny")


def export(*args):
    return subprocess.run([sys.executable, "-m", "cramming.export", *map(str, args)], cwd=REPO, capture_output=True,
                          check=False, text=True, timeout=300)


# What the fresh interpreter runs: cramming is not importable there, the folder loads with transformers alone, and
# its logits (and greedy tokens) are printed for the test to compare with ours.
FRESH = """
import json, sys
sys.modules["cramming"] = None  # the package is not importable here
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, pipeline
folder, kind = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(folder)
auto = AutoModelForCausalLM if kind == "causal" else AutoModelForMaskedLM
model = auto.from_pretrained(folder).eval()
ids = torch.tensor(json.loads(sys.argv[3]))
out = {"class": type(model).__name__, "logits": model(input_ids=ids).logits.tolist()}
if kind == "causal":
    out["greedy"] = model.generate(ids[:1, :6], max_new_tokens=6, do_sample=False).tolist()
    out["pipeline"] = pipeline("text-generation", model=folder)("the", max_new_tokens=3)[0]["generated_text"]
else:
    fill = pipeline("fill-mask", model=folder)
    out["pipeline"] = fill(f"the {fill.tokenizer.mask_token} of")[0]["token_str"]
print(json.dumps(out))
"""


def in_fresh_interpreter(folder, kind, ids):
    result = subprocess.run([sys.executable, "-c", FRESH, str(folder), kind, json.dumps(ids.tolist())],
                            capture_output=True, text=True, timeout=300, cwd=folder, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def plain_folder(folder):
    """No code and nothing that names code: no .py, no auto_map in any JSON."""
    assert not list(folder.glob("*.py"))
    for path in folder.glob("*.json"):
        assert "auto_map" not in json.loads(path.read_text()), path


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
@pytest.mark.parametrize("kind", ["causal", "masked"])
def test_an_exported_folder_loads_generates_and_fills_masks_without_cramming(kind, request, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from cramming.eval.finetune import Checkpoint, auto_model

    checkpoint = request.getfixturevalue("llama_checkpoint" if kind == "causal" else "modernbert_checkpoint")
    family = "llama" if kind == "causal" else "modernbert"
    result = export(checkpoint, tmp_path / "out", "--as", family)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checked: " in result.stdout and f"exported: {tmp_path / 'out'}" in result.stdout
    plain_folder(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [FAMILIES[family].model_class] and config["pad_token_id"] == 0
    ours = auto_model(AutoModelForCausalLM if kind == "causal" else AutoModelForMaskedLM, Checkpoint(checkpoint),
                      random_init=False).eval()
    ids = torch.randint(5, ours.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    seen = in_fresh_interpreter(tmp_path / "out", kind, ids)
    assert seen["class"] == FAMILIES[family].model_class and seen["pipeline"]
    with torch.no_grad():
        assert (ours(input_ids=ids).logits - torch.tensor(seen["logits"])).abs().max() <= TOLERANCE
        if kind == "causal":
            greedy = ours.generate(ids[:1, :6], max_new_tokens=6, do_sample=False)
            assert greedy.tolist() == seen["greedy"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trust_remote_code" not in card and "custom_code" not in card


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
def test_a_step_folder_exports_beside_the_runs_other_exports(llama_checkpoint):
    step = max((llama_checkpoint.parent / "checkpoints").glob("step-*"))
    result = export(step, "--as", "llama")
    assert result.returncode == 0, result.stderr[-3000:]
    out = llama_checkpoint.parent / "exported" / f"{step.name}-llama"
    assert f"exported: {out}" in result.stdout
    plain_folder(out)


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
def test_families_says_which_fit_and_writes_nothing(modernbert_checkpoint):
    before = sorted(modernbert_checkpoint.parent.iterdir())
    result = export(modernbert_checkpoint, "--families")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["modernbert"].startswith("fits (--as modernbert")
    assert lines["bert"].startswith("arch.position='rotary' has no counterpart in BertForMaskedLM")
    assert lines["llama"].startswith("arch.objective='mlm'")
    assert sorted(modernbert_checkpoint.parent.iterdir()) == before


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
def test_a_family_the_checkpoint_does_not_fit_is_one_line_and_writes_nothing(modernbert_checkpoint, tmp_path):
    result = export(modernbert_checkpoint, tmp_path / "out", "--as", "bert")
    one_line_error(result, "arch.position='rotary' has no counterpart in BertForMaskedLM", "arch=bert-tiny")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
def test_an_export_into_a_folder_of_someone_elses_is_refused_and_left_as_it_is(modernbert_checkpoint, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = export(modernbert_checkpoint, out, "--as", "modernbert")
    one_line_error(result, str(out), "which cramming did not write")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
@pytest.mark.parametrize("kind", ["causal", "masked"])
def test_eval_gives_an_export_the_scores_of_its_original_seed_for_seed(kind, request, tmp_path):
    """eval.py reads an export of ours back into our classes: each seed's fine-tuning curve and dev score are the
    original checkpoint's, to the last digit."""
    import shutil

    from conftest import glue_folder, run_eval

    checkpoint = request.getfixturevalue("llama_checkpoint" if kind == "causal" else "modernbert_checkpoint")
    original = tmp_path / "original"
    shutil.copytree(checkpoint, original)  # eval.py adds its scores to the card: to a copy, not the shared one
    result = export(original, tmp_path / "exported", "--as", "llama" if kind == "causal" else "modernbert")
    assert result.returncode == 0, result.stderr[-3000:]
    glue = glue_folder(tmp_path)
    runs = {}
    for name in ("original", "exported"):
        result = run_eval(f"checkpoint={tmp_path / name}", f"eval.data_dir={glue}", "eval.tasks=[rte]", "eval.seeds=2",
                          "impl=cpu", "eval.recipe.epochs=2", "eval.recipe.batch_size=16",
                          tmp_path=tmp_path / f"ev-{name}", in_process=True)
        assert result.returncode == 0, result.stderr[-3000:]
        done = json.loads(last_line_path(result, "results: ").read_text())
        assert done["model_type"] == "crammed"
        runs[name] = [[{k: v for k, v in epoch.items() if k != "train_seconds"} for epoch in run["curve"]]
                      for run in done["models"]["pretrained"]["tasks"]["rte"]["runs"]]
    assert runs["exported"] == runs["original"] and len(runs["original"]) == 2


def test_onnx_as_and_families_are_one_at_a_time(tmp_path):
    result = export(tmp_path / "checkpoint", tmp_path / "out", "--as", "modernbert", "--onnx")
    one_line_error(result, "--onnx, --as and --families")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # pretrains its checkpoints (once per session) and runs the command
def test_an_export_of_ours_reads_back_and_any_other_in_library_folder_is_refused(modernbert_checkpoint, tmp_path):
    """An export keeps what it was exported from (train_summary.json), so it exports again; without that it is
    some other in-library model, which --as does not take."""
    assert export(modernbert_checkpoint, tmp_path / "out", "--as", "modernbert").returncode == 0
    again = export(tmp_path / "out", tmp_path / "again", "--as", "modernbert")
    assert again.returncode == 0, again.stderr[-2000:]
    weights = [(tmp_path / name / "model.safetensors").read_bytes() for name in ("out", "again")]
    assert weights[0] == weights[1]
    (tmp_path / "out" / "train_summary.json").unlink()
    one_line_error(export(tmp_path / "out", tmp_path / "other", "--as", "modernbert"), "already transformers' own")
    one_line_error(export(tmp_path / "out", "--families"), "already transformers' own")
