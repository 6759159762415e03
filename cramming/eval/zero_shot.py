"""`eval=zero-shot`: a causal checkpoint scores multiple-choice items without any fine-tuning, as
lm-evaluation-harness scores HellaSwag, with no package beyond ours (docs/zero-shot.md).

Each ending's score is the sum of its tokens' log-likelihoods after the context. The text is split as lm-eval's
causal model wrapper splits it (lm_eval/api/model.py `_encode_pair`): the continuation is " " + ending (the task's
target delimiter), trailing spaces of the context move into it, and its tokens are the tail of the encoded
context + continuation past the encoded context's length. `acc` picks the highest sum; `acc_norm` the highest sum
divided by the ending's length in characters (lm-eval's `len(choice)`, api/task.py, without the delimiter).
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from ..errors import UserError, check
from .files import json_objects
from .finetune import auto_model, collate
from .tasks import TaskData

DELIMITER = " "  # lm-eval's default target_delimiter between the context and each ending
GENERIC_FIELDS = ("context", "endings", "label")
HELLASWAG_FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


@dataclass
class Item:
    context: str
    endings: list[str]
    gold: int


def hellaswag_text(text: str) -> str:
    """lm-eval's HellaSwag cleaning (lm_eval/tasks/hellaswag/utils.py `preprocess`): WikiHow's bracketed markers go."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_item(row: dict) -> tuple[str, list[str]]:
    """lm-eval's `process_docs`: the activity label, then ctx_a and the capitalised ctx_b, all cleaned."""
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return hellaswag_text(row["activity_label"] + ": " + context), [hellaswag_text(e) for e in row["endings"]]


def read_items(path: Path) -> list[Item]:
    """A JSONL file of HellaSwag rows (activity_label, ctx_a, ctx_b, endings, label) or generic ones (context,
    endings, label); the first row decides which, and every row must then be of that kind."""
    if not path.is_file():
        raise UserError(f"zero-shot task file {path} does not exist (eval.tasks names <eval.data_dir>/<task>.jsonl)")
    items, fields = [], None
    for number, row in json_objects(path, place="{path}:{number}"):
        fields = fields or (HELLASWAG_FIELDS if "ctx_a" in row else GENERIC_FIELDS)
        items.append(check_item(row, fields, f"{path}:{number}"))
    if not items:
        raise UserError(f"{path}: no items")
    return items


def check_item(row: dict, fields: tuple[str, ...], where: str) -> Item:
    missing = [f for f in fields if row.get(f) is None]
    if missing:
        kind = "a HellaSwag" if fields is HELLASWAG_FIELDS else "a generic"
        raise UserError(f"{where}: missing field(s) {', '.join(missing)} ({kind} row needs {', '.join(fields)})")
    endings = row["endings"]
    if not isinstance(endings, list) or len(endings) < 2 or not all(isinstance(e, str) for e in endings):
        raise UserError(f"{where}: endings must be a list of at least two strings, got {endings!r}")
    label = row["label"]
    if isinstance(label, str) and label.strip().isdigit():
        label = int(label)  # the hub's HellaSwag keeps labels as strings
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(endings):
        raise UserError(f"{where}: label {row['label']!r} is not an index into its {len(endings)} endings")
    if fields is HELLASWAG_FIELDS:
        if bad := next((f for f in ("activity_label", "ctx_a", "ctx_b") if not isinstance(row[f], str)), None):
            raise UserError(f"{where}: {bad} must be text, got {row[bad]!r}")
        context, endings = hellaswag_item(row)
    else:
        context = row["context"]
    if not isinstance(context, str) or not context.strip():
        raise UserError(f"{where}: empty context")
    if not all(e.strip() for e in endings):
        raise UserError(f"{where}: an ending is empty")
    return Item(context, endings, label)


def split_tokens(tokenizer, context: str, ending: str) -> tuple[list[int], list[int]]:
    """(context tokens, ending tokens) as lm-eval's causal wrapper splits them (module docstring)."""
    continuation = DELIMITER + ending
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation)
    head = tokenizer.encode(context)
    return head, whole[len(head):]


@torch.inference_mode()
def loglikelihoods(model, pairs: list[tuple[list[int], list[int]]], max_length: int, batch_size: int, pad_id: int,
                   device, autocast) -> list[float]:
    """Sum of log p(ending token | everything before it) per (context, ending) pair. The last token is not fed and
    the input is cut from the left to max_length (lm-eval's rule); rows are padded on the right under the
    attention mask, so every real token keeps its causal position."""
    model.eval()
    rows = [(context + ending)[-(max_length + 1):][:-1] for context, ending in pairs]
    order = sorted(range(len(pairs)), key=lambda i: -len(rows[i]))
    out = [0.0] * len(pairs)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        with autocast():
            logits = model(**collate([rows[i] for i in chunk], pad_id, device)).logits
        logprobs = F.log_softmax(logits.float(), dim=-1)
        for b, i in enumerate(chunk):
            ending = pairs[i][1]
            end = len(rows[i])
            predicted = logprobs[b, end - len(ending):end]
            target = torch.tensor(ending, device=predicted.device)
            out[i] = float(predicted.gather(-1, target[:, None]).sum())
    return out


def choose(scores: list[float], endings: list[str]) -> tuple[int, int]:
    """(acc's pick, acc_norm's pick): the best sum, and the best sum per character; ties go to the first."""
    best = max(range(len(scores)), key=lambda j: scores[j])
    best_norm = max(range(len(scores)), key=lambda j: scores[j] / len(endings[j]))
    return best, best_norm


def score_items(model, tokenizer, items: list[Item], max_length: int, batch_size: int, device, autocast) -> dict:
    """acc and acc_norm in percent, and each item's per-ending log-likelihoods (for results.json)."""
    pairs = [split_tokens(tokenizer, item.context, ending) for item in items for ending in item.endings]
    if (longest := max(len(ending) for _, ending in pairs)) > max_length:  # lm-eval asserts; we say what to change
        raise UserError(f"eval.recipe.max_length={max_length}: an ending has {longest} tokens, and each ending must "
                        "fit whole with at least one context token before it; raise eval.recipe.max_length")
    flat = loglikelihoods(model, pairs, max_length, batch_size, tokenizer.pad_token_id, device, autocast)
    hits = hits_norm = 0
    lls, start = [], 0
    for item in items:
        scores = flat[start:start + len(item.endings)]
        start += len(item.endings)
        pick, pick_norm = choose(scores, item.endings)
        hits, hits_norm = hits + (pick == item.gold), hits_norm + (pick_norm == item.gold)
        lls.append(scores)
    return {"acc": 100.0 * hits / len(items), "acc_norm": 100.0 * hits_norm / len(items), "loglikelihoods": lls}


def causal_refusal(model_config) -> str | None:
    """Why this checkpoint cannot score text left to right, or None."""
    if model_config.model_type == "crammed":
        causal = getattr(model_config, "causal", False)  # what the checkpoint's objective said (its config)
    else:
        causal = any(a.endswith(("CausalLM", "LMHeadModel")) for a in model_config.architectures or ())
    if causal:
        return None
    return ("zero-shot scoring needs a causal (left-to-right) language model; this checkpoint has no causal LM head "
            "(an MLM or classifier): fine-tune it instead with eval=glue, superglue or custom")


def build_causal_lm(checkpoint: str, random_init: bool):
    return auto_model(AutoModelForCausalLM, checkpoint, random_init)


def zero_shot(checkpoint, tokenizer, task, recipe, seed, runtime, random_init) -> dict:
    """A head with nothing to train: the checkpoint (or, random_init, its untrained twin) scores the items."""
    torch.manual_seed(seed)  # the random-init baseline's weights
    model = build_causal_lm(checkpoint, random_init).to(runtime.device)
    return {split: score_items(model, tokenizer, items, recipe.max_length, recipe.batch_size, runtime.device,
                               runtime.autocast()) for split, items in task.dev.items()}


def refuse(e) -> None:
    check(bool(e.tasks) and len(set(e.tasks)) == len(e.tasks), "eval.tasks", e.tasks,
          "name each task (a file <eval.data_dir>/<task>.jsonl) once")
    check(e.data_dir is not None, "eval.data_dir", e.data_dir,
          "set it to the folder holding <task>.jsonl for each task in eval.tasks (docs/zero-shot.md)")
    check(e.seeds == 1, "eval.seeds", e.seeds, "zero-shot scoring is deterministic: use eval.seeds=1")


def refuse_model(model_config) -> None:
    if (refusal := causal_refusal(model_config)) is not None:
        raise UserError(refusal)


def read(name: str, e) -> TaskData:
    path = Path(e.data_dir).expanduser() / f"{name}.jsonl"
    return TaskData(name, [], {"dev": read_items(path)}, None, ["acc", "acc_norm"], "acc_norm", str(path),
                    head="zero-shot", columns=("acc", "acc_norm"))
