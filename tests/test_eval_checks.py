"""eval.py's checks before any work (impl keys, cut-short weights, an unreachable hub) and what a run reports
(comparability and why, each skipped task's own reason, the fp16 grad scaler, one progress bar for the run)."""

import json
import shutil
import time

import pytest
import torch
from conftest import REPO, one_line_error
from safetensors.torch import save_file
from test_eval_cli import FAST, evaluate_in_process, run_eval

from cramming import hub
from cramming.checkpoints.model_folder import SUMMARY, check_safetensors
from cramming.errors import UserError
from cramming.eval import recipe as evaluation
from cramming.eval.tasks import GLUE_SET, GLUE_TASKS
from cramming.hub import OFFLINE_VARIABLES


def eval_config(*overrides):
    from hydra import compose, initialize_config_dir

    from cramming.validation.eval import load_eval_config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_eval_config(compose(config_name="eval", overrides=list(overrides)))


# ---------------------------------------------------------------- impl keys


@pytest.mark.parametrize("precision,fragment", [("fp4", "auto, bf16, fp16, fp32, fp8"),
                                                 ("fp8", "float8 is for pretraining")])
def test_bad_precision_is_one_line_error_before_any_work(precision, fragment, smoke_checkpoint, tmp_path):
    """fp8 is a pretraining precision (cramming/train/fp8.py): fine-tuning refuses it rather than run bf16 quietly."""
    result = run_eval(f"checkpoint={smoke_checkpoint}", *FAST, f"impl.precision={precision}", tmp_path=tmp_path,
                      in_process=True)
    one_line_error(result, f"impl.precision='{precision}'", fragment)
    assert not (tmp_path / "eval" / "results.json").exists()


# ---------------------------------------------------------------- weights written whole


def test_cut_short_weights_are_one_line_error(smoke_checkpoint, tmp_path):
    folder = tmp_path / "run" / "checkpoint"
    shutil.copytree(smoke_checkpoint, folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(size // 2)
    result = run_eval(f"checkpoint={folder}", *FAST, tmp_path=tmp_path, in_process=True)
    one_line_error(result, str(weights), "cut short", f"{size:,}")


def test_unfinished_checkpoint_tmp_is_refused(smoke_checkpoint, tmp_path):
    """A checkpoint.tmp/ with whole weights but no completion marker: the write was killed before it ended."""
    folder = tmp_path / "run" / "checkpoint.tmp"
    shutil.copytree(smoke_checkpoint, folder)
    (folder / SUMMARY).unlink()
    with pytest.raises(UserError, match=f"checkpoint {folder} is an unfinished write.*{SUMMARY}"):
        evaluation.check_checkpoint(folder)
    (folder / SUMMARY).write_text("{}")  # killed after the marker, before the rename: whole
    evaluation.check_checkpoint(folder)


def test_safetensors_header_checks(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(64), "b": torch.zeros(3, 5)}, str(path))
    check_safetensors(path)  # whole: no error
    whole = path.read_bytes()
    for data, fragment in ((whole[:5], "not even its header"), (whole[:20], "not even its header"),
                           (whole[:-1], "cut short"), (whole + b"\0", "longer than its header says"),
                           (len(b"[1, 2]").to_bytes(8, "little") + b"[1, 2]", "not a safetensors file")):
        path.write_bytes(data)
        with pytest.raises(UserError, match=fragment) as err:
            check_safetensors(path)
        assert str(path) in str(err.value)


def test_sharded_checkpoint_missing_shard(smoke_checkpoint, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(smoke_checkpoint, folder)
    (folder / "model.safetensors").unlink()
    save_file({"a": torch.ones(4)}, str(folder / "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="model-00002-of-00002.safetensors: missing"):
        evaluation.check_checkpoint(folder)


# ---------------------------------------------------------------- the hub


def offline_env(monkeypatch, tmp_path, network: str):
    """HF_HUB_OFFLINE=1 ("flag"), a refused endpoint ("refused"), or the real huggingface.co ("real")."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached copy to fall back on
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    if network == "flag":
        return
    for name in OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if network == "refused":
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    else:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        if hub._probe("https://huggingface.co") is None:
            pytest.skip("huggingface.co is reachable from this machine: the no-network case cannot be seen here")


@pytest.mark.parametrize("network", ["flag", "refused", "real"])
def test_offline_hub_is_detected_once_and_fast(monkeypatch, tmp_path, capfd, network):
    offline_env(monkeypatch, tmp_path, network)
    hub._probe.cache_clear()
    config = eval_config("checkpoint=somewhere", "eval.data_dir=null", "eval.tasks=[rte,cola,sst2]",
                         "eval.skip_missing=true")
    started = time.perf_counter()
    with pytest.raises(UserError, match="no task could be loaded .rte, cola, sst2.: the hub dataset") as err:
        evaluation.load_tasks(config)
    assert time.perf_counter() - started < 5.0
    assert str(err.value).count("unreachable") == 1 and "eval.data_dir=<glue_data folder>" in str(err.value)
    captured = capfd.readouterr()
    assert "Retry" not in captured.out + captured.err
    for name in ("rte", "cola", "sst2"):  # each task's reason names that task
        assert f"skipping {name}: {name}: the hub dataset 'nyu-mll/glue' is unreachable" in captured.out


@pytest.mark.parametrize("network", ["flag", "refused"])
def test_offline_eval_cli_says_one_line(smoke_checkpoint, monkeypatch, tmp_path, network):
    offline_env(monkeypatch, tmp_path, network)
    result = run_eval(f"checkpoint={smoke_checkpoint}", "eval.data_dir=null", *FAST, tmp_path=tmp_path, timeout=120)
    one_line_error(result, "cola: the hub dataset 'nyu-mll/glue' is unreachable", "eval.data_dir=<glue_data folder>")
    assert "Retry" not in result.stdout + result.stderr
    assert ("HF_HUB_OFFLINE=1 is set" if network == "flag" else "cannot connect to 127.0.0.1:9") in result.stderr


def test_hub_failure_after_probe_is_tried_once_and_each_task_names_itself(monkeypatch, capsys):
    """The probe passed but the hub itself failed: later tasks do not wait for it again, and each skip reason
    names its own task; the final error gives the cause once."""
    import datasets

    calls = []

    def failing_load_dataset(path, config):
        calls.append(config)
        raise ConnectionError("503 Service Unavailable")

    monkeypatch.setattr(hub, "offline_reason", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", failing_load_dataset)
    config = eval_config("checkpoint=somewhere", "eval.data_dir=null", "eval.tasks=[rte,cola,qnli]",
                         "eval.skip_missing=true")
    with pytest.raises(UserError, match="no task could be loaded .rte, cola, qnli.: the hub") as err:
        evaluation.load_tasks(config)
    assert calls == ["rte"] and str(err.value).count("503 Service Unavailable") == 1
    out = capsys.readouterr().out
    for name in ("rte", "cola", "qnli"):
        assert f"skipping {name}: {name}: the hub dataset 'nyu-mll/glue' is unreachable (ConnectionError: 503" in out


# ---------------------------------------------------------------- comparable or not, and why


def fake_glue(root, names, train_rows: int = 8, dev_rows: int = 4):
    """A glue_data/ folder with a few rows per task, laid out as each task's spec reads it."""
    for name in names:
        spec = GLUE_TASKS.get_or_explain(name)
        folder = root / "glue_data" / spec.folder
        folder.mkdir(parents=True)
        header = list(spec.no_header or (*spec.text_columns, spec.label_column))
        for file, n in [("train.tsv", train_rows)] + [(f, dev_rows) for _, f, _ in spec.dev_splits]:
            lines = [] if spec.no_header else ["\t".join(header)]
            for i in range(n):
                label = str(i % 5 / 2) if spec.raw_labels is None else spec.raw_labels[i % len(spec.raw_labels)]
                row = {c: f"sentence {i} of {c}" for c in header} | {spec.label_column: label}
                lines.append("\t".join(row[c] for c in header))
            (folder / file).write_text("\n".join(lines) + "\n")
    return root / "glue_data"


def test_only_the_whole_uncapped_task_set_is_comparable(smoke_checkpoint, tmp_path, capsys):
    glue = fake_glue(tmp_path, GLUE_SET)
    path = evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", *FAST,
                               tmp_path=tmp_path / "full")
    results = json.loads(path.read_text())
    assert results["comparable"] is True and results["not_comparable_because"] == {}
    assert "not comparable" not in capsys.readouterr().out

    shutil.rmtree(glue / "QNLI")
    path = evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", *FAST,
                               "eval.tasks=[rte,qnli]", "eval.skip_missing=true", tmp_path=tmp_path / "partial")
    results = json.loads(path.read_text())
    left_out = [t for t in GLUE_SET if t not in ("rte", "qnli")]
    assert results["comparable"] is False
    assert results["not_comparable_because"] == {"skipped_tasks": ["qnli"], "tasks_left_out": left_out}
    out = capsys.readouterr().out
    note = "(not comparable to published GLUE scores: skipped qnli; not in eval.tasks: " + ", ".join(left_out) + ")"
    assert out.index(note) > out.index("| model | RTE | avg |")  # under the table

    path = evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", *FAST,
                               "eval.tasks=[rte]", "eval.max_train_examples=4", tmp_path=tmp_path / "capped")
    why = json.loads(path.read_text())["not_comparable_because"]
    assert why["max_train_examples"] == 4 and "skipped_tasks" not in why


def test_the_capped_subset_is_the_same_for_every_seed(tmp_path):
    """eval.max_train_examples takes the same random examples whatever the seed: scores then differ by the
    fine-tuning alone."""
    glue = fake_glue(tmp_path, ["rte"], train_rows=40)
    subsets = []
    for seed in (0, 7):
        config = eval_config("checkpoint=/dev/null", f"eval.data_dir={glue}", "eval.tasks=[rte]",
                             "eval.max_train_examples=10", f"seed={seed}")
        (task,), _ = evaluation.load_tasks(config)
        subsets.append([example.text_a for example in task.train])
    assert subsets[0] == subsets[1] and len(set(subsets[0])) == 10
    assert subsets[0] != [f"sentence {i} of sentence1" for i in range(10)]  # drawn, not the first rows


def test_random_init_baseline_is_an_untrained_twin(smoke_checkpoint, tmp_path):
    """Same seed, data and recipe, so only the starting weights differ: were the checkpoint's weights loaded for
    both models, or for neither, the two runs would be the same on CPU, loss for loss."""
    glue = fake_glue(tmp_path, ["rte"], train_rows=20, dev_rows=2)
    path = evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", "eval.tasks=[rte]", *FAST,
                               "eval.baseline=random-init", tmp_path=tmp_path)
    models = json.loads(path.read_text())["models"]
    losses = [[c["train_loss"] for c in models[m]["tasks"]["rte"]["runs"][0]["curve"]] for m in models]
    assert list(models) == ["pretrained", "random-init"] and losses[0] != losses[1], losses


# ---------------------------------------------------------------- fp16 grad scaler (optimizer_step's own: test_finetune.py)


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_finetune_steps_through_a_scaler_only_under_fp16(smoke_checkpoint, tmp_path, monkeypatch, precision):
    """CPU autocast runs fp16: the real fine-tuning loop steps through an enabled scaler, and a disabled one
    (a pass-through) otherwise."""
    steps = []
    real_step = torch.amp.GradScaler.step
    monkeypatch.setattr(torch.amp.GradScaler, "step",
                        lambda self, optimizer: steps.append(self.is_enabled()) or real_step(self, optimizer))
    glue = fake_glue(tmp_path, ["rte"], train_rows=40)
    path = evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", "eval.tasks=[rte]",
                               *FAST, f"impl.precision={precision}", tmp_path=tmp_path)
    assert json.loads(path.read_text())["settings"]["impl"]["precision"] == precision
    assert steps == [precision == "fp16"] * 3  # 40 examples, batch 16, one epoch


# ---------------------------------------------------------------- progress


def test_one_bar_over_the_whole_evaluation(smoke_checkpoint, tmp_path, capsys):
    glue = fake_glue(tmp_path, ["rte", "sst2"], train_rows=20, dev_rows=2)
    evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", "eval.tasks=[rte,sst2]", *FAST,
                        "eval.seeds=2", "eval.baseline=random-init", "+eval.per_task.sst2.epochs=2",
                        tmp_path=tmp_path)
    err = capsys.readouterr().err
    total = 2 * 2 * (2 + 2 * 2)  # models x seeds x (rte: 2 steps, sst2: 2 steps x 2 epochs)
    assert f"{total}/{total}" in err and f"0/{total}" in err
    assert "random-init sst2 seed 1 epoch 2/2" in err and "loss " in err


def test_bar_is_closed_when_finetuning_fails(smoke_checkpoint, tmp_path, monkeypatch):
    bars = []

    class Recorded(evaluation.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.was_closed = False
            bars.append(self)

        def close(self):
            self.was_closed = True
            super().close()

    def failing_finetune(*args):
        args[-1].update(1)
        raise RuntimeError("out of memory, say")

    monkeypatch.setattr(evaluation, "tqdm", Recorded)
    monkeypatch.setattr(evaluation, "run_task", failing_finetune)
    glue = fake_glue(tmp_path, ["rte"])
    with pytest.raises(RuntimeError, match="out of memory"):
        evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", "eval.tasks=[rte]", *FAST,
                            tmp_path=tmp_path)
    assert len(bars) == 1 and bars[0].was_closed


@pytest.mark.parametrize("kind", ["glue", "custom"])
@pytest.mark.parametrize("override", ["eval.per_task={rte: {epochs: 10, lr: 1e-4}}",
                                      "+eval.per_task.rte.epochs=10"])
def test_per_task_recipes_compose_from_the_command_line(kind, override):
    """docs/evaluation.md's form (a dict) and Hydra's append form both reach the task's recipe; other tasks keep theirs."""
    from cramming.eval.config import recipe_for

    extra = ["eval.train_file=a.csv", "eval.dev_file=b.csv"] if kind == "custom" else []
    config = eval_config("checkpoint=x", f"eval={kind}", "eval.tasks=[rte,cola]" if kind == "glue" else "eval.tasks=[custom]",
                         override if kind == "glue" else override.replace("rte", "custom"), *extra)
    task = "rte" if kind == "glue" else "custom"
    assert recipe_for(config.eval, task).epochs == 10
    assert recipe_for(config.eval, "cola").epochs == 5
