"""What `eval.kind` names: one registered object per benchmark, carrying its task list, loader, average and
table, so the recipe (recipe.py) is the same for all of them."""

from ..errors import check, check_choice
from ..registry import Registry
from . import superglue_metrics
from .custom import load_custom_task
from .results import COLUMNS, glue_summary
from .superglue import SUPERGLUE_TASKS, load_superglue_task
from .tasks import GLUE_SET, GLUE_TASKS, load_task

BENCHMARKS = Registry("benchmark", traits={  # eval.kind
    "skippable": "eval.skip_missing applies: a task whose data is missing is skipped, not an error",
    "published": "its tasks have published scores that a complete run's can stand beside (the model card says so)",
})


def _check_task_list(e, known, what: str) -> None:
    """eval.tasks: at least one, each from `known` (the benchmark's task_table), none twice."""
    check(bool(e.tasks), "eval.tasks", e.tasks, "name at least one task")
    for task in e.tasks:
        check_choice("eval.tasks", task, known)
    check(len(set(e.tasks)) == len(e.tasks), "eval.tasks", e.tasks, f"a {what} task is listed twice")


@BENCHMARKS.register_one("glue")
class Glue:
    """GLUE: the eight tasks of the paper's average (WNLI on request), each fine-tuned from the checkpoint."""

    title = "GLUE"
    # The names eval.tasks may take (validation, docs/options.md); None where they are free (file or harness names).
    task_table = GLUE_TASKS
    summary_key = "glue"  # results.json: models.<label>.glue
    average_set = GLUE_SET  # left out of eval.tasks: not comparable
    columns = COLUMNS
    skippable = True  # eval.skip_missing applies
    published = True

    def validate(self, e) -> None:
        _check_task_list(e, self.task_table, self.title)

    def trained(self, e) -> list[str]:
        """The tasks fine-tuned (each one model per seed), in eval.tasks' order."""
        return list(e.tasks)

    def load(self, name: str, e):
        return load_task(name, e.data_dir)

    def summarise(self, scores: dict, e) -> dict | None:
        return glue_summary(scores, e.include_wnli)


@BENCHMARKS.register_one("superglue")
class SuperGlue(Glue):
    """The eight tasks and the two diagnostics, which the RTE model predicts (SuperGLUE's baselines did so)."""

    title = "SuperGLUE"
    task_table = SUPERGLUE_TASKS
    summary_key = "superglue"
    average_set = superglue_metrics.SUPERGLUE_SET
    columns = (("BoolQ", "boolq"), ("CB", "cb"), ("COPA", "copa"), ("MultiRC", "multirc"), ("ReCoRD", "record"),
               ("RTE", "rte"), ("WiC", "wic"), ("WSC", "wsc"), ("AX-b", "axb"), ("AX-g", "axg"))

    def validate(self, e) -> None:
        _check_task_list(e, self.task_table, self.title)
        for diagnostic in superglue_metrics.DIAGNOSTICS:
            check(diagnostic not in e.tasks or "rte" in e.tasks, "eval.tasks", e.tasks,
                  f"{diagnostic} is predicted by the RTE model: add rte to eval.tasks (or drop {diagnostic})")
            check(diagnostic not in e.per_task, f"eval.per_task.{diagnostic}", e.per_task.get(diagnostic),
                  f"{diagnostic} is not fine-tuned (the RTE model predicts it): set eval.per_task.rte instead")

    def trained(self, e) -> list[str]:
        return [t for t in e.tasks if t not in superglue_metrics.DIAGNOSTICS]

    def load(self, name: str, e):
        extra = tuple(d for d in superglue_metrics.DIAGNOSTICS if d in e.tasks) if name == "rte" else ()
        return load_superglue_task(name, e.data_dir, extra)

    def summarise(self, scores: dict, e) -> dict | None:
        return superglue_metrics.superglue_average(scores)


@BENCHMARKS.register_one("custom")
class Custom(Glue):
    """The user's own task (custom.py); no benchmark average, and its errors are never skipped."""

    title = "your own task"
    published = False
    average_set = ()
    task_table = None  # one task, from eval.train_file and eval.dev_file
    skippable = False

    def validate(self, e) -> None:
        check(bool(e.train_file and e.dev_file), "eval.train_file", e.train_file,
              "eval=custom needs eval.train_file and eval.dev_file")
        check(1 <= len(e.text_fields) <= 2, "eval.text_fields", e.text_fields, "give one or two text fields")
        if e.task_type is not None:
            check_choice("eval.task_type", e.task_type, ("classification", "regression"))

    def trained(self, e) -> list[str]:
        return ["custom"]

    def load(self, name: str, e):
        return load_custom_task(e.train_file, e.dev_file, list(e.text_fields), e.label_field, e.task_type)

    def summarise(self, scores: dict, e) -> dict | None:
        return None

