"""impl.precision=auto on CPUs: bf16 where the processor multiplies bf16 matrices natively and a probe measures it
faster, fp32 elsewhere and for evaluation; bf16 training follows fp32's losses; a resumed run keeps its precision."""

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from hydra import compose, initialize_config_dir
from test_resume import sigterm_at  # noqa: F401  (a fixture)

from cramming import impl
from cramming.checkpoints.step_folder import MARKER
from cramming.pretraining import pin_precision
from cramming.run import build_run
from cramming.validation import load_config

TINY = ["arch=crammed-bert-tiny", "arch.num_layers=2", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "data.vocab_size=512", "data.seq_length=32"]


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=[*TINY, *overrides]))


def auto_impl(**changes):
    fields = {"device": "cpu", "precision": "auto", "compile": False, "attention": "sdpa", "rotary": "torch",
              "loss": "plain", "compile_mode": "default", "peak_tflops": None}
    return SimpleNamespace(**{**fields, **changes})


@pytest.fixture
def cpu(monkeypatch):
    """The CPU as the test says it is: its native bf16 instruction sets and the probe's measured speed-up."""
    def set_cpu(native: list[str], speedup: float = 3.0):
        monkeypatch.setattr(impl, "native_bf16", lambda: list(native))
        monkeypatch.setattr(impl, "bf16_speedup", lambda *a, **k: speedup)
        impl.cpu_precision.cache_clear()
    yield set_cpu
    impl.cpu_precision.cache_clear()


def test_a_cpu_without_native_bf16_keeps_fp32(cpu):
    cpu([], speedup=10.0)  # whatever a probe would say, emulated bf16 is never chosen
    runtime = impl.resolve(auto_impl())
    assert runtime.precision == "fp32" and runtime.autocast() is contextlib.nullcontext
    assert "no native bf16" in runtime.why


@pytest.mark.parametrize("native", [["AMX", "AVX512-BF16"], ["AVX512-BF16"]])
def test_native_bf16_measured_faster_pretrains_in_bf16_and_says_why(cpu, native):
    cpu(native, speedup=2.6)
    runtime = impl.resolve(auto_impl())
    assert runtime.precision == "bf16"
    assert ", ".join(native) in runtime.why and "2.6x" in runtime.why
    with runtime.autocast()():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_native_bf16_measured_slower_than_the_threshold_keeps_fp32(cpu):
    cpu(["AVX512-BF16"], speedup=impl.BF16_MIN_SPEEDUP * 0.9)
    runtime = impl.resolve(auto_impl())
    assert runtime.precision == "fp32" and "measured" in runtime.why


def test_evaluation_follows_its_own_rule_and_an_explicit_precision_wins(cpu):
    cpu(["AMX"], speedup=6.0)
    assert impl.resolve(auto_impl(), training=False).precision == impl.CPU_EVAL_PRECISION[0]
    assert impl.resolve(auto_impl(precision="fp32")).precision == "fp32"
    assert impl.resolve(auto_impl(precision="fp32")).why == ""  # only auto explains itself


def test_the_real_probe_measures_a_positive_ratio():
    """The probe times real products: a ratio, not a constant (bf16 slower than fp32 gives a value below 1)."""
    ratio = impl.bf16_speedup(n=128, repeats=2)
    assert ratio > 0 and ratio != 1.0


def losses(precision: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    run = build_run(config_for(f"impl.precision={precision}", "train.lr=1e-3"))
    generator = torch.Generator().manual_seed(0)
    # counting rows (5 + (start + i) % 50): learnable, so the loss falls and a drift would show
    starts = [torch.randint(0, 50, (8, 1), generator=generator) for _ in range(steps)]
    batches = [5 + (start + torch.arange(32)) % 50 for start in starts]
    out = []
    for i, ids in enumerate(batches):
        generator.manual_seed(100 + i)  # the same masks for both precisions
        out.append(float(run.step(ids, generator)))
    return out


def test_bf16_losses_follow_fp32_step_by_step():
    """bf16 autocast keeps fp32 weights, optimizer and loss reduction; its matmuls round their inputs to 8 bits of
    mantissa (relative error about 2^-8 per product), and the errors average out over the loss's sums. Over 30 steps
    of a small MLM whose loss falls by more than a tenth, every step's loss stays within 0.5 % of fp32's (measured:
    within 0.01 %), and the two fall alike."""
    fp32, bf16 = losses("fp32", 30), losses("bf16", 30)
    assert fp32 != bf16  # bf16 really ran: its numbers differ
    assert fp32[-1] < fp32[0] * 0.9
    worst = max(abs(a - b) / a for a, b in zip(fp32, bf16, strict=True))
    assert worst < 0.005, (worst, fp32, bf16)
    assert abs((fp32[0] - fp32[-1]) - (bf16[0] - bf16[-1])) < 0.1 * (fp32[0] - fp32[-1])


def step_folder(tmp_path: Path, marker: dict) -> Path:
    step = tmp_path / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (step / MARKER).write_text(json.dumps(marker))
    return step


def test_a_resumed_run_keeps_the_precision_its_checkpoint_trained_in(cpu, tmp_path):
    config = config_for("impl.precision=auto")
    said = []
    cpu([])  # this machine would choose fp32 ...
    runtime = impl.resolve(config.impl, config.arch)
    assert runtime.precision == "fp32"
    found = step_folder(tmp_path, {"step": 4, "world": 1, "precision": "bf16"})  # ... the run trained in bf16
    pinned = pin_precision(config, runtime, found, lambda line, **_: said.append(line))
    assert pinned.precision == "bf16" and "keeps its precision" in said[0]
    assert pin_precision(config, runtime, None, said.append) is runtime  # a fresh run: auto's choice
    explicit = config_for("impl.precision=fp32")
    assert pin_precision(explicit, runtime, found, said.append) is runtime  # an explicit precision is the user's


def test_a_step_folder_from_before_markers_said_precision_resumes_in_fp32_on_cpu(cpu, tmp_path):
    """Before this change auto meant fp32 on every CPU: such a run resumes bitwise in fp32 on a bf16 CPU."""
    config = config_for("impl.precision=auto")
    cpu(["AMX"], speedup=6.0)
    runtime = impl.resolve(config.impl, config.arch)
    assert runtime.precision == "bf16"
    found = step_folder(tmp_path, {"step": 4, "world": 1})
    assert pin_precision(config, runtime, found, lambda *a, **k: None).precision == "fp32"


def test_resume_under_auto_bf16_is_bitwise_and_its_marker_says_bf16(cpu, sigterm_at, tmp_path):  # noqa: F811
    """A CPU run that auto put in bf16, stopped at step 2 of 6 and resumed, ends with the uninterrupted run's
    weights bit for bit; its step folder's marker records bf16, which a resume on any machine keeps."""
    from safetensors.torch import load_file
    from test_resume import NAN_RUN, whole_and_resumed

    cpu(["AMX"], speedup=6.0)
    whole, resumed = whole_and_resumed([*NAN_RUN, "impl.precision=auto", "train.checkpoint_every_minutes=null"],
                                       sigterm_at, tmp_path)
    assert whole["precision"] == resumed["precision"] == "bf16"
    marker = json.loads((Path(resumed["resumed_from"]) / MARKER).read_text())
    assert marker["precision"] == "bf16"
    want, got = (load_file(tmp_path / d / "checkpoint" / "model.safetensors") for d in ("whole", "stopped"))
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)


def qkv(dtype, seq=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, seq, 8, generator=g).to(dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("spec", [{}, {"causal": True}, {"window": 3}, {"alibi": True, "causal": True}, {"topk": 4},
                                  {"padding": "last-5"}, {"documents": "two"}])
def test_the_matmul_kernel_is_the_eager_formula_in_the_inputs_dtype(spec):
    """fp32 inputs: eager's numbers, forward and backward. bf16 inputs: eager's to bf16 precision (its products
    round q, k, the probabilities and v to 8 bits of mantissa), and its output and gradients stay bf16."""
    from cramming.model.attention import eager_attention, matmul_attention
    from cramming.model.attention_masks import AttentionSpec

    fields = dict(spec)
    if fields.get("padding") == "last-5":
        fields["padding"] = torch.arange(16).expand(2, 16) < 11
    if fields.get("documents") == "two":
        fields["documents"] = (torch.arange(16) >= 7).long().expand(2, 16)
    spec = AttentionSpec(**fields)
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, 3e-2)):
        grads = []
        for kernel in (eager_attention, matmul_attention):
            q, k, v = qkv(dtype)
            out = kernel(q, k, v, spec)
            out.float().square().sum().backward()
            grads.append((out, q.grad, k.grad, v.grad))
        for want, got in zip(*grads, strict=True):
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want.float(), rtol=tolerance, atol=tolerance)
        if dtype == torch.bfloat16 and spec.topk is None:  # its products really ran in bf16
            assert not torch.equal(grads[0][0], grads[1][0])


def test_auto_attention_on_cpu_is_matmul_in_bf16_and_sdpa_in_fp32(cpu):
    cpu(["AMX"], speedup=6.0)
    assert impl.resolve(auto_impl(attention="auto")).attention == "matmul"
    assert impl.resolve(auto_impl(attention="auto", precision="fp32")).attention == "sdpa"
    assert impl.resolve(auto_impl(attention="sdpa")).attention == "sdpa"  # an explicit kernel is kept
