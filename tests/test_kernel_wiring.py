"""impl.attention / impl.rotary: what `auto` picks, explicit Triton requests that cannot be served fail loudly,
and the Triton paths train a model to the same losses as the PyTorch paths (under the interpreter on CPU)."""

import json
import os

import pytest
import torch
from conftest import REPO, needs_shared, one_line_error, run_pretrain  # noqa: F401

from cramming import impl
from cramming.config import ArchConfig, AttentionConfig, ImplConfig
from cramming.errors import UserError
from cramming.kernels import HAVE_TRITON

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
CPU = torch.device("cpu")


def test_auto_picks_the_pytorch_paths_on_cpu():
    assert impl.resolve_kernels("auto", "auto", ArchConfig(), CPU) == ("sdpa", "torch")
    assert impl.resolve_kernels("eager", "torch", ArchConfig(), CPU) == ("eager", "torch")


@needs_triton
def test_auto_picks_triton_on_cuda_unless_the_model_needs_dropout():
    cuda = torch.device("cuda")
    assert impl.resolve_kernels("auto", "auto", ArchConfig(), cuda) == ("triton", "triton")
    assert impl.resolve_kernels("auto", "auto", ArchConfig(attention_dropout=0.1), cuda) == ("sdpa", "triton")


@needs_triton
def test_explicit_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError, match=r"impl.attention=triton cannot serve this run: .*CUDA GPU"):
        impl.resolve_kernels("triton", "torch", ArchConfig(), CPU)
    with pytest.raises(UserError, match=r"impl.rotary=triton cannot serve this run: .*CUDA GPU"):
        impl.resolve_kernels("sdpa", "triton", ArchConfig(), CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert impl.resolve_kernels("triton", "triton", ArchConfig(), CPU) == ("triton", "triton")


@needs_triton
def test_explicit_triton_refuses_what_the_kernel_cannot_do(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(UserError, match="no attention dropout"):
        impl.resolve_kernels("triton", "auto", ArchConfig(attention_dropout=0.1), CPU)
    with pytest.raises(UserError, match="head dims up to 256"):
        impl.resolve_kernels("triton", "auto", ArchConfig(hidden_size=1024, num_heads=2), CPU)


@needs_triton
@pytest.mark.parametrize("arch,reason", [
    (ArchConfig(attention=AttentionConfig(pattern=["stepped"])), "not stepped"),
    (ArchConfig(attention=AttentionConfig(pattern=["global", "topk"])), "not topk"),
    (ArchConfig(position="rpe"), "relative-position bias"),
])
def test_triton_refuses_patterns_it_does_not_implement(arch, reason, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(UserError, match=reason):
        impl.resolve_kernels("triton", "auto", arch, CPU)


def test_auto_picks_eager_for_topk_and_sdpa_refuses_it():
    arch = ArchConfig(attention=AttentionConfig(pattern=["topk"]))
    assert impl.resolve_kernels("auto", "auto", arch, CPU) == ("eager", "torch")
    with pytest.raises(UserError, match=r"impl.attention=sdpa cannot serve this run: .*top-k.*impl.attention=eager"):
        impl.resolve_kernels("sdpa", "auto", arch, CPU)


def test_missing_triton_is_explained(monkeypatch):
    monkeypatch.setattr("cramming.kernels.HAVE_TRITON", False)
    with pytest.raises(UserError, match="triton package is not installed"):
        impl.resolve_kernels("triton", "torch", ArchConfig(), CPU)
    assert impl.resolve(ImplConfig(device="cpu", precision="fp32"), ArchConfig()).attention == "sdpa"


@needs_triton
def test_cli_error_for_triton_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity",
                          "impl.attention=triton", run_dir=tmp_path, in_process=True)
    one_line_error(result, "impl.attention=triton", "CUDA GPU")
    assert not (tmp_path / "checkpoint").exists()


def tiny_pair(**arch):
    """Two copies of one small model: Triton kernels and PyTorch paths."""
    from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM

    base = dict(vocab_size=61, hidden_size=32, num_layers=2, num_heads=2, ffn_size=64, max_seq_length=24,
                init_std=0.2, hidden_dropout=0.0, attention_dropout=0.0, **arch)
    head = CrammedForCausalLM if arch.get("objective") == "clm" else CrammedForMaskedLM
    torch.manual_seed(0)
    reference = head(CrammedConfig(**base, attention_impl="sdpa", rotary_impl="torch"))
    fused = head(CrammedConfig(**base, attention_impl="triton", rotary_impl="triton"))
    fused.load_state_dict(reference.state_dict())
    return reference, fused


@needs_triton
@pytest.mark.parametrize("arch", [
    dict(position="rotary", rotary_pct=0.5),
    dict(position="alibi", attention_pattern=["local", "global"], attention_window=3),
    dict(position="rotary", rotary_interleaved=True, objective="clm"),
])
def test_triton_paths_match_pytorch_in_the_model(arch, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reference, fused = tiny_pair(**arch)
    ids = torch.randint(5, 61, (2, 19), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    results = []
    for model in (reference, fused):
        logits = model(ids, attention_mask=mask).logits
        (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        results.append((logits, [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    for got, want in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@needs_triton
def test_compiled_model_keeps_the_triton_ops_in_one_graph(monkeypatch):
    """Both kernels are torch.library custom ops: torch.compile(fullgraph=True) must not break on them."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reference, fused = tiny_pair(position="rotary", rotary_pct=0.5)
    compiled = torch.compile(fused, fullgraph=True)
    ids = torch.randint(5, 61, (2, 16), generator=torch.Generator().manual_seed(2))
    want = reference(ids).logits
    got = compiled(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(fused.encoder.layers[0].attn.qkv.weight.grad,
                               reference.encoder.layers[0].attn.qkv.weight.grad, atol=1e-4, rtol=1e-4)


@needs_triton
def test_pretrain_with_the_triton_kernels_matches_sdpa(tmp_path):
    """The issue's command: impl.attention=triton impl.rotary=triton arch.position=rotary trains (under the
    interpreter here), with the same losses as the PyTorch paths, and saves a portable checkpoint."""
    common = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
              "arch.ffn_size=128", "arch.position=rotary", "arch.rotary.pct=0.5", "impl=cpu", "train=cpu-smoke",
              "train.batch_size=8", "train.max_steps=3", "train.validation_sequences=8", "data=sanity",
              "data.vocab_size=256", "data.seq_length=32", "data.max_chars=40000", "data.validation_fraction=0.1"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    losses = {}
    for kernels in (("sdpa", "torch"), ("triton", "triton")):
        run_dir = tmp_path / kernels[0]
        result = run_pretrain(*common, f"impl.attention={kernels[0]}", f"impl.rotary={kernels[1]}",
                              run_dir=run_dir, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"attention {kernels[0]}, rotary {kernels[1]}" in result.stdout
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[kernels[0]] = [r["loss"] for r in records if "loss" in r] + [records[-1]["val_loss"]]
        saved = json.loads((run_dir / "checkpoint" / "config.json").read_text())
        assert (saved["attention_impl"], saved["rotary_impl"], saved["loss_impl"]) == ("sdpa", "torch", "plain")
    assert len(losses["triton"]) == 4
    assert losses["triton"] == pytest.approx(losses["sdpa"], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("interpret, arch, name, others", [
    (False, ArchConfig(), "triton", "sdpa, eager or matmul"),  # no GPU: Triton cannot run, the PyTorch kernels can
    (True, ArchConfig(attention_dropout=0.1), "triton", "sdpa, eager or matmul"),
    (True, ArchConfig(attention=AttentionConfig(pattern=["topk"])), "sdpa", "eager or matmul"),  # top-k: the scores
    (True, ArchConfig(position="rpe"), "triton", "sdpa, eager or matmul"),
])
def test_a_refused_kernel_names_every_kernel_that_can_serve_the_run(interpret, arch, name, others, monkeypatch):
    """The message's alternatives are asked of the registry, in auto's order, not a fixed name."""
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError) as err:
        impl.resolve_kernels(name, "torch", arch, CPU)
    assert str(err.value).endswith(f"; or use impl.attention={others}")
