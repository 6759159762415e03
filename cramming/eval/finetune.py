"""Fine-tune one model on one task with one seed, and score it on the dev split(s) after every epoch: one loop for
every head. A head (the Head protocol below) says how a task's rows become encoded items, items a batch, a batch a
loss and the model's outputs predictions; kinds.HEADS names them, and a task picks its own (TaskData.head).

Batches are bucketed by length and padded only to the longest item of the batch, so short GLUE sentences do not
pay for 128 positions; dev passes run under inference_mode, shortest items first.
"""

import copy
import math
import pickle
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from transformers import CONFIG_MAPPING, AutoConfig, get_scheduler
from transformers.configuration_utils import get_configuration_file

from .. import model as crammed
from ..checkpoints.model_folder import check_crammed_config
from ..errors import UserError
from ..registry import Registry
from ..untrusted import inside, read_json
from .config import Recipe
from .glue_metrics import compute_metrics
from .tasks import TaskData

# TaskData.head: every head, each an object of the Head protocol (or, `untrained`, a scorer with nothing to train).
HEADS = Registry("fine-tuning head", traits={
    "untrained": "nothing is fine-tuned: head(checkpoint, tokenizer, task, recipe, seed, runtime, random_init) "
                 "scores the checkpoint as it is, returning each dev split's metrics"})
FINETUNE_SCHEDULES = Registry("fine-tuning schedule")  # eval.recipe.schedule
FINETUNE_SCHEDULES.serves(Recipe, "schedule")


@dataclass(frozen=True)
class FinetuneSchedule:
    """A linear warm-up, then the learning-rate shape transformers calls `transformers_name`."""

    transformers_name: str

    def build(self, optimizer, warmup_steps: int, total_steps: int):
        return get_scheduler(self.transformers_name, optimizer, num_warmup_steps=warmup_steps,
                             num_training_steps=total_steps)


for _name, _transformers_name, _about in (
        ("cosine", "cosine", "Warm-up, then a cosine from the peak to 0."),
        ("linear", "linear", "Warm-up, then a straight line from the peak to 0 (BERT's fine-tuning)."),
        ("constant", "constant_with_warmup", "Warm-up, then the peak to the end.")):
    FINETUNE_SCHEDULES.register(_name, about=_about)(FinetuneSchedule(_transformers_name))


# Rows are sorted by length within windows of this many batches: batches pad little, yet stay mixed in order.
BUCKET_BATCHES = 50
# Dev batches are this many training batches: inference keeps no activations for a backward or optimizer state.
PREDICT_BATCHES = 4


class Head(Protocol):
    """How one kind of task is fine-tuned and read out. An item is one encoded row of the task (SQuAD: one window
    of a question's context) with its labels; finetune() runs every head through the same steps."""

    def build(self, checkpoint: str, task: TaskData, recipe, random_init: bool) -> torch.nn.Module:
        """The checkpoint's encoder (or, random_init, an untrained one of its architecture) with this head on it."""

    def encode(self, tokenizer, task: TaskData, rows: list, max_length: int) -> list:
        """The items of `rows` (the task's train rows or one dev split), labels included."""

    def length(self, item) -> int:
        """Its tokens, so that batches and prediction chunks hold items of like length (one row: item.ids)."""
        return len(item.ids)

    def collate(self, items: list, pad_id: int, device) -> dict:
        """The model's keyword inputs for these items, padded to the longest (one row each: item.ids)."""
        return collate([item.ids for item in items], pad_id, device)

    def loss(self, model, inputs: dict, items: list) -> torch.Tensor:
        """The batch's loss (run under autocast): the model's own, against each item's `label`."""
        labels = torch.tensor([item.label for item in items], device=inputs["input_ids"].device)
        return model(**inputs, labels=labels).loss

    def decode(self, outputs, items: list, task: TaskData) -> list:
        """One prediction per item from the model's outputs."""

    def max_length(self, model_config, recipe, label: str) -> int:
        """Tokens per item: the recipe's, unless the checkpoint cannot take that many."""
        return recipe.max_length

    def answers(self, task: TaskData, split: str, items: list, predictions: list):
        """What the task's scorer reads: the items' predictions (SQuAD joins its windows' into answers)."""
        return predictions

    def record(self, train: list, dev: dict[str, list], answers: dict) -> dict:
        """What a run's record adds to seed, curve and final (`answers`: the last epoch's, per dev split)."""
        return {}


def length_buckets(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffle, sort within windows of BUCKET_BATCHES batches by length, cut into batches, shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * BUCKET_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(ids: list[list[int]], pad_id: int, device) -> dict:
    width = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}


# No token is longer than this many characters (WordPiece gives up on words past 100, byte-level BPE's longest
# tokens are shorter): a text cut at CHARS_PER_TOKEN x max_length keeps at least max_length tokens, so what
# truncation keeps is the same, and the tokenizer never sees a text of megabytes (a task file's line may be 4 MiB;
# a dozen of them made the tokenizer abort the process for lack of memory).
CHARS_PER_TOKEN = 256


def clipped(texts, max_length: int):
    """Each text (None kept) cut to what truncation at max_length tokens can keep (CHARS_PER_TOKEN)."""
    keep = CHARS_PER_TOKEN * max_length
    return None if texts is None else [t if t is None or len(t) <= keep else t[:keep] for t in texts]


def require_fast(tokenizer, user: str, why: str) -> None:
    """Offsets and word ids come only from a fast (Rust) tokenizer: `user` needs them for `why`."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"{user} needs a fast tokenizer ({why}); this checkpoint's is not")


@dataclass
class Checkpoint:
    """A model folder that eval.py checked: loaded with this package's classes or transformers' own, importing
    nothing from the folder, unless it brings code that is not ours and the user allowed it (`remote_code`:
    eval.trust_remote_code; docs/security.md). Its config is read once (`pinned`), so every model built from it
    is built from the config that was checked, whatever the folder holds by then. It stands for its path wherever
    one is printed or joined."""

    path: Path
    remote_code: bool = False
    pinned: dict | None = None  # config.json's content as checked (or the versioned config it names)
    # An export of ours to transformers' own classes, read back (eval/exported.py): our head's tensors, which every
    # model is loaded from (pinned is then the config it was exported from)
    imported: dict | None = None

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, name) -> Path:
        return self.path / name

    @classmethod
    def of(cls, checkpoint) -> "Checkpoint":
        """A Checkpoint as it is, or a folder's path as one with nothing to run of its own."""
        return checkpoint if isinstance(checkpoint, cls) else cls(Path(checkpoint))

    def saved_config(self) -> dict:
        """config.json as the checkpoint was checked: read (and kept) on first use."""
        if self.pinned is None:
            saved = read_json(self.path / "config.json", what="config.json")
            if not isinstance(saved, dict):
                raise UserError(f"checkpoint {self.path}: config.json is not a JSON object")
            if isinstance(saved.get("configuration_files"), list):  # transformers' versioned configs: its choice
                name = get_configuration_file(saved["configuration_files"])
                if name != "config.json":
                    saved = read_json(inside(self.path, name, f"{self.path / 'config.json'}"), what="config.json")
            self.pinned = saved
        return copy.deepcopy(self.pinned)

    def model_type(self) -> str | None:
        return self.saved_config().get("model_type")


def our_class(auto_class):
    """This package's class that `auto_class` (an Auto class of transformers) stands for on a crammed checkpoint:
    the one our checkpoints' auto_map names for it."""
    maps = [crammed.AUTO_MAP, *(getattr(getattr(crammed, name), "extra_auto_map", {}) for name in crammed.CLASSES)]
    reference = next((m[auto_class.__name__] for m in maps if auto_class.__name__ in m), None)
    if reference is None:
        raise UserError(f"a crammed checkpoint has no {auto_class.__name__} (its auto_map names none)")
    return getattr(crammed, reference.rsplit(".", 1)[1])


def load_config(checkpoint: Checkpoint, **changes):
    """The checkpoint's config: ours read by this package's CrammedConfig, an in-library one by transformers, and
    only with checkpoint.remote_code by the folder's own configuration code."""
    checkpoint = Checkpoint.of(checkpoint)
    if checkpoint.remote_code:
        return AutoConfig.from_pretrained(checkpoint.path, trust_remote_code=True, **changes)
    saved = checkpoint.saved_config()  # the config that was checked, not the folder's file as it is now
    if saved.get("model_type") == "crammed":
        config = crammed.CrammedConfig.from_dict(saved, **changes)
        check_crammed_config(checkpoint.path, config)  # its values of their kinds, its kernels portable
    elif saved.get("model_type") in CONFIG_MAPPING:
        config = CONFIG_MAPPING[saved["model_type"]].from_dict(saved, **changes)
    else:  # no model_type: transformers' own guess from the folder
        return AutoConfig.from_pretrained(checkpoint.path, trust_remote_code=False, **changes)
    config._name_or_path = str(checkpoint.path)  # as from_pretrained names it
    return config


def auto_model(auto_class, checkpoint: Checkpoint, random_init: bool, dropout: float | None = None, fit=None,
               **config_changes):
    """The one way eval builds a model: `auto_class` (an Auto class of transformers) from the checkpoint, or with
    random_init the same architecture untrained. `config_changes` set the head (num_labels, ...); a crammed
    checkpoint, pretrained without dropout, gets the fine-tuning `dropout` (Cramming's recipe) and `fit(config)`.
    Our checkpoints build this package's classes and import nothing from their folder (docs/security.md)."""
    checkpoint = Checkpoint.of(checkpoint)
    config = load_config(checkpoint, **config_changes)
    if config.model_type == "crammed" and dropout is not None:
        config.hidden_dropout = config.attention_dropout = config.classifier_dropout = dropout
        if fit is not None:
            fit(config)
    trust = checkpoint.remote_code
    try:
        if not trust and config.model_type == "crammed":
            cls = our_class(auto_class)
            if random_init:
                return cls._from_config(config)
            if checkpoint.imported is not None:  # the same load as from a folder of ours, from the tensors read back
                # (copies: the model takes the tensors it is given as its own, and fine-tuning changes them)
                fresh = {key: value.clone() for key, value in checkpoint.imported.items()}
                return cls.from_pretrained(None, config=config, state_dict=fresh)
            return cls.from_pretrained(checkpoint.path, config=config)
        if random_init:
            return auto_class.from_config(config, trust_remote_code=trust)
        return auto_class.from_pretrained(checkpoint.path, config=config, trust_remote_code=trust)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError, MemoryError, pickle.UnpicklingError) as err:
        # what the checks before could not see (a pickled pytorch_model.bin that asks for code, weights that do
        # not fit): the checkpoint's, in one line
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UserError(f"checkpoint {checkpoint.path} could not be loaded as {auto_class.__name__}: "
                        f"{first[:300]}") from None


def build_optimizer(model, recipe, fused: bool = True) -> torch.optim.AdamW:
    """The recipe's AdamW. Fused (one kernel over all tensors, CPU and CUDA) by default: the for-loop version runs
    a dozen small ops per tensor, which on CPU made the optimizer step most of a small model's fine-tuning time."""
    return torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=tuple(recipe.betas), eps=recipe.eps,
                             weight_decay=recipe.weight_decay, fused=fused)


def predict(head: Head, model, items: list, task: TaskData, batch_size: int, pad_id: int, device, autocast) -> list:
    """Every item's prediction, in the items' order: every head's dev-set loop. Chunks of PREDICT_BATCHES training
    batches, shortest items first so that a chunk pads little (run_epochs calls it under inference_mode)."""
    order = sorted(range(len(items)), key=lambda i: head.length(items[i]))
    out = [None] * len(items)
    step = batch_size * PREDICT_BATCHES
    for start in range(0, len(order), step):
        chunk = order[start:start + step]
        batch = [items[i] for i in chunk]
        with autocast():
            outputs = model(**head.collate(batch, pad_id, device))
        for i, prediction in zip(chunk, head.decode(outputs, batch, task)):
            out[i] = prediction
    return out


def optimizer_step(loss, model, optimizer, scheduler, scaler, grad_clip) -> float:
    """Backward, clip, step and schedule. Under fp16 the scaler keeps small gradients from flushing to zero and
    skips a step whose gradients overflowed; for bf16 and fp32 it is disabled and passes everything through."""
    scaler.scale(loss).backward()
    if grad_clip:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scale = scaler.get_scale()  # 1.0 when disabled
    scaler.step(optimizer)
    scaler.update()
    if scaler.get_scale() >= scale:  # a step skipped for overflow (the scale was cut) does not advance the schedule
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def score(task: TaskData, split: str, predictions) -> dict:
    """The task's own scorer (SuperGLUE's see whole examples: MultiRC's questions, AX-g's pairs), else the
    named GLUE metrics against the rows' labels."""
    if task.scorer is not None:
        return task.scorer(split, predictions, task.dev[split])
    return compute_metrics(task.metric_names, predictions, [row.label for row in task.dev[split]])


def steps_per_run(task: TaskData, recipe, items: int | None = None) -> int:
    """Optimizer steps of one fine-tuning run over `items` training items (the task's rows unless given: SQuAD
    trains on its windows, the overall progress bar counts rows)."""
    return math.ceil((len(task.train) if items is None else items) / recipe.batch_size) * recipe.epochs


def run_task(checkpoint: str, tokenizer, task: TaskData, recipe, seed: int, runtime, random_init: bool, label: str,
             progress=None) -> dict:
    """One seed of one task: fine-tuned with its head, or scored as the checkpoint is by an untrained one."""
    head = HEADS.get_or_explain(task.head)
    if HEADS.trait(head, "untrained"):
        return {"seed": seed, "curve": [],
                "final": head(checkpoint, tokenizer, task, recipe, seed, runtime, random_init)}
    return finetune(head, checkpoint, tokenizer, task, recipe, seed, runtime, random_init, label, progress)


def finetune(head: Head, checkpoint: str, tokenizer, task: TaskData, recipe, seed: int, runtime, random_init: bool,
             label: str, progress=None) -> dict:
    """One run of `head` on `task`: its record (seed, the per-epoch curve, the final dev scores, and the head's
    own additions). `progress`: the run-wide tqdm bar, advanced per step and showing the loss."""
    torch.manual_seed(seed)
    model = head.build(checkpoint, task, recipe, random_init).to(runtime.device)
    max_length = head.max_length(model.config, recipe, label)
    train = head.encode(tokenizer, task, task.train, max_length)
    dev = {split: head.encode(tokenizer, task, rows, max_length) for split, rows in task.dev.items()}
    autocast, pad_id, device = runtime.autocast(), tokenizer.pad_token_id, runtime.device
    answers = {}

    def batch_loss(batch):
        items = [train[i] for i in batch]
        with autocast():
            return head.loss(model, head.collate(items, pad_id, device), items)

    def predict_split(split):
        predictions = predict(head, model, dev[split], task, recipe.batch_size, pad_id, device, autocast)
        answers[split] = head.answers(task, split, dev[split], predictions)
        return answers[split]

    lengths = [head.length(item) for item in train]
    return run_epochs(task, recipe, seed, runtime, model, lengths, batch_loss, predict_split, label, progress) | \
        head.record(train, dev, answers)


def run_epochs(task, recipe, seed, runtime, model, train_lengths, batch_loss, predict, label, progress) -> dict:
    """Fine-tune `model` for the recipe's epochs and score every dev split after each. `batch_loss(indices)` is a
    batch's loss, `predict(split)` the split's predictions as the task's scorer reads them."""
    rng = random.Random(seed)
    optimizer = build_optimizer(model, recipe)
    total = steps_per_run(task, recipe, len(train_lengths))
    schedule = FINETUNE_SCHEDULES.get_or_explain(recipe.schedule)
    scheduler = schedule.build(optimizer, int(recipe.warmup_fraction * total), total)
    scaler, curve = runtime.grad_scaler(), []
    for epoch in range(1, recipe.epochs + 1):
        model.train()
        losses = []
        if progress is not None:
            progress.set_description(f"{label} epoch {epoch}/{recipe.epochs}", refresh=False)
        started = time.perf_counter()
        for batch in length_buckets(train_lengths, recipe.batch_size, rng):
            losses.append(optimizer_step(batch_loss(batch), model, optimizer, scheduler, scaler, recipe.grad_clip))
            if progress is not None:
                progress.set_postfix_str(f"loss {np.mean(losses[-50:]):.4f}", refresh=False)
                progress.update(1)
        train_seconds = time.perf_counter() - started  # the training loop alone, for throughput (scripts/bench.py)
        model.eval()
        with torch.inference_mode():
            scores = {split: score(task, split, predict(split)) for split in task.dev}
        curve.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "train_seconds": round(train_seconds, 3),
                      "train_examples": len(train_lengths), "dev": scores})
    return {"seed": seed, "curve": curve, "final": curve[-1]["dev"]}
