"""impl.precision=fp8 without a GPU: which layers of the project's own models train in float8 (the blocks' large
projections, never a head), torchao's swap on CPU (weights and state dict unchanged, checkpoints plain), an
emulated float8 step, and the one-line refusals on CPU and on GPUs before compute capability 8.9."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from safetensors.torch import load_file
from test_resume import TINY, config_for
from torch import nn

from cramming.config import Fp8Config
from cramming.engines import Engine
from cramming.errors import UserError
from cramming.impl import Runtime, resolve
from cramming.model import CrammedConfig
from cramming.model.electra import CrammedForReplacedTokenDetection
from cramming.model.heads import CrammedForSequenceClassification
from cramming.model.modeling_crammed import CrammedForMaskedLM
from cramming.run import build_model, place
from cramming.train.fp8 import convert_to_fp8, converts, torchao_problem

needs_torchao = pytest.mark.skipif(torchao_problem() is not None, reason=f"{torchao_problem()} (the fp8 extra)")
# crammed BERT's width; its head (768 x 1024 here) is big enough to convert, so only the block rule keeps it bf16
CRAMMED = {"hidden_size": 768, "num_heads": 12, "ffn_size": 3072, "num_layers": 2, "vocab_size": 1024}
SMALL = {"hidden_size": 256, "num_heads": 4, "ffn_size": 1024, "num_layers": 2, "vocab_size": 512}  # crammed-bert-tiny's
PROJECTIONS = ("attn.qkv", "attn.out", "ffn.up", "ffn.down")


DEFAULT_MIN = Fp8Config().min_elements


def chosen(model, min_elements=DEFAULT_MIN) -> set[str]:
    return {name for name, module in model.named_modules() if converts(name, module, min_elements)}


def blocks(prefix: str, layers: int) -> set[str]:
    return {f"{prefix}layers.{i}.{p}" for i in range(layers) for p in PROJECTIONS}


def test_crammed_bert_trains_every_block_projection_in_float8_and_no_head():
    model = CrammedForMaskedLM(CrammedConfig(**CRAMMED))
    assert chosen(model) == blocks("encoder.", 2)  # not `decoder`, the head tied to the embeddings


def test_small_widths_stay_bf16_unless_the_threshold_is_lowered():
    model = CrammedForMaskedLM(CrammedConfig(**SMALL))  # 256 x 768 = 196,608 weights at most: below 768 x 768
    assert chosen(model) == set()
    assert chosen(model, min_elements=0) == blocks("encoder.", 2)


def test_dims_not_divisible_by_16_stay_bf16():
    model = CrammedForMaskedLM(CrammedConfig(hidden_size=72, num_heads=4, ffn_size=160, num_layers=1,
                                             vocab_size=64))
    assert chosen(model, min_elements=0) == set()  # 72 % 16 = 8: every projection reads or writes the width


def test_electra_keeps_its_detector_and_small_generator_in_bf16():
    model = CrammedForReplacedTokenDetection(CrammedConfig(objective="rtd", **CRAMMED))
    assert {"detector.0", "detector.2"} <= {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert chosen(model) == blocks("encoder.", 2)  # the generator's blocks are a quarter as wide
    assert chosen(model, min_elements=0) == blocks("encoder.", 2) | blocks("generator.encoder.", 2)


def test_a_classifier_keeps_its_pooler_and_classifier():
    model = CrammedForSequenceClassification(CrammedConfig(**CRAMMED, num_labels=3))
    assert chosen(model, min_elements=0) == blocks("encoder.", 2)


@needs_torchao
def test_the_swap_keeps_weights_ties_and_marks():
    from torchao.float8.float8_linear import Float8Linear

    model = CrammedForMaskedLM(CrammedConfig(**SMALL, parametrization="mup"))
    keys, weights = list(model.state_dict()), {n: p for n, p in model.named_parameters()}
    converted = convert_to_fp8(model, Fp8Config(min_elements=0))
    assert set(converted) == blocks("encoder.", 2)
    modules = dict(model.named_modules())
    assert all(type(modules[name]) is Float8Linear for name in converted)
    assert type(model.decoder) is nn.Linear and model.decoder.weight is model.encoder.tokens.weight
    assert list(model.state_dict()) == keys
    assert all(p is weights[n] and type(p) is nn.Parameter for n, p in model.named_parameters())
    assert modules["encoder.layers.0.attn.out"].residual_output  # init's mark and muP's survive the swap
    assert all(modules[name].hidden_matrix for name in converted)


@needs_torchao
def test_a_converted_models_checkpoint_loads_into_a_plain_model(tmp_path, monkeypatch):
    from cramming.checkpoints import model_folder as checkpoint
    from cramming.data.tokenizer import train_tokenizer

    monkeypatch.setattr(checkpoint, "write_card", lambda folder, summary, head=None: None)  # the card reads a whole run's summary

    model = CrammedForMaskedLM(CrammedConfig(**SMALL))
    convert_to_fp8(model, Fp8Config(min_elements=0))
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20, "wordpiece", 100, 32)
    path = checkpoint.save_checkpoint(model, tokenizer, {"name": "fp8"}, tmp_path)
    saved = load_file(path / "model.safetensors")
    assert all(type(t) is torch.Tensor and t.dtype == torch.float32 for t in saved.values())
    plain = CrammedForMaskedLM.from_pretrained(path)
    assert type(plain.encoder.layers[0].attn.qkv) is not type(model.encoder.layers[0].attn.qkv)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[name], tensor, rtol=0, atol=0)


@needs_torchao
@pytest.mark.parametrize("recipe,granularity", [("tensorwise", "tensorwise"), ("rowwise", "axiswise")])
@pytest.mark.parametrize("emulate", [False, True])
def test_the_options_reach_torchaos_config(recipe, granularity, emulate):
    from cramming.train.fp8 import float8_config

    config = float8_config(Fp8Config(recipe=recipe, emulate=emulate))
    assert config.cast_config_weight.scaling_granularity.value == granularity and config.emulate == emulate


@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_an_emulated_float8_step_is_near_bf16_and_not_equal(recipe):
    """impl.fp8.emulate: torchao casts to float8 and back, so CPUs run the numerics float8 training has."""
    torch.manual_seed(0)
    ids = torch.randint(5, 512, (2, 32))
    labels = torch.where(torch.rand(ids.shape) < 0.25, ids, -100)
    plain = CrammedForMaskedLM(CrammedConfig(**SMALL))
    fp8 = CrammedForMaskedLM(CrammedConfig(**SMALL))
    fp8.load_state_dict(plain.state_dict())
    convert_to_fp8(fp8, Fp8Config(recipe=recipe, min_elements=0, emulate=True))
    losses = []
    for model in (plain, fp8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
    assert losses[0] != losses[1]  # the projections did run through float8
    torch.testing.assert_close(losses[1], losses[0], rtol=0.02, atol=0)
    grad = fp8.encoder.layers[0].attn.qkv.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


@needs_torchao
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_place_converts_only_under_fp8(precision):
    config = config_for(*TINY, f"impl.precision={precision}", "impl.fp8.emulate=true", "impl.fp8.min_elements=0")
    runtime = Runtime(torch.device("cpu"), precision, False)
    model = build_model(config.arch, 64, {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}, runtime)
    model, _, scaler, _ = place(config, model, runtime, Engine())
    names = {type(m).__name__ for m in model.modules()}
    assert ("Float8Linear" in names) == (precision == "fp8") and not scaler.is_enabled()


def test_fp8_autocasts_the_rest_in_bf16_and_measures_mfu_against_the_bf16_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    fp8, bf16 = (Runtime(torch.device("cuda", 0), p, compile=False) for p in ("fp8", "bf16"))
    assert fp8.autocast().keywords["dtype"] == torch.bfloat16 and not fp8.grad_scaler().is_enabled()
    assert fp8.peak_flops() == bf16.peak_flops() == 989.4e12


def impl(device="cuda", **fp8):
    return SimpleNamespace(device=device, precision="fp8", compile=False, attention="sdpa", rotary="torch",
                           loss="plain", compile_mode="default", peak_tflops=None, fp8=Fp8Config(**fp8))


def fake_gpu(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (7, 5)])
def test_gpus_before_ada_are_refused_in_one_line(capability, monkeypatch):
    fake_gpu(monkeypatch, capability)
    with pytest.raises(UserError) as refused:
        resolve(impl())
    assert str(refused.value) == ("impl.precision=fp8 needs a GPU of compute capability 8.9 or later (Ada, Hopper); "
                                  f"this one is {capability[0]}.{capability[1]} (use impl.precision=bf16)")


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_ada_and_hopper_pass(capability, monkeypatch):
    fake_gpu(monkeypatch, capability)
    runtime = resolve(impl())  # as far as a fake device goes: nothing here touches the GPU
    assert runtime.precision == "fp8" and runtime.device.type == "cuda"


def test_cpu_is_refused_unless_emulated():
    with pytest.raises(UserError, match=r"needs a GPU of compute capability 8\.9 .*this run is on cpu"):
        resolve(impl("cpu"))
    assert resolve(impl("cpu", emulate=True)).precision == "fp8"


def test_the_cli_refuses_fp8_on_cpu_in_one_line_before_any_work(tmp_path):
    result = subprocess.run([sys.executable, "pretrain.py", "impl=cpu", "impl.precision=fp8",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2 and result.stdout.strip() == ""  # torchao's import notes quieted too (__init__)
    if torchao_problem() is not None:  # a core install: the missing extra is said first, when the config loads
        assert result.stderr.strip().splitlines() == [f"error: impl.precision='fp8' is invalid: {torchao_problem()}"]
        return
    assert result.stderr.strip().splitlines() == [(
        "error: impl.precision=fp8 needs a GPU of compute capability 8.9 or later (Ada, Hopper); this run is on cpu "
        "(impl.precision=bf16 there, or impl.fp8.emulate=true to test)")]
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_fp8_section_is_checked_only_under_fp8():
    with pytest.raises(UserError, match=r"impl.fp8.recipe='colwise' is not a valid option; choose one of: rowwise, "
                                        "tensorwise"):
        config_for(*TINY, "impl.precision=fp8", "impl.fp8.recipe=colwise")
    assert config_for(*TINY, "impl.precision=bf16", "impl.fp8.recipe=colwise").impl.precision == "bf16"
    # DeepSpeed refuses fp8 itself (engines/deepspeed.py), with or without torchao
    with pytest.raises(UserError, match=r"impl.precision='fp8' is invalid: impl.distributed=deepspeed runs the "
                                        "model in its own precision; use impl.distributed=ddp, fsdp2 or none"):
        config_for(*TINY, "impl.precision=fp8", "impl.distributed=deepspeed")
