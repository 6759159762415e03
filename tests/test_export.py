"""python -m cramming.export: a run's intermediate checkpoints/step-<n> becomes a Hugging Face model folder that
loads with AutoModelFor... and trust_remote_code, without this package, holding exactly the step's weights."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import one_line_error
from safetensors.torch import load_file
from test_resume import NAN_RUN, config_for

from cramming import pretraining
from cramming.export import export_step


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    pretraining.pretrain(config_for(*NAN_RUN, "name=dynamics", "train.checkpoint_every_minutes=0.0001",
                                    "train.keep_checkpoints=3"), run_dir)
    return run_dir, sorted((run_dir / "checkpoints").glob("step-*"))


def test_a_step_exports_with_its_own_weights_and_a_card(steps):
    run_dir, folders = steps
    assert len(folders) >= 2
    first, last = folders[0], folders[-1]
    out = export_step(first)
    assert out == (run_dir / "exported" / first.name).resolve()
    weights = load_file(out / "model.safetensors")
    saved = torch.load(first / "state.pt", weights_only=False)
    assert weights and all(torch.equal(weights[k], saved["model"][k]) for k in weights)
    other = load_file(export_step(last) / "model.safetensors")
    assert any(not torch.equal(other[k], weights[k]) for k in weights)  # another step, other weights
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] and (out / "tokenizer.json").is_file()
    card = (out / "README.md").read_text()
    step = saved["state"]["step"]
    assert f"(step {step:,})" in card and "not measured at this step" in card and "pipeline_tag: fill-mask" in card


@pytest.mark.slow
def test_an_exported_step_loads_without_the_package(steps, tmp_path):
    _, folders = steps
    out = export_step(folders[0], tmp_path / "step")
    code = ("import sys, torch; from transformers import AutoModelForMaskedLM, AutoTokenizer; "
            "assert 'cramming' not in sys.modules; "
            f"m = AutoModelForMaskedLM.from_pretrained({str(out)!r}, trust_remote_code=True); "
            f"t = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True); "
            "ids = t('def main(): return 1', return_tensors='pt'); "
            "print(m(**ids).logits.shape[-1], 'cramming' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "False"
    bad = subprocess.run([sys.executable, "-m", "cramming.export", str(tmp_path)], capture_output=True, text=True,
                         timeout=300, check=False)
    one_line_error(bad, "is not a complete step folder")


@pytest.mark.slow
def test_the_onnx_export_runs_in_onnxruntime_as_in_pytorch(steps, tmp_path):
    """python -m cramming.export --onnx: dynamic batch and sequence, the mask an input; onnxruntime's logits on a
    padded batch of other shapes than the example's equal PyTorch's within 1e-4 (checked here again, not only by the
    command); a model the exporter cannot take is one line."""
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    from cramming.export_onnx import example
    from cramming.model import CrammedForMaskedLM

    _, folders = steps
    model_folder = export_step(folders[-1], tmp_path / "model")
    done = subprocess.run([sys.executable, "-m", "cramming.export", "--onnx", str(model_folder), str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == f"onnx: {tmp_path / 'm.onnx'}" and "checked: onnxruntime's" in done.stdout
    assert not done.stderr.strip(), done.stderr[-2000:]  # the exporter's chatter kept off the console
    model = CrammedForMaskedLM.from_pretrained(model_folder).eval()
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    for rows, seq in ((1, 5), (4, 23)):
        inputs = example(model.config, rows, seq, padded_rows=min(rows, 2), seed=rows)
        got = torch.from_numpy(session.run(None, {k: v.numpy() for k, v in inputs.items()})[0])
        with torch.no_grad():
            want = model(**inputs).logits
        assert (got - want).abs()[inputs["attention_mask"].bool()].max() < 1e-4
    bad = subprocess.run([sys.executable, "-m", "cramming.export", "--onnx", str(tmp_path)], capture_output=True,
                         text=True, timeout=300, check=False)
    one_line_error(bad, "not a model folder")
