"""An eval.py config, loaded and checked before any fine-tuning starts: the same walk over the schema as
pretraining's (cramming/rules.py: eval.*, eval.recipe.*, impl.*), then what the chosen benchmark refuses, then each
task's recipe with its overrides, under the same rules."""

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ..errors import UserError, check, refuse
from ..eval import finetune  # noqa: F401  serves the recipe's schedule (Registry.serves; eval.kind: BENCHMARKS)
from ..eval.config import EvalRunConfig, recipe_for
from ..eval.kinds import BENCHMARKS
from ..plugins import import_plugins
from ..rules import schema_problems
from ..run_folder import name_problem


def load_eval_config(cfg: DictConfig) -> EvalRunConfig:
    import_plugins()  # components of your own ($CRAMMING_PLUGINS): a benchmark, an engine
    if "eval" in cfg and cfg.eval.get("per_task", {}) is None:  # null in the YAML, so that
        with open_dict(cfg):  # eval.per_task={rte: {epochs: 10}} may add keys Hydra's struct mode would refuse
            cfg.eval.per_task = {}
    try:
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EvalRunConfig), cfg))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        raise UserError(f"config {key}: {str(err).splitlines()[0]}") from None
    validate_eval(config)
    return config


def validate_eval(c: EvalRunConfig) -> None:
    """The same walk over the schema as pretraining's (cramming/rules.py: eval.*, eval.recipe.*, impl.*), then
    what the benchmark refuses, then each task's recipe with its overrides, under the same rules."""
    e = c.eval
    check(bool(c.checkpoint) != bool(c.name), "checkpoint", c.checkpoint,
          "give exactly one of checkpoint=<folder> or name=<pretraining run name>")
    refuse(name_problem(c.name) if c.name else None)  # a run's folder under eval's runs_dir, never outside it
    check(e.data_dir is None or bool(e.data_dir.strip()), "eval.data_dir", e.data_dir,
          "an empty folder name (an empty $GLUE_DIR, $SUPERGLUE_DIR, ... gives one): name the data folder, or leave "
          "it null (unset the variable) to read the hub")
    for problem in schema_problems(c):
        refuse(problem)
    check(c.impl.precision != "fp8", "impl.precision", "fp8", "float8 is for pretraining (cramming/train/fp8.py); "
          "fine-tuning runs in bf16: use impl.precision=bf16 or auto")
    benchmark = BENCHMARKS[e.kind]
    benchmark.validate(e)
    for task in e.per_task:
        if benchmark.average_set:  # a benchmark's tasks (custom has its one)
            check(task in e.tasks, f"eval.per_task.{task}", e.per_task[task], f"{task} is not in eval.tasks")
        for problem in schema_problems(recipe_for(e, task), f"eval.per_task.{task}."):
            refuse(problem)
