"""Pretrain on a wall-clock budget: `python pretrain.py arch=crammed-bert data=python-docs budget=24`."""

import sys

try:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from cramming.cli import run_entry
    from cramming.config import load_config
    from cramming.engines import env_rank, launched_by_torchrun, quiet_hydra_on_other_ranks
    from cramming.errors import EXIT_USER_ERROR
    from cramming.pretraining import pretrain
    from cramming.sweep import eval_after_config, evaluate_after, name_jobs_by_swept_keys, objective_value, sweep_job
except ModuleNotFoundError as missing:  # not the project's environment: say how to get it, in one line
    print(f"error: {missing.name} is not installed for {sys.executable}; run `bash scripts/setup.sh`, then "
          "`source .venv/bin/activate`", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="conf", config_name="pretrain")
@sweep_job  # one line and exit 2 on a user error; in a multirun, failed jobs are recorded and the sweep goes on
def main(cfg) -> float | None:
    config = load_config(cfg)  # every value checked before any work
    eval_config = eval_after_config(config)  # eval_after: composed and checked now, task data included
    hydra_cfg = HydraConfig.get()
    run_dir = hydra_cfg.runtime.output_dir
    summary = pretrain(config, run_dir)
    if env_rank() != 0:
        return None  # rank 0 evaluates, records and returns the objective
    results = evaluate_after(eval_config, summary["checkpoint"], run_dir) if eval_config else None
    return objective_value(config, summary, results)  # what a sweeper optimises (sweep_objective)


if __name__ == "__main__":
    if launched_by_torchrun() and {"-m", "--multirun"} & set(sys.argv):  # Hydra would start jobs rank by rank
        print("error: a Hydra multirun (-m) cannot run under torchrun; launch torchrun once per job "
              "(docs/distributed.md)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    sys.argv = quiet_hydra_on_other_ranks(name_jobs_by_swept_keys(sys.argv))
    run_entry(main, "pretrain.py")  # Hydra's own errors (unknown option, key, bad override): one line, exit 2
