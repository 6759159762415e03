"""What `eval.kind` names: a Benchmark, the one declared interface of a task family, and every benchmark and
fine-tuning head registered here, in one place. A benchmark's reader turns one task's files (or hub rows) into a
TaskData, whose `head` (finetune.Head) fine-tunes it and whose metric scores it; the rest says which tasks run and
how their scores add up. Each family's reader, checks and metric live in its own module; validation, the recipe and
docs/options.md read these registries. A benchmark or head of your own registers itself the same way from a file
named in $CRAMMING_PLUGINS."""

from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..errors import check, check_choice
from ..registry import Registry
from . import (
    classifier_head,
    custom,
    harness,
    multiple_choice_head,
    ner,
    span_head,
    squad,
    squad_data,
    superglue,
    swag_race,
    tasks,
    token_head,
    zero_shot,
)
from .config import EvalConfig
from .finetune import HEADS
from .results import glue_summary
from .superglue_metrics import SUPERGLUE_SET, superglue_average


def listed_tasks(e) -> list[str]:
    return list(e.tasks)


def no_average(scores: dict, e) -> None:
    return None


@dataclass(frozen=True)
class Benchmark:
    """Every field a benchmark has, each declared where it is made (no defaults inherited from another
    benchmark). `e` below is the run's EvalConfig."""

    title: str  # its name in tables, messages and the model card
    summary_key: str  # results.json: models.<label>.<summary_key> holds its average (null where it has none)
    load: Callable  # load(task, e) -> TaskData: the reader, every row read and checked before any training
    task_table: Collection[str] | None = None  # the names eval.tasks may take; None where they are free
    columns: tuple[tuple[str, str], ...] = ()  # the printed table's (title, score key) in order; others follow
    average_set: tuple[str, ...] = ()  # its published average's tasks: one left out makes a run not comparable
    summarise: Callable = no_average  # summarise(scores, e) -> its average over the table's scores, or None
    check: Callable | None = None  # check(e): what it refuses beyond the task names (UserError)
    trained: Callable = listed_tasks  # trained(e) -> the tasks fine-tuned (one model per seed), in order
    check_model: Callable | None = None  # check_model(the checkpoint's config): the checkpoints it refuses
    skippable: bool = False  # eval.skip_missing applies (a trait of BENCHMARKS)
    published: bool = True  # its tasks have published scores (a trait of BENCHMARKS)

    def validate(self, e) -> None:
        """eval.tasks: at least one, each from task_table (where it has one), none twice; then its own checks."""
        if self.task_table is not None:
            check(bool(e.tasks), "eval.tasks", e.tasks, "name at least one task")
            for task in e.tasks:
                check_choice("eval.tasks", task, self.task_table)
            check(len(set(e.tasks)) == len(e.tasks), "eval.tasks", e.tasks, f"a {self.title} task is listed twice")
        if self.check is not None:
            self.check(e)


BENCHMARKS = Registry("benchmark", traits={  # eval.kind
    "skippable": "eval.skip_missing applies: a task whose data is missing is skipped, not an error",
    "published": "its tasks have published scores that a complete run's can stand beside (the model card says so)",
})
BENCHMARKS.serves(EvalConfig, "kind")

BENCHMARKS.register("glue", about="GLUE: the eight tasks of the paper's average (WNLI on request), each fine-tuned "
                    "from the checkpoint.")(Benchmark(
    "GLUE", "glue", lambda name, e: tasks.load_task(name, e.data_dir), task_table=tasks.GLUE_TASKS,
    columns=tuple(tasks.GLUE_COLUMNS), average_set=tasks.GLUE_SET, skippable=True,
    summarise=lambda scores, e: glue_summary(scores, e.include_wnli)))
BENCHMARKS.register("superglue", about="SuperGLUE: the eight tasks and the two diagnostics, which the RTE model "
                    "predicts (as SuperGLUE's baselines did).")(Benchmark(
    "SuperGLUE", "superglue", superglue.read, task_table=superglue.SUPERGLUE_TASKS, average_set=SUPERGLUE_SET,
    columns=tuple((task.folder, name) for name, task in superglue.SUPERGLUE_TASKS.items()),  # the release's names
    trained=superglue.trained, check=superglue.refuse, skippable=True,
    summarise=lambda scores, e: superglue_average(scores)))
BENCHMARKS.register("custom", about="The user's own task (custom.py); no benchmark average, and its errors are "
                    "never skipped.")(Benchmark(
    "your own task", "custom", custom.read, trained=lambda e: ["custom"], check=custom.refuse, published=False))
BENCHMARKS.register("ner", about="Named-entity recognition (docs/ner.md): a tag per word, entity-level F1; no "
                    "average, errors never skipped.")(Benchmark(
    "NER", "ner", lambda name, e: ner.load_ner_task(name, e.data_dir), task_table=ner.NER_TASKS,
    columns=(("CoNLL-2003", "conll2003"),),
    average_set=tuple(ner.NER_TASKS)))  # no average; listed so that eval.per_task names only tasks of eval.tasks
BENCHMARKS.register("swag", about="SWAG's validation accuracy; no average.")(Benchmark(
    "SWAG", "swag", lambda name, e: swag_race.load_swag(e.data_dir), task_table=("swag",), average_set=("swag",),
    columns=(("SWAG", "swag"),)))
BENCHMARKS.register("race", about="RACE's dev accuracy: race (both levels, scored whole and per level), or one "
                    "level's model alone.")(Benchmark(
    "RACE", "race", lambda name, e: swag_race.load_race(name, e.data_dir), task_table=tuple(swag_race.RACE_TASKS),
    average_set=("race",), columns=(("RACE", "race"), ("RACE-h", "race-high"), ("RACE-m", "race-middle")),
    check=swag_race.refuse_race))
BENCHMARKS.register("squad", about="SQuAD v1.1 and v2.0 dev sets: each its own column (F1; exact match in "
                    "results.json), no average.")(Benchmark(
    "SQuAD", "squad", squad.load_squad_task, task_table=squad_data.SQUAD_TASKS,
    columns=(("SQuAD1.1", "squad"), ("SQuAD2.0", "squad_v2")), check=squad.refuse))
BENCHMARKS.register("zero-shot", about="eval.tasks name files <eval.data_dir>/<task>.jsonl; one deterministic "
                    "scoring per task (eval.seeds=1).")(Benchmark(
    "zero-shot multiple choice", "zero_shot", zero_shot.read, check=zero_shot.refuse,
    check_model=zero_shot.refuse_model, published=False))
BENCHMARKS.register("lm-eval", about="eval.tasks are lm-eval task names (its own, or YAMLs in "
                    "eval.lm_eval.include_path).")(Benchmark(
    "lm-evaluation-harness", "lm_eval", harness.read, check=harness.refuse, check_model=zero_shot.refuse_model))

HEADS.register("classifier")(classifier_head.Classifier())  # GLUE, SuperGLUE's pairs, your own task
HEADS.register("tokens")(token_head.Tagger())  # NER
HEADS.register("multiple-choice")(multiple_choice_head.MultipleChoice())  # SWAG, RACE
HEADS.register("choice")(multiple_choice_head.CandidateScoring(multiple_choice_head.softmax_loss))  # COPA
HEADS.register("candidates")(multiple_choice_head.CandidateScoring(multiple_choice_head.logistic_loss))  # ReCoRD
HEADS.register("span-pair")(span_head.SpanPairs())  # WSC
HEADS.register("squad")(squad.Squad())
HEADS.register("zero-shot", untrained=True)(zero_shot.zero_shot)  # the checkpoint scores the items as it is
HEADS.register("lm-eval", untrained=True)(harness.harness)  # lm-evaluation-harness scores the checkpoint
