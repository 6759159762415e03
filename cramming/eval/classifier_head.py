"""The sequence classifier, the head of GLUE, SuperGLUE's pair tasks and your own task: the checkpoint's
AutoModelForSequenceClassification on one text or a pair, its own loss (a task without label names, STS-B, is a
regression: one output, mean squared error), the argmax (or the output) as the prediction."""

from dataclasses import dataclass

from transformers import AutoModelForSequenceClassification

from .finetune import Head, auto_model, clipped
from .tasks import TaskData


@dataclass
class Row:
    ids: list[int]
    label: int | float


def encode_texts(tokenizer, examples, max_length: int) -> list[list[int]]:
    firsts = clipped([e.text_a for e in examples], max_length)
    seconds = clipped([e.text_b for e in examples], max_length) if examples and examples[0].text_b is not None else None
    return tokenizer(firsts, seconds, truncation=True, max_length=max_length)["input_ids"]


def build_classifier(checkpoint: str, task: TaskData, dropout: float, random_init: bool):
    regression = task.label_names is None
    return auto_model(AutoModelForSequenceClassification, checkpoint, random_init, dropout,
                      num_labels=1 if regression else len(task.label_names),
                      **({"problem_type": "regression"} if regression else {}))


class Classifier(Head):
    def build(self, checkpoint, task, recipe, random_init):
        return build_classifier(checkpoint, task, recipe.dropout, random_init)

    def encode(self, tokenizer, task, rows, max_length):
        cast = float if task.label_names is None else int
        return [Row(ids, cast(row.label)) for ids, row in zip(encode_texts(tokenizer, rows, max_length), rows)]

    def decode(self, outputs, items, task):
        logits = outputs.logits.float()
        return (logits[:, 0] if task.label_names is None else logits.argmax(-1)).tolist()
