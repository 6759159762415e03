"""Typed schema of `python eval.py` (conf/eval.yaml), checked before any fine-tuning starts."""

from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config import ImplConfig
from ..errors import UserError
from ..schema import register
from .squad_data import SquadOptions
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

    RULES: ClassVar[dict] = {"lr": "> 0", "epochs": ">= 1", "batch_size": ">= 1", "max_length": ">= 8",
                             "warmup_fraction": "[0, 1)", "dropout": "[0, 1)"}  # cramming/rules.py
    REGISTERED: ClassVar[dict] = {"schedule": ()}  # served by eval/finetune.py's FINETUNE_SCHEDULES


@dataclass
class LmEvalOptions:
    """How lm-evaluation-harness runs under eval=lm-eval."""

    include_path: str | None = None  # a folder of lm-eval task YAMLs (local data files work offline); null = lm-eval's own tasks
    num_fewshot: int = 0  # examples from the task's own few-shot split before each question (0 = zero-shot)
    limit: int | None = None  # smoke runs only: score the first N documents of each task (not comparable)
    batch_size: int = 16  # sequences per forward pass

    COMPONENT: ClassVar[tuple] = ("kind", "lm-eval")  # read only when eval.kind=lm-eval (cramming/rules.py)
    RULES: ClassVar[dict] = {"num_fewshot": ">= 0", "limit": "> 0 or null", "batch_size": ">= 1"}


@dataclass
class EvalConfig:
    kind: str = "glue"  # the benchmark
    tasks: list[str] = field(default_factory=lambda: list(GLUE_SET))  # the tasks to run (the default: GLUE's averaged ones, eval/tasks.py); eval=zero-shot: file names, eval=lm-eval: its task names
    data_dir: str | None = None  # a glue_data/ (or SuperGLUE, SQuAD, CoNLL, SWAG, RACE) folder; null = the hub (nyu-mll/glue, aps/super_glue, rajpurkar/squad, ...); eval=zero-shot: the <task>.jsonl folder
    seeds: int = 1  # fine-tuning runs per task; the median is reported
    baseline: str | None = None  # random-init: also fine-tune an untrained model of the same architecture
    max_train_examples: int | None = None  # smoke runs only: results are marked "not comparable"
    include_wnli: bool = False  # count WNLI in the GLUE average
    skip_missing: bool = False  # skip (and report) tasks whose data cannot be loaded instead of stopping
    trust_remote_code: bool = False  # run model code that came with the checkpoint and is not this cramming's own
    results_table: str = "outputs/eval/results.csv"  # a CSV that gets one row per evaluated model
    recipe: Recipe = field(default_factory=Recipe)
    per_task: dict[str, dict] = field(default_factory=dict)  # recipe keys per task, e.g. {rte: {epochs: 10}}
    # eval=custom
    train_file: str | None = None  # eval=custom: the training file (CSV, TSV or JSONL with a header)
    dev_file: str | None = None  # eval=custom: the dev file
    text_fields: list[str] = field(default_factory=list)  # eval=custom: one or two text columns
    label_field: str = "label"  # eval=custom: the label column
    task_type: str | None = None  # eval=custom: classification or regression; null = inferred from the labels
    squad: SquadOptions = field(default_factory=SquadOptions)  # eval=squad: windows and answer decoding
    lm_eval: LmEvalOptions = field(default_factory=LmEvalOptions)

    RULES: ClassVar[dict] = {"seeds": ">= 1", "baseline": ("random-init", None), "max_train_examples": "> 0 or null"}
    REGISTERED: ClassVar[dict] = {"kind": ()}  # served by eval/kinds.py's BENCHMARKS


@dataclass
class EvalRunConfig:
    checkpoint: str | None = None  # the checkpoint folder to fine-tune (pretrain.py prints it last)
    name: str | None = None  # find the newest complete checkpoint of this pretraining run instead
    runs_dir: str = "outputs"  # where pretrain.py wrote its runs
    seed: int = 0  # the base seed of the fine-tuning runs
    eval: EvalConfig = field(default_factory=EvalConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)


register("eval_schema", EvalRunConfig)


def recipe_for(config: EvalConfig, task: str) -> Recipe:
    """The recipe with this task's overrides applied (and checked like the rest)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config.recipe), config.per_task.get(task, {}))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise UserError(f"config eval.per_task.{task}.{getattr(err, 'key', '')}: {str(err).splitlines()[0]}") from None
