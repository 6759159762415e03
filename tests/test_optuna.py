"""Optuna sweeps through Hydra's Optuna sweeper plugin (the `optuna` extra): three real trials at smoke scale,
searching a preset's variants and a log-scaled learning rate at once, minimising the final validation loss that
pretrain.py returns, with the study kept in SQLite (resumable)."""

import json

import pytest
from conftest import run_pretrain
from omegaconf import OmegaConf
from test_experiments import SMOKE
from test_sweep import TINY

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper",
                    reason="the Optuna sweeper plugin is not installed: pip install -e '.[optuna]'")


@pytest.mark.filterwarnings("ignore:Deprecated API features detected")
def test_three_trials_minimise_the_validation_loss(tmp_path):
    import optuna
    import sqlalchemy

    assert int(sqlalchemy.__version__.split(".")[0]) < 2, (
        "the plugin's optuna 2.10 cannot keep a study in SQLAlchemy 2: pip install -e '.[optuna]' pins sqlalchemy<2")
    sweep, storage = tmp_path / "sweep", f"sqlite:///{tmp_path / 'study.db'}"
    result = run_pretrain(
        "-m", "+experiment=topk-attention", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=1", "hydra.sweeper.sampler.seed=0", f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=smoke", "train.lr=tag(log,interval(1e-4,1e-2))", *SMOKE, f"hydra.sweep.dir={sweep}",
        in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = {}
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        summary = json.loads((job / "checkpoint" / "train_summary.json").read_text())
        trials[job.name] = (summary["config"]["train"]["lr"], summary["val_loss"])
        assert job.name.split("_", 1)[1] == summary["config"]["arch"]["attention"]["pattern"][0]
    assert len(trials) == 3 and all(1e-4 <= lr <= 1e-2 for lr, _ in trials.values())
    assert len({lr for lr, _ in trials.values()}) == 3  # the sampler proposed three learning rates
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_value == pytest.approx(min(loss for _, loss in trials.values()))
    assert best.best_params["train.lr"] == pytest.approx(min(trials.values(), key=lambda t: t[1])[0])
    assert set(best.best_params) == {"train.lr", "experiment/topk-attention@_global_"}
    study = optuna.load_study(study_name="smoke", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert study.best_value == pytest.approx(best.best_value)


def test_a_failed_trial_is_told_to_optuna_and_the_study_goes_on(tmp_path):
    """A trial whose config fails validation (3 heads do not divide 64) returns None: the plugin tells Optuna
    FAIL and runs the next trial; the sweep exits 1 naming it. TPE with seed 0 proposes 3, then 2. (Not the grid
    sampler: the plugin crashes when the grid's last trial fails, study.stop() raising in its FAIL branch.)"""
    import optuna

    sweep, storage = tmp_path / "sweep", f"sqlite:///{tmp_path / 'study.db'}"
    tiny = [o for o in TINY if not o.startswith("arch.num_heads=")]
    result = run_pretrain(
        "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.seed=0",
        f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=failing", "arch.num_heads=choice(2,3)", *tiny,
        f"hydra.sweep.dir={sweep}", in_process=True)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: 1 of 2 sweep jobs failed: ")
    study = optuna.load_study(study_name="failing", storage=storage)
    assert [(t.params["arch.num_heads"], t.state.name) for t in study.trials] == [(3, "FAIL"), (2, "COMPLETE")]
    assert OmegaConf.load(sweep / "optimization_results.yaml").best_params == {"arch.num_heads": 2}
    jobs = {job["dir"].rsplit("=", 1)[1]: job for job in json.loads((sweep / "manifest.json").read_text())["jobs"]}
    assert jobs["3"]["status"] == "failed" and "arch.num_heads=3" in jobs["3"]["error"]
    assert jobs["2"]["status"] == "finished" and jobs["2"]["objective"] == pytest.approx(study.best_value)
