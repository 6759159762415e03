"""eval's fine-tuning loop (eval/finetune.py, eval/recipe.py), fast: the batches it draws, the optimizer step (clip,
fp16 grad scaler, schedule), the model it starts from (the checkpoint's weights with the recipe's dropout, or an
untrained twin for the baseline), the seed that makes a run repeatable, and the training subset shared by every
seed. A tiny crammed checkpoint is written by the test itself, so nothing here waits for a pretraining run."""

import json
import random
import shutil
from itertools import pairwise
from types import SimpleNamespace

import pytest
import torch
from conftest import glue_folder
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast

from cramming.checkpoints.step_folder import MARKER
from cramming.errors import UserError
from cramming.eval import recipe
from cramming.eval.classifier_head import Classifier
from cramming.eval.config import EvalConfig, EvalRunConfig, Recipe
from cramming.eval.finetune import BUCKET_BATCHES, auto_model, finetune, length_buckets, optimizer_step
from cramming.eval.span_head import encode_spans
from cramming.eval.squad import encode_windows
from cramming.eval.squad_data import SquadOptions
from cramming.eval.tasks import GLUE_SET, Example, TaskData
from cramming.eval.token_head import encode_words
from cramming.impl import Runtime
from cramming.model import CrammedConfig, CrammedForMaskedLM, auto_map_of

CPU = Runtime(torch.device("cpu"), "fp32", False)
WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny crammed MLM checkpoint with a word-level tokenizer, as pretraining writes one (auto_map included)."""
    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    torch.manual_seed(0)
    config = CrammedConfig(vocab_size=48, hidden_size=32, num_layers=1, num_heads=4, ffn_size=64, max_seq_length=32)
    model = CrammedForMaskedLM(config)
    model.config.auto_map = auto_map_of(model)
    model.save_pretrained(folder)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    tokenizer.save_pretrained(folder)
    return str(folder), tokenizer, model.state_dict()


def sentences(count: int, seed: int) -> list[Example]:
    """Pairs whose label is whether the first sentence holds w0: something a tiny model can start to learn."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        words = rng.sample(WORDS, rng.randrange(2, 8))
        rows.append(Example(" ".join(words), " ".join(rng.sample(WORDS, 3)), int("w0" in words)))
    return rows


TASK = TaskData("pairs", sentences(24, 0), {"dev": sentences(8, 1)}, ["no", "yes"], ["accuracy"], "accuracy", "test")


# ---------------------------------------------------------------- batches


def test_buckets_hold_every_item_once_in_shuffled_batches_of_like_length():
    """Within a window of BUCKET_BATCHES batches items are sorted by length, so each batch pads little; the batches
    are then shuffled, and the same seed draws the same batches."""
    draw = random.Random(7)
    lengths = [draw.randrange(1, 100) for _ in range(8 * BUCKET_BATCHES + 33)]  # the last batch: one item
    batches = length_buckets(lengths, 8, random.Random(0))
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(1 <= len(batch) <= 8 for batch in batches) and sorted(map(len, batches))[:2] == [1, 8]
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert sum(spread) / len(spread) < 10, spread  # random batches of 8 would spread about 75
    firsts = [min(lengths[i] for i in b) for b in batches]
    rises = sum(a <= b for a, b in pairwise(firsts))
    assert rises < 0.75 * (len(firsts) - 1), rises  # shuffled: unshuffled, nearly every batch starts longer
    assert length_buckets(lengths, 8, random.Random(0)) == batches != length_buckets(lengths, 8, random.Random(1))


# ---------------------------------------------------------------- the optimizer step


def step_once(grad_clip, scaler=None):
    """One optimizer_step on a parameter whose gradient is (3, 4, 0, 0) (norm 5), with SGD at lr 1 and a schedule
    that halves the rate at each step."""
    weight = torch.nn.Parameter(torch.zeros(4))
    model = torch.nn.Module()
    model.weight = weight
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    loss = (weight * torch.tensor([3.0, 4.0, 0.0, 0.0])).sum()
    value = optimizer_step(loss, model, optimizer, scheduler, scaler, grad_clip)
    return weight.detach(), weight.grad, scheduler.last_epoch, optimizer.param_groups[0]["lr"], value


def test_a_step_clips_the_gradient_norm_steps_and_advances_the_schedule():
    weight, grad, steps, lr, value = step_once(grad_clip=1.0)
    torch.testing.assert_close(weight, torch.tensor([-0.6, -0.8, 0.0, 0.0]))  # the gradient cut to norm 1
    assert grad is None and steps == 1 and lr == 0.5 and value == 0.0  # zeroed, scheduled, the loss returned
    weight, *_ = step_once(grad_clip=None)
    torch.testing.assert_close(weight, torch.tensor([-3.0, -4.0, 0.0, 0.0]))  # no clip: the whole gradient


class Regressor(torch.nn.Module):
    """Just enough of a sequence classifier for optimizer_step: a loss that can be made to overflow."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels, blow_up=1.0):
        return SimpleNamespace(loss=((self.linear(x).float().squeeze(-1) - labels) ** 2).mean() * blow_up)


def one_step(precision: str, blow_up: float):
    torch.manual_seed(0)
    model, runtime = Regressor(), Runtime(torch.device("cpu"), precision, False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = runtime.grad_scaler()
    before = [p.detach().clone() for p in model.parameters()]
    inputs = {"x": torch.randn(8, 4), "blow_up": blow_up}
    with runtime.autocast()():
        loss = model(**inputs, labels=torch.randn(8)).loss
    optimizer_step(loss, model, optimizer, scheduler, scaler, grad_clip=1.0)
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return scaler, changed, all(torch.isfinite(p).all() for p in model.parameters()), scheduler.last_epoch


def test_fp16_finetuning_goes_through_a_grad_scaler():
    scaler, changed, finite, scheduled = one_step("fp16", 1e-4)  # small enough that the scaled gradients fit
    assert scaler.is_enabled() and changed and finite and scaler.get_scale() == 65536.0 and scheduled == 1
    # gradients that overflow once scaled: the scaler skips the step (and the schedule) and halves its scale
    scaler, changed, finite, scheduled = one_step("fp16", 1e36)
    assert not changed and finite and scaler.get_scale() == 65536.0 / 2 and scheduled == 0


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_no_grad_scaler_outside_fp16(precision):
    scaler, changed, finite, scheduled = one_step(precision, 1.0)
    assert not scaler.is_enabled() and changed and finite and scheduled == 1


# ---------------------------------------------------------------- the model a run starts from


def test_a_crammed_checkpoint_gets_the_recipes_dropout_and_the_baseline_fresh_weights(checkpoint):
    """Cramming pretrains without dropout and fine-tunes with it (eval.recipe.dropout), in every dropout of the
    model; the pretrained model holds the checkpoint's encoder, the random-init baseline none of it."""
    folder, _, weights = checkpoint
    model = auto_model(AutoModelForSequenceClassification, folder, False, 0.3, num_labels=2)
    config = model.config
    assert config.hidden_dropout == config.attention_dropout == config.classifier_dropout == 0.3
    rates = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.3}, rates
    state = model.state_dict()
    shared = [k for k in weights if k in state]
    assert shared and all(torch.equal(state[k], weights[k]) for k in shared)
    baseline = auto_model(AutoModelForSequenceClassification, folder, True, 0.3, num_labels=2).state_dict()
    assert not any(torch.equal(baseline[k], weights[k]) for k in shared if weights[k].dim() > 1)


def test_a_seed_repeats_its_run_and_another_seed_makes_another(checkpoint):
    """The seed sets the head's initialisation, the dropout masks and the batches: the same seed twice gives the
    same run to the last digit, another seed another run."""
    folder, tokenizer, _ = checkpoint
    plan = Recipe(epochs=2, batch_size=4, max_length=24, lr=1e-3)

    def curve(seed):
        run = finetune(Classifier(), folder, tokenizer, TASK, plan, seed, CPU, False, "test")
        return [(epoch["train_loss"], epoch["dev"]["dev"]["accuracy"]) for epoch in run["curve"]]

    first = curve(0)
    assert len(first) == 2 and curve(0) == first != curve(1)


# ---------------------------------------------------------------- the recipe around the runs


def test_the_pretrained_row_starts_from_the_checkpoint_and_the_baseline_from_scratch(monkeypatch, tmp_path):
    """eval.baseline=random-init: every task and seed runs twice, once from the checkpoint's weights (the row
    `pretrained`) and once from an untrained model of its architecture (the row `random-init`)."""
    calls = []

    def fake_run(checkpoint, tokenizer, task, plan, seed, runtime, random_init, label, progress):
        calls.append((label.split()[0], random_init, seed))
        return {"seed": seed, "curve": [], "final": {"dev": {"accuracy": 50.0 + 10 * random_init}}}

    monkeypatch.setattr(recipe, "run_task", fake_run)
    config = EvalRunConfig(checkpoint="x", eval=EvalConfig(tasks=["rte"], seeds=2, baseline="random-init",
                                                           results_table=str(tmp_path / "results.csv")))
    task = TaskData("rte", TASK.train, TASK.dev, ["entailment", "not_entailment"], ["accuracy"], "accuracy", "test")
    models, rows, _ = recipe.run_models(config, "x", None, [task], CPU, tmp_path)
    assert calls == [("pretrained", False, 0), ("pretrained", False, 1), ("random-init", True, 0),
                     ("random-init", True, 1)]
    assert rows["pretrained"]["rte"] == 50.0 and rows["random-init"]["rte"] == 60.0 and list(models) == list(rows)


def test_a_capped_training_set_is_one_random_sample_for_every_seed(tmp_path):
    """eval.max_train_examples draws its subset with SUBSET_SEED, not the run's seed: a random sample (not the
    file's first rows), the same for every seed and every evaluation, so seeds differ by fine-tuning alone."""
    glue = glue_folder(tmp_path, train=48)

    def subset(seed):
        config = EvalRunConfig(checkpoint="x", seed=seed,
                               eval=EvalConfig(tasks=["rte"], data_dir=str(glue), max_train_examples=10))
        (task,), _ = recipe.load_tasks(config)
        return [(e.text_a, e.label) for e in task.train]

    (full,), _ = recipe.load_tasks(EvalRunConfig(checkpoint="x", eval=EvalConfig(tasks=["rte"], data_dir=str(glue))))
    everything = [(e.text_a, e.label) for e in full.train]
    drawn = subset(0)
    assert len(drawn) == 10 and drawn == subset(3) and drawn != everything[:10]
    assert drawn == random.Random(recipe.SUBSET_SEED).sample(everything, 10)


@pytest.mark.parametrize("encode, message", [
    (lambda slow: encode_windows(slow, [], 64, SquadOptions()),
     "eval=squad needs a fast tokenizer (character offsets)"),
    (lambda slow: encode_spans(slow, [], 64), "WSC's span head needs a fast tokenizer (character offsets)"),
    (lambda slow: encode_words(slow, [], {}, 64),
     "eval=ner needs a fast tokenizer (word_ids, to find each word's first piece)"),
])
def test_a_head_that_reads_offsets_refuses_a_slow_tokenizer_in_one_line(encode, message):
    """Character offsets and word ids come only from a fast tokenizer: the head says which one it needs, and why,
    before anything is encoded (a slow one would fail deep inside the encoding)."""
    with pytest.raises(UserError) as err:
        encode(SimpleNamespace(is_fast=False))
    assert str(err.value) == f"{message}; this checkpoint's is not"


# ---------------------------------------------------------------- the checkpoint eval.py starts from


def test_a_checkpoint_is_checked_whole_before_any_task_is_read(checkpoint, tmp_path):
    """recipe.check_checkpoint, eval.py's first step: a model folder (not a step folder), with a config, weights,
    and a tokenizer that fits the embedding table and pads. Each refusal is one line naming the folder."""
    source, tokenizer, _ = checkpoint

    def folder(name, change=None):
        path = tmp_path / name
        shutil.copytree(source, path)
        if change is not None:
            change(path)
        return path

    loaded, config = recipe.check_checkpoint(folder("whole"))
    assert (len(loaded), config.vocab_size) == (len(tokenizer), 48)

    def grown(size):
        """The tokenizer with tokens added until it has `size` (the embedding table has config.vocab_size rows)."""
        def change(path):
            tok = PreTrainedTokenizerFast.from_pretrained(path)
            tok.add_tokens([f"extra{i}" for i in range(size - len(tok))])
            tok.save_pretrained(path)
        return change

    def far_id(path):
        """As many tokens as before, one of them with an id past the table: counts alone would pass it."""
        saved = json.loads((path / "tokenizer.json").read_text())
        vocab = saved["model"]["vocab"]
        vocab[max(vocab, key=vocab.get)] = 1000
        (path / "tokenizer.json").write_text(json.dumps(saved))

    def unpadded(path):
        saved = json.loads((path / "tokenizer_config.json").read_text())
        saved.pop("pad_token", None)
        (path / "tokenizer_config.json").write_text(json.dumps(saved))
        (path / "special_tokens_map.json").unlink(missing_ok=True)

    def step(path):
        (path / MARKER).write_text("")
        torch.save({}, path / "state.pt")

    cases = [
        (step, "is a step folder (a resume point of a run), not a model folder; make it one with "
               + "`python -m cramming.export"),
        (lambda path: (path / "config.json").unlink(), "has no config.json: not a model folder"),
        (lambda path: (path / "model.safetensors").unlink(), "has no weights (model.safetensors)"),
        (grown(49), "the tokenizer gives token ids up to 48 but the model has only 48 embeddings; the tokenizer "
                    + "does not belong to this model"),
        (far_id, "the tokenizer gives token ids up to 1,000 but the model has only 48 embeddings"),
        (unpadded, "the tokenizer has no padding token"),
    ]
    for number, (change, message) in enumerate(cases):
        path = folder(f"case{number}", change)
        with pytest.raises(UserError) as err:
            recipe.check_checkpoint(path)
        assert str(err.value).startswith(f"checkpoint {path}") and message in str(err.value)
    recipe.check_checkpoint(folder("fits", grown(48)))  # as many tokens as embeddings: it fits


def test_comparability_names_the_published_tasks_that_eval_tasks_leaves_out():
    """Only the whole GLUE task set, each task loaded and on all its data, compares with published scores:
    tasks_left_out lists GLUE's averaged tasks missing from eval.tasks (in GLUE's order), beside the skipped tasks
    and the cap, and describe() says them in one line; the full default set has no reason at all."""
    assert recipe.comparability(EvalRunConfig(checkpoint="x"), {}) == {}
    capped = EvalRunConfig(checkpoint="x", eval=EvalConfig(tasks=["qnli", "rte"], max_train_examples=4))
    left_out = [t for t in GLUE_SET if t not in ("rte", "qnli")]
    why = recipe.comparability(capped, {"qnli": "no files"})
    assert why == {"skipped_tasks": ["qnli"], "max_train_examples": 4, "tasks_left_out": left_out}
    assert recipe.describe(why) == f"skipped qnli; eval.max_train_examples=4; not in eval.tasks: {', '.join(left_out)}"
