"""train.averaging: EMA and LAWA compute the averages they name, the averaged weights are their own checkpoint
that eval.py loads, and bad values stop the run with one line."""

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import one_line_error, run_pretrain
from safetensors.torch import load_file
from test_resume import TINY, config_for, poison  # noqa: F401  (poison: a fixture)

from cramming import pretraining
from cramming.errors import UserError
from cramming.train.averaging import EMA, LAWA, build_averaging

RUN = TINY + ["train.max_steps=6", "train.batch_size=16", "impl.microbatch_size=16", "train.batch_ramp=0",
              "train.schedule=step-constant", "train.warmup=0", "train.checkpoint_every_minutes=null"]


def settings(**values):
    """train.* as the averagers read it: train.averaging, train.ema.decay, train.lawa.k / every_fraction."""
    ema = SimpleNamespace(decay=values.pop("decay", 0.9))
    lawa = SimpleNamespace(k=values.pop("k", 2), every_fraction=values.pop("every_fraction", 0.25))
    return SimpleNamespace(**{"averaging": "ema", "ema": ema, "lawa": lawa, **values})


def set_weights(model, value: float, step: int) -> list[torch.Tensor]:
    """Weights that differ per step and per entry, so an average over the wrong steps cannot match."""
    with torch.no_grad():
        for i, param in enumerate(model.parameters()):
            param.copy_(torch.linspace(-1, 1, param.numel()).view_as(param) * value + i + step)
    return [p.detach().clone().double() for p in model.parameters()]


def test_ema_equals_a_hand_computed_ema_over_three_steps():
    model = torch.nn.Linear(3, 2)
    ema = build_averaging(settings(averaging="ema", decay=0.9), model)
    assert isinstance(ema, EMA)
    seen = []
    for step, value in enumerate((0.5, -2.0, 3.0), 1):
        seen.append(set_weights(model, value, step))
        ema.update(step, step / 3)
    d = 0.9
    expected = [d * (d * w1 + (1 - d) * w2) + (1 - d) * w3 for w1, w2, w3 in zip(*seen)]
    for got, want in zip(ema.averaged(), expected):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert ema.describe() == {"kind": "ema", "decay": 0.9, "updates": 3}


def test_lawa_is_the_mean_of_the_latest_k_snapshots():
    model = torch.nn.Linear(3, 2)
    lawa = build_averaging(settings(averaging="lawa", k=2, every_fraction=0.25), model)
    assert isinstance(lawa, LAWA)
    weights = {}
    for step in range(1, 11):  # fractions 0.1 ... 1.0: snapshots when 0.25, 0.5, 0.75 and 1.0 are passed
        weights[step] = set_weights(model, 0.1 * step, step)
        lawa.update(step, step / 10)
    lawa.finish(10)
    assert lawa.describe()["snapshot_steps"] == [8, 10]  # the latest k=2 of steps 3, 5, 8, 10
    for got, w8, w10 in zip(lawa.averaged(), weights[8], weights[10]):
        torch.testing.assert_close(got.double(), (w8 + w10) / 2, rtol=1e-6, atol=1e-6)


def test_lawa_adds_the_final_weights_when_no_snapshot_is_due():
    model = torch.nn.Linear(3, 2)
    lawa = build_averaging(settings(averaging="lawa", k=3, every_fraction=0.5), model)
    for step in range(1, 4):
        set_weights(model, 1.0, step)
        lawa.update(step, step / 4)
    final = set_weights(model, 1.0, 4)
    lawa.finish(4)  # stopped by max_steps at a fraction short of 1.0: the final weights are the newest
    assert lawa.describe()["snapshot_steps"] == [2, 4]
    torch.testing.assert_close(lawa.snapshots[-1][1][0].double(), final[0])


def test_the_average_is_swapped_in_and_out():
    model = torch.nn.Linear(3, 2)
    ema = build_averaging(settings(averaging="ema", decay=0.5), model)
    set_weights(model, 1.0, 1)
    ema.update(1, 0.5)
    live = set_weights(model, 1.0, 2)
    with ema.swapped_in():
        assert torch.equal(model.weight, ema.averaged()[0])
    assert all(torch.equal(p.double(), w) for p, w in zip(model.parameters(), live))


def test_the_averaged_checkpoint_is_saved_loads_in_eval_and_differs_from_the_last(tmp_path):
    from cramming.eval.classifier_head import build_classifier
    from cramming.eval.recipe import check_checkpoint

    summary = pretraining.pretrain(config_for(*RUN, "train.averaging=ema", "train.ema.decay=0.5"), tmp_path)
    folder = tmp_path / "final-ema"
    assert summary["averaging"]["checkpoint"] == str(folder.resolve())
    assert summary["averaging"]["updates"] == 6
    on_disk = json.loads((tmp_path / "train_summary.json").read_text())
    assert on_disk["averaging"]["val_loss"] == summary["averaging"]["val_loss"] != summary["val_loss"]
    averaged, last = load_file(folder / "model.safetensors"), load_file(tmp_path / "checkpoint" / "model.safetensors")
    assert averaged.keys() == last.keys()
    assert any(not torch.equal(averaged[k], last[k]) for k in last)
    check_checkpoint(folder)  # what eval.py checks first: config, tokenizer, whole weights
    classifier = build_classifier(str(folder), SimpleNamespace(label_names=["no", "yes"]), 0.0, False)
    loaded = classifier.state_dict()
    matched = [k for k in averaged if k in loaded]
    assert matched and all(torch.equal(loaded[k], averaged[k]) for k in matched)
    # averaging only reads the weights: the last ones are bit for bit those of a run without it
    plain = pretraining.pretrain(config_for(*RUN), tmp_path / "plain")
    assert plain["averaging"] is None and not (tmp_path / "plain" / "final-ema").exists()
    without = load_file(tmp_path / "plain" / "checkpoint" / "model.safetensors")
    assert all(torch.equal(without[k], last[k]) for k in last)


def test_a_bad_value_exits_2_before_any_work(tmp_path):
    result = run_pretrain(*TINY, "train.averaging=lawa", "train.lawa.k=0", run_dir=tmp_path / "run", in_process=True)
    one_line_error(result, "train.lawa.k=0")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_report_shows_both_weights_and_keeps_their_glue_apart(tmp_path):
    """report: the averaged val loss and GLUE columns, a star for the averaged weights in the loss plot, and the
    averaged weights' GLUE (eval-<kind>/, checkpoint final-<kind>) never taken for the run's own."""
    from test_report import write_run

    from cramming.report import collect_runs, differing_keys
    from cramming.report_plots import labels_for, loss_figure, markdown_table

    root = tmp_path / "sweep"
    for job, name in enumerate(("0_none", "1_ema")):
        write_run(root / name, "rotary", 0.001 * (job + 1), 1_000_000, True, job)
    summary_path = root / "1_ema" / "train_summary.json"
    summary = json.loads(summary_path.read_text())
    summary["averaging"] = {"kind": "ema", "decay": 0.9, "updates": 20, "val_loss": 1.2345,
                            "checkpoint": str(root / "1_ema" / "final-ema")}
    summary_path.write_text(json.dumps(summary))
    for folder, checkpoint, average in (("eval", "checkpoint", 61.0), ("eval-ema", "final-ema", 64.5)):
        (root / "1_ema" / folder).mkdir()
        (root / "1_ema" / folder / "results.json").write_text(json.dumps({
            "checkpoint": str(root / "1_ema" / checkpoint), "comparable": True, "finished_at": folder,
            "models": {"pretrained": {"glue": {"average": average}}}}))
    runs = collect_runs([str(root)])
    assert [(r.glue, r.averaged_glue) for r in runs] == [(None, None), (61.0, 64.5)]
    table = markdown_table(runs, differing_keys(runs))
    assert "| averaged val loss | averaged GLUE |" in table.splitlines()[0]
    assert "| 61.0 | 1.2345 | 64.5 |" in table.splitlines()[3]
    ax = loss_figure(runs, "tokens", labels_for(runs, [])).axes[0]
    assert len(ax.collections) == 3 and "stars" in ax.get_title()  # two validation dots and one star
    assert "averaged" not in markdown_table(runs[:1], []).splitlines()[0]  # no averaging: no such columns


def test_the_preset_compares_none_ema_and_lawa():
    from test_experiments import expect, sweep_jobs, validated

    expect("weight-averaging", none={"train.averaging": "none"},
           ema={"train.averaging": "ema", "train.ema.decay": 0.9},
           lawa={"train.averaging": "lawa", "train.lawa.k": 5, "train.lawa.every_fraction": 0.05})
    gpu = [validated(job) for job in sweep_jobs("weight-averaging", ["arch=crammed-bert", "impl=gpu",
                                                                      "train=budget-o4", "train.ema.decay=0.999"])]
    assert [c.train.averaging for c in gpu] == ["none", "ema", "lawa"]
    assert {c.train.ema.decay for c in gpu} == {0.999}


def test_eval_after_evaluates_the_last_and_the_averaged_weights(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\ngood day,1\nawful,0\nfine,1\nbad,0\n")
    result = run_pretrain(*TINY, "train.max_steps=2", "train.batch_size=16", "train.averaging=ema", "eval_after=true",
                          f"eval_overrides=['eval=custom','eval.train_file={tmp_path}/train.csv',"
                          f"'eval.dev_file={tmp_path}/train.csv','eval.recipe.epochs=1']",
                          run_dir=tmp_path / "run", in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    for folder, checkpoint in (("eval", "checkpoint"), ("eval-ema", "final-ema")):
        results = json.loads((run / folder / "results.json").read_text())
        assert results["complete"] and results["checkpoint"] == str((run / checkpoint).resolve())
    assert "the sweep objective (val_loss) is theirs" in result.stdout


def test_the_sweep_objective_is_the_averaged_weights():
    from cramming.sweep import objective_value

    averaging = {"kind": "lawa", "val_loss": 4.0, "checkpoint": "/run/final-lawa"}
    val_loss, glue = SimpleNamespace(sweep_objective="val_loss"), SimpleNamespace(sweep_objective="glue_average")
    assert objective_value(val_loss, {"val_loss": 4.5, "averaging": averaging}, None) == 4.0
    assert objective_value(val_loss, {"val_loss": 4.5, "averaging": None}, None) == 4.5

    def results(average):
        return {"comparable": True, "skipped": {}, "models": {"pretrained": {"glue": {"average": average}}}}

    both = {**results(70.0), "averaged": results(72.5)}
    assert objective_value(glue, {"val_loss": 4.5, "averaging": averaging}, both) == 72.5
    assert objective_value(glue, {"val_loss": 4.5, "averaging": None}, both) == 70.0
    with pytest.raises(UserError, match="no finite validation loss"):
        objective_value(val_loss, {"val_loss": 4.5, "averaging": {**averaging, "val_loss": float("nan")}}, None)


def test_ddp_averages_what_one_process_averages(tmp_path):
    """Two DDP ranks (gloo) hold the same replica and average it alike: the averaged checkpoint and its
    validation loss are one process's, and the energy keys are there (null with a reason on this machine)."""
    import subprocess
    import sys

    from conftest import REPO

    steps = [*TINY, "train.schedule=step-triangle", "train.max_steps=4", "train.batch_ramp=0",
             "train.batch_size=16", "impl.microbatch_size=4", "train.checkpoint_every_minutes=null",
             "train.averaging=lawa", "train.lawa.k=3", "train.lawa.every_fraction=0.25"]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(REPO / "pretrain.py"), *steps, "impl.distributed=ddp",
                          f"hydra.run.dir={tmp_path / 'ddp'}"], check=False, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = run_pretrain(*steps, run_dir=tmp_path / "one", in_process=True)
    assert one.returncode == 0, one.stderr[-3000:]
    got, want = (json.loads((tmp_path / run / "train_summary.json").read_text()) for run in ("ddp", "one"))
    assert got["distributed"]["world_size"] == 2
    assert got["averaging"]["snapshot_steps"] == want["averaging"]["snapshot_steps"] == [2, 3, 4]
    assert got["averaging"]["val_loss"] == pytest.approx(want["averaging"]["val_loss"], rel=1e-5)
    a, b = (load_file(tmp_path / run / "final-lawa" / "model.safetensors") for run in ("ddp", "one"))
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in b)
    assert "energy_kwh" in got and (got["energy_kwh"] is None) == (got["energy_unavailable"] is not None)


def test_a_rollback_takes_the_average_back_too(poison, tmp_path):  # noqa: F811
    """The loss is NaN before step 3: the run goes back to the checkpoint of step 0, the EMA with it, so the
    average holds only the 4 steps trained after the rollback."""
    poison.add(3)
    summary = pretraining.pretrain(config_for(*RUN, "train.nonfinite=rollback", "train.averaging=ema"), tmp_path)
    assert summary["rollbacks"] == 1 and summary["steps"] == 6
    assert summary["averaging"]["updates"] == 4
