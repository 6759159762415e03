"""Typed schema of `python eval.py` (conf/eval.yaml), checked before any fine-tuning starts."""

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ..config import ImplConfig, check, check_choice
from ..errors import UserError
from ..schema import register
from .tasks import GLUE_SET


@dataclass
class Recipe:
    """Cramming's GLUE fine-tuning recipe; every key can be changed per task under `eval.per_task`."""

    lr: float = 4e-5  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # AdamW's betas
    eps: float = 1e-6  # AdamW's epsilon
    weight_decay: float = 0.0  # AdamW's weight decay
    schedule: str = "cosine"  # the learning-rate shape after the warm-up
    warmup_fraction: float = 0.1  # share of the steps warming up linearly
    epochs: int = 5  # passes over the task's training set
    batch_size: int = 16  # examples per step
    max_length: int = 128  # tokens per example (longer ones are cut)
    dropout: float = 0.1  # hidden and attention dropout while fine-tuning
    grad_clip: float | None = None  # clip the gradient norm at this; null = off


@dataclass
class EvalConfig:
    kind: str = "glue"  # the benchmark
    tasks: list[str] = field(default_factory=lambda: list(GLUE_SET))  # the tasks to run (the default: GLUE's averaged ones, eval/tasks.py)
    data_dir: str | None = None  # a glue_data/ (or SuperGLUE) folder; null = the hub (nyu-mll/glue, aps/super_glue)
    seeds: int = 1  # fine-tuning runs per task; the median is reported
    baseline: str | None = None  # random-init: also fine-tune an untrained model of the same architecture
    max_train_examples: int | None = None  # smoke runs only: results are marked "not comparable"
    include_wnli: bool = False  # count WNLI in the GLUE average
    skip_missing: bool = False  # skip (and report) tasks whose data cannot be loaded instead of stopping
    results_table: str = "outputs/eval/results.csv"  # a CSV that gets one row per evaluated model
    recipe: Recipe = field(default_factory=Recipe)
    per_task: dict[str, dict] = field(default_factory=dict)  # recipe keys per task, e.g. {rte: {epochs: 10}}
    # eval=custom
    train_file: str | None = None  # eval=custom: the training file (CSV, TSV or JSONL with a header)
    dev_file: str | None = None  # eval=custom: the dev file
    text_fields: list[str] = field(default_factory=list)  # eval=custom: one or two text columns
    label_field: str = "label"  # eval=custom: the label column
    task_type: str | None = None  # eval=custom: classification or regression; null = inferred from the labels


@dataclass
class EvalRunConfig:
    checkpoint: str | None = None  # the checkpoint folder to fine-tune (pretrain.py prints it last)
    name: str | None = None  # find the newest complete checkpoint of this pretraining run instead
    runs_dir: str = "outputs"  # where pretrain.py wrote its runs
    seed: int = 0  # the base seed of the fine-tuning runs
    eval: EvalConfig = field(default_factory=EvalConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)


register("eval_schema", EvalRunConfig)


def load_eval_config(cfg: DictConfig) -> EvalRunConfig:
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


def recipe_for(config: EvalConfig, task: str) -> Recipe:
    """The recipe with this task's overrides applied (and checked like the rest)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config.recipe), config.per_task.get(task, {}))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise UserError(f"config eval.per_task.{task}.{getattr(err, 'key', '')}: {str(err).splitlines()[0]}") from None


def validate_eval(c: EvalRunConfig) -> None:
    from .benchmarks import BENCHMARKS
    from .finetune import SCHEDULES

    e = c.eval
    check(bool(c.checkpoint) != bool(c.name), "checkpoint", c.checkpoint,
           "give exactly one of checkpoint=<folder> or name=<pretraining run name>")
    check_choice("eval.kind", e.kind, BENCHMARKS)
    benchmark = BENCHMARKS[e.kind]
    check(e.seeds > 0, "eval.seeds", e.seeds, "must be >= 1")
    if e.baseline is not None:
        check_choice("eval.baseline", e.baseline, ("random-init",))
    if e.max_train_examples is not None:
        check(e.max_train_examples > 0, "eval.max_train_examples", e.max_train_examples, "must be > 0 or null")
    benchmark.validate(e)
    validate_impl(c.impl)
    for task in set(e.per_task) | {"*"}:
        if task != "*" and benchmark.average_set:  # a benchmark's tasks (custom has its one)
            check(task in e.tasks, f"eval.per_task.{task}", e.per_task[task], f"{task} is not in eval.tasks")
        r = recipe_for(e, task)
        key = "eval.recipe" if task == "*" else f"eval.per_task.{task}"
        check(r.lr > 0, f"{key}.lr", r.lr, "must be > 0")
        check(r.epochs > 0, f"{key}.epochs", r.epochs, "must be >= 1")
        check(r.batch_size > 0, f"{key}.batch_size", r.batch_size, "must be >= 1")
        check(r.max_length >= 8, f"{key}.max_length", r.max_length, "must be >= 8")
        check(0 <= r.warmup_fraction < 1, f"{key}.warmup_fraction", r.warmup_fraction, "must be in [0, 1)")
        check(0 <= r.dropout < 1, f"{key}.dropout", r.dropout, "must be in [0, 1)")
        check_choice(f"{key}.schedule", r.schedule, SCHEDULES)


def validate_impl(i) -> None:
    """The impl keys eval.py reads (impl.resolve): without this, impl.precision=fp8 would quietly run as fp16.
    The same rules and registries as pretraining's impl (cramming/config.py)."""
    from ..config import components, refuse
    from ..rules import declared_rules, rule_problem

    for key, value, rule in declared_rules(i, "impl."):
        refuse(rule_problem(key, value, rule))
    for key, registry, extra, _ in components():
        if key in ("impl.attention", "impl.rotary", "impl.loss"):
            check_choice(key, getattr(i, key.removeprefix("impl.")), (*extra, *registry))
