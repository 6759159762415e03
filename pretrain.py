"""Pretrain on a wall-clock budget: `python pretrain.py arch=crammed-bert data=python-docs budget=24`."""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from cramming.config import load_config
from cramming.errors import exit_on_user_error
from cramming.pretraining import pretrain
from cramming.sweep import eval_after_config, evaluate_after, name_jobs_by_swept_keys, objective_value, record_job


@hydra.main(version_base="1.3", config_path="conf", config_name="pretrain")
@exit_on_user_error
def main(cfg) -> float:
    config = load_config(cfg)  # every value checked before any work
    eval_config = eval_after_config(config)  # eval_after: composed and checked now, task data included
    hydra_cfg = HydraConfig.get()
    run_dir = hydra_cfg.runtime.output_dir
    job = None
    if hydra_cfg.mode == RunMode.MULTIRUN:
        job = dict(sweep_dir=hydra_cfg.sweep.dir, job=hydra_cfg.job.num, run_dir=run_dir,
                   overrides=list(hydra_cfg.overrides.task))
        record_job(**job, status="running")
    try:
        summary = pretrain(config, run_dir)
        results = evaluate_after(eval_config, summary["checkpoint"], run_dir) if eval_config else None
        value = objective_value(config, summary, results)
    except BaseException:
        if job:
            record_job(**job, status="failed")
        raise
    if job:
        record_job(**job, status="finished", objective=value)
    return value  # what a sweeper optimises (sweep_objective)


if __name__ == "__main__":
    sys.argv = name_jobs_by_swept_keys(sys.argv)
    main()
