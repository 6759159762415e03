"""`eval=lm-eval`: lm-evaluation-harness (the optional extra `cramming[lm-eval]`) scores a causal checkpoint with its
Hugging Face model wrapper, zero- or few-shot, and its acc / acc_norm land in our results (docs/zero-shot.md).

lm-eval conditions an empty context on `prefix_token_id`, by default the tokenizer's BOS or else EOS token; our
tokenizers have neither (every pretraining document starts with [CLS]), so it is passed explicitly: the BOS token
where there is one, else [CLS]. Without it lm-eval 0.4.13 fails decoding `None` on its first request.
"""

import functools
import importlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError, check
from .config import LmEvalOptions
from .tasks import TaskData
from .zero_shot import build_causal_lm

INSTALL = "pip install 'cramming[lm-eval]'"
METRICS = ("acc", "acc_norm")  # what we take from each task, x100, where the task reports it
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # impl.precision -> the dtype lm-eval loads in


@dataclass
class HarnessTask(TaskData):
    """A task lm-eval loads and scores itself; its options travel with it to the head."""

    options: LmEvalOptions | None = None


def lm_eval_module():
    """lm_eval, or the one-line error naming the extra that installs it."""
    try:
        return importlib.import_module("lm_eval")
    except ImportError:
        raise UserError(f"eval=lm-eval needs lm-evaluation-harness, which is not installed: {INSTALL}") from None


def task_manager(options: LmEvalOptions):
    """lm-eval's task index, with the user's YAML folder added."""
    lm_eval_module()
    if options.include_path is not None and not Path(options.include_path).expanduser().is_dir():
        raise UserError(f"eval.lm_eval.include_path={options.include_path!r} is not a folder of lm-eval task YAMLs")
    return _task_manager(None if options.include_path is None else str(Path(options.include_path).expanduser().resolve()))


@functools.cache
def _task_manager(include: str | None):
    """One index per folder: building one reads every YAML lm-eval ships (seconds), and each task asks twice."""
    from lm_eval.tasks import TaskManager  # the optional lm-eval extra (lm_eval_module checked it)

    return TaskManager(include_path=include)


def check_task(name: str, manager) -> None:
    """A known name whose data loads, and (for a single task) one that reports acc: all before any model runs."""
    if name not in manager.all_tasks:
        raise UserError(f"eval.tasks: lm-eval knows no task {name!r} (list them with `lm-eval ls tasks`; "
                        "your own YAMLs go in eval.lm_eval.include_path)")
    from datasets.exceptions import DatasetGenerationError  # datasets: ~1 s, as lm-eval itself: only here
    from lm_eval.tasks import get_task_dict  # the optional extra, as above

    try:
        tasks = get_task_dict([name], manager)
    except (OSError, ValueError, KeyError, TypeError, DatasetGenerationError) as err:  # missing or unreadable files
        cause = err.__cause__ if isinstance(err, DatasetGenerationError) and err.__cause__ is not None else err
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise UserError(f"lm-eval task {name!r}: its data could not be loaded: {reason}") from None
    task = tasks.get(name)
    if task is not None and "acc" not in task._metric_fn_list:
        raise UserError(f"lm-eval task {name!r} reports no acc (its metrics: {', '.join(task._metric_fn_list)}); "
                        "eval=lm-eval reads multiple-choice tasks' acc and acc_norm")


def harness_lm(checkpoint, tokenizer, runtime, options: LmEvalOptions, max_length: int, random_init: bool):
    """lm-eval's HFLM on the checkpoint's model (or its untrained twin, the baseline), built by eval's one loader
    (finetune.auto_model): lm-eval then imports nothing from the checkpoint's folder (docs/security.md)."""
    from lm_eval.models.huggingface import HFLM  # the optional extra, as above

    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    model = build_causal_lm(checkpoint, random_init).to(runtime.device, getattr(torch, DTYPES[runtime.precision]))
    return HFLM(pretrained=model.eval(), backend="causal", tokenizer=tokenizer, batch_size=options.batch_size,
                max_length=max_length, prefix_token_id=prefix)


def run_harness(lm, name: str, options: LmEvalOptions, seed: int, log_samples: bool = False) -> dict:
    """lm_eval.simple_evaluate on one task; its whole answer (results, and samples when log_samples)."""
    import lm_eval  # the optional extra, as above

    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-step INFO lines would bury our output
    return lm_eval.simple_evaluate(model=lm, tasks=[name], num_fewshot=options.num_fewshot, limit=options.limit,
                                   task_manager=task_manager(options), log_samples=log_samples, random_seed=seed,
                                   numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)


def task_metrics(results: dict, name: str) -> dict:
    """acc and acc_norm (where reported) of one task or group, in percent."""
    reported = results["results"][name]
    found = {m: 100.0 * float(reported[f"{m},none"]) for m in METRICS if f"{m},none" in reported}
    if "acc" not in found:
        raise UserError(f"lm-eval task {name!r} reported no acc (it reported {', '.join(reported)})")
    return found


def harness(checkpoint, tokenizer, task, recipe, seed, runtime, random_init) -> dict:
    """A head with nothing to train: lm-eval scores the checkpoint (or its untrained twin) on one task."""
    torch.manual_seed(seed)  # the random-init baseline's weights
    lm = harness_lm(checkpoint, tokenizer, runtime, task.options, recipe.max_length, random_init)
    return {"dev": task_metrics(run_harness(lm, task.name, task.options, seed), task.name)}


def refuse(e) -> None:
    check(bool(e.tasks) and len(set(e.tasks)) == len(e.tasks), "eval.tasks", e.tasks,
          "name each lm-eval task once, e.g. eval.tasks=[hellaswag,arc_easy]")
    check(e.seeds == 1, "eval.seeds", e.seeds, "zero-shot scoring is deterministic: use eval.seeds=1")


def read(name: str, e) -> TaskData:
    """lm-eval's own task, checked to load and to report acc; lm-eval reads its data when it scores."""
    check_task(name, task_manager(e.lm_eval))
    source = f"lm-eval {name}" + (f" ({e.lm_eval.include_path})" if e.lm_eval.include_path else "")
    source += f", first {e.lm_eval.limit} documents only" if e.lm_eval.limit else ""
    return HarnessTask(name, [], {"dev": []}, None, list(METRICS), "acc", source, head="lm-eval", columns=METRICS,
                       options=e.lm_eval)
