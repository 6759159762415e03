"""What `eval.kind` names: a Benchmark, the one declared interface of a task family. Its reader turns one task's
files (or hub rows) into a TaskData, whose `head` (heads.py) fine-tunes it and whose metric scores it; the rest
says which tasks run and how their scores add up. The recipe (recipe.py) runs every benchmark the same way; each
family's module declares its own, and kinds.py registers them all."""

from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..errors import check, check_choice


def check_task_list(e, known, title: str) -> None:
    """eval.tasks: at least one, each from `known` (the benchmark's task_table), none twice."""
    check(bool(e.tasks), "eval.tasks", e.tasks, "name at least one task")
    for task in e.tasks:
        check_choice("eval.tasks", task, known)
    check(len(set(e.tasks)) == len(e.tasks), "eval.tasks", e.tasks, f"a {title} task is listed twice")


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
        if self.task_table is not None:
            check_task_list(e, self.task_table, self.title)
        if self.check is not None:
            self.check(e)
