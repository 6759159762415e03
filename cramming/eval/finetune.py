"""Fine-tune one model on one task with one seed, and score it on the dev split(s) after every epoch.

Batches are bucketed by length and padded only to the longest row of the batch, so short GLUE sentences
do not pay for 128 positions; dev passes run under inference_mode.
"""

import math
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, get_scheduler

from ..registry import Registry
from .glue_metrics import compute_metrics
from .tasks import TaskData

FINETUNE_SCHEDULES = Registry("fine-tuning schedule")  # eval.recipe.schedule


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


def encode(tokenizer, examples, max_length: int) -> list[list[int]]:
    firsts = [e.text_a for e in examples]
    seconds = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
    return tokenizer(firsts, seconds, truncation=True, max_length=max_length)["input_ids"]


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


def auto_model(auto_class, checkpoint: str, random_init: bool, dropout: float | None = None, fit=None,
               **config_changes):
    """The one way eval builds a model: `auto_class` (an Auto class of transformers) from the checkpoint, or with
    random_init the same architecture untrained. `config_changes` set the head (num_labels, ...); a crammed
    checkpoint, pretrained without dropout, gets the fine-tuning `dropout` (Cramming's recipe) and `fit(config)`."""
    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=True, **config_changes)
    if config.model_type == "crammed" and dropout is not None:
        config.hidden_dropout = config.attention_dropout = config.classifier_dropout = dropout
        if fit is not None:
            fit(config)
    if random_init:
        return auto_class.from_config(config, trust_remote_code=True)
    return auto_class.from_pretrained(checkpoint, config=config, trust_remote_code=True)


def build_classifier(checkpoint: str, task: TaskData, dropout: float, random_init: bool):
    regression = task.label_names is None
    return auto_model(AutoModelForSequenceClassification, checkpoint, random_init, dropout,
                      num_labels=1 if regression else len(task.label_names),
                      **({"problem_type": "regression"} if regression else {}))


def build_optimizer(model, recipe, fused: bool = True) -> torch.optim.AdamW:
    """The recipe's AdamW. Fused (one kernel over all tensors, CPU and CUDA) by default: the for-loop version runs
    a dozen small ops per tensor, which on CPU made the optimizer step most of a small model's fine-tuning time."""
    return torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=tuple(recipe.betas), eps=recipe.eps,
                             weight_decay=recipe.weight_decay, fused=fused)


def in_chunks(count: int, batch_size: int, autocast, forward, length=None):
    """Every head's dev-set prediction loop: the items 0..count-1 in chunks of PREDICT_BATCHES training batches
    (shortest first when `length` is given, so a chunk pads little); yields each chunk's indices with
    forward(chunk), run under autocast. run_epochs calls the heads' predict under inference_mode."""
    order = sorted(range(count), key=length) if length else list(range(count))
    step = batch_size * PREDICT_BATCHES
    for start in range(0, count, step):
        chunk = order[start:start + step]
        with autocast():
            out = forward(chunk)
        yield chunk, out


@torch.inference_mode()
def predict(model, ids, pad_id, batch_size, device, autocast, regression: bool) -> np.ndarray:
    model.eval()
    out = np.empty(len(ids), dtype=np.float64 if regression else np.int64)

    def forward(chunk):
        return model(**collate([ids[i] for i in chunk], pad_id, device)).logits.float()

    for chunk, logits in in_chunks(len(ids), batch_size, autocast, forward, length=lambda i: len(ids[i])):
        out[chunk] = (logits[:, 0] if regression else logits.argmax(-1)).cpu().numpy()
    return out


def train_step(model, inputs, labels, optimizer, scheduler, scaler, autocast, grad_clip) -> float:
    """One optimizer step. Under fp16 the scaler keeps small gradients from flushing to zero and skips a step whose
    gradients overflowed; for bf16 and fp32 it is disabled and passes everything through."""
    return optimizer_step(classifier_loss(model, inputs, labels, autocast), model, optimizer, scheduler, scaler,
                          grad_clip)


def classifier_loss(model, inputs, labels, autocast) -> torch.Tensor:
    """The sequence classifier's own loss on a collated batch (regression: MSE, else cross-entropy)."""
    with autocast():
        return model(**inputs, labels=labels).loss


def optimizer_step(loss, model, optimizer, scheduler, scaler, grad_clip) -> float:
    """Backward, clip, step and schedule for a loss of any head (every head's run_epochs step; train_step)."""
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


def score(task: TaskData, split: str, predictions, labels) -> dict:
    """The task's own scorer (SuperGLUE's see whole examples: MultiRC's questions, AX-g's pairs), else the
    named GLUE metrics."""
    if task.scorer is not None:
        return task.scorer(split, predictions, task.dev[split])
    return compute_metrics(task.metric_names, predictions, labels)


def steps_per_run(task: TaskData, recipe) -> int:
    """Optimizer steps of one fine-tuning run, for the overall progress bar."""
    return math.ceil(len(task.train) / recipe.batch_size) * recipe.epochs


def finetune(checkpoint: str, tokenizer, task: TaskData, recipe, seed: int, runtime, random_init: bool,
             label: str, progress=None) -> dict:
    """`progress`: the run-wide tqdm bar (every task, seed and epoch), advanced per step and showing the loss."""
    torch.manual_seed(seed)
    regression = task.label_names is None
    train_ids = encode(tokenizer, task.train, recipe.max_length)
    train_labels = torch.tensor([e.label for e in task.train], dtype=torch.float32 if regression else torch.long)
    dev = {split: (encode(tokenizer, rows, recipe.max_length), [e.label for e in rows])
           for split, rows in task.dev.items()}
    model = build_classifier(checkpoint, task, recipe.dropout, random_init).to(runtime.device)
    autocast, pad_id, device = runtime.autocast(), tokenizer.pad_token_id, runtime.device

    def batch_loss(batch):
        inputs = collate([train_ids[i] for i in batch], pad_id, device)
        return classifier_loss(model, inputs, train_labels[batch].to(device), autocast)

    def predict_split(split):
        return predict(model, dev[split][0], pad_id, recipe.batch_size, device, autocast, regression)

    labels = {split: split_labels for split, (_, split_labels) in dev.items()}
    return run_epochs(task, recipe, seed, runtime, model, [len(r) for r in train_ids], batch_loss, predict_split,
                      label, progress, labels)


def run_epochs(task, recipe, seed, runtime, model, train_lengths, batch_loss, predict, label, progress,
               labels=None) -> dict:
    """Fine-tune `model` for the recipe's epochs and score every dev split after each: every head's loop.
    `batch_loss(indices)` is a batch's loss (under autocast), `predict(split)` the split's predictions, `labels`
    {split: labels} for the GLUE metrics (None where the task's own scorer reads its examples)."""
    rng = random.Random(seed)
    optimizer = build_optimizer(model, recipe)
    total = steps_per_run(task, recipe)
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
            scores = {split: score(task, split, predict(split), (labels or {}).get(split)) for split in task.dev}
        curve.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "train_seconds": round(train_seconds, 3),
                      "train_examples": len(train_lengths), "dev": scores})
    return {"seed": seed, "curve": curve, "final": curve[-1]["dev"]}
