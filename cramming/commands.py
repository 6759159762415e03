"""The two commands as Hydra apps on the configs in conf/ (shipped inside the package as cramming.conf):
pretrain.py and eval.py at the repository root call them, and so do the installed console scripts
`cramming-pretrain` and `cramming-eval` (pyproject.toml), from any directory. Runs write under the current
directory (outputs/, multirun/)."""

import functools
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from .cli import run_entry
from .engines import env_rank, launched_by_torchrun, quiet_hydra_on_other_ranks
from .errors import EXIT_USER_ERROR, UserError, exit_on_user_error
from .run_folder import undo_refused
from .sweep import eval_after_config, evaluate_after, name_jobs_by_swept_keys, objective_value, sweep_job

CONFIGS = "pkg://cramming.conf"


def leaves_nothing_when_refused(fn):
    """A run refused (a UserError) leaves behind nothing this process added but what it wrote besides Hydra's
    bookkeeping (run_folder.undo_refused); a sweep's job folder stays, as its record of the failure."""

    @functools.wraps(fn)
    def wrapper(cfg):
        try:
            return fn(cfg)
        except UserError:
            if HydraConfig.get().mode == RunMode.RUN:
                undo_refused(Path(HydraConfig.get().runtime.output_dir))
            raise

    return wrapper


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="pretrain")
@sweep_job  # one line and exit 2 on a user error; in a multirun, failed jobs are recorded and the sweep goes on
@leaves_nothing_when_refused
def pretrain_main(cfg) -> float | None:
    from .pretraining import pretrain  # heavy (torch, the model): not for --help or a refused override
    from .validation import load_config  # heavy (every component, torch): the same

    config = load_config(cfg)  # every value checked before any work
    run_dir = HydraConfig.get().runtime.output_dir
    if config.data_only:
        return prepare_only(config, Path(run_dir))
    eval_config = eval_after_config(config)  # eval_after: composed and checked now, task data included
    summary = pretrain(config, run_dir)
    if summary.get("dryrun") and HydraConfig.get().mode == RunMode.RUN:
        undo_refused(Path(run_dir))  # a dry run checked the config and made nothing to keep
    if env_rank() != 0:
        return None  # rank 0 evaluates, records and returns the objective
    if eval_config and summary.get("stopped_by"):  # told to stop while it saved: the evaluation is not begun
        print(f"eval_after not run ({summary['stopped_by']}): evaluate the checkpoint with "
              f"`python eval.py checkpoint={summary['checkpoint']}`", flush=True)
        eval_config = None
    results = evaluate_after(eval_config, summary["checkpoint"], run_dir) if eval_config else None
    return objective_value(config, summary, results)  # what a sweeper optimises (sweep_objective)


def prepare_only(config, run_dir: Path) -> None:
    """data_only=true: the tokenizer and packed sequences in the cache, their folder printed, and no run: the folder
    Hydra made for one holds only its own bookkeeping and goes again (its empty parents too, up to here)."""
    from .data.prepare import prepare_data  # heavy (tokenizers, torch): only with data_only=true

    folder, _ = prepare_data(config.data)
    undo_refused(run_dir)
    print(f"prepared: {folder}", flush=True)


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="eval")
@exit_on_user_error
@leaves_nothing_when_refused
def eval_main(cfg) -> None:
    from .eval.recipe import evaluate  # heavy (torch, transformers): not for --help
    from .validation import check_no_missing  # heavy (every component): the same
    from .validation.eval import load_eval_config  # heavy (every benchmark): the same

    check_no_missing(cfg)  # `key=???`
    config = load_eval_config(cfg)  # every value checked before any work
    evaluate(config, HydraConfig.get().runtime.output_dir)


def pretrain_command(command: str | None = None) -> None:
    """`python pretrain.py ...` or `cramming-pretrain ...`."""
    command = command or Path(sys.argv[0]).name
    if launched_by_torchrun() and {"-m", "--multirun"} & set(sys.argv):  # Hydra would start jobs rank by rank
        print("error: a Hydra multirun (-m) cannot run under torchrun; launch torchrun once per job "
              "(docs/distributed.md)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    sys.argv = quiet_hydra_on_other_ranks(name_jobs_by_swept_keys(sys.argv))
    run_entry(pretrain_main, command)  # Hydra's own errors (unknown option, key, bad override): one line, exit 2


def eval_command(command: str | None = None) -> None:
    """`python eval.py ...` or `cramming-eval ...`."""
    run_entry(eval_main, command or Path(sys.argv[0]).name)
