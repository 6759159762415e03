"""docs/architecture.md's "adding X takes one file", shown for each kind it names: the test writes ONE new Python
file that defines and registers the component, names it in $CRAMMING_PLUGINS (cramming/plugins.py: loading a
config imports it), and the component then works through the public path, with no other file touched: a position scheme and an attention
pattern validate and run in a model, an optimizer builds and steps, an objective builds a batch and a loss, a
GLUE-style benchmark is fine-tuned by eval's recipe, and an engine carries a whole pretraining run. Each test
removes its registration afterwards."""

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from cramming import impl as impl_
from cramming.data.tokenizer import SPECIAL_IDS
from cramming.errors import UserError
from cramming.plugins import VARIABLE, module_name
from cramming.run import build_model
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
SMALL = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=32", "arch.num_heads=2",
         "arch.ffn_size=64", "impl=cpu", "data=sanity", "data.vocab_size=128", "data.seq_length=32"]
VOCAB = 128


@pytest.fixture
def one_file(tmp_path, monkeypatch):
    """one_file(source, registry, name): write `source` as the only new file and name it in $CRAMMING_PLUGINS;
    returns its module's name (imported when a config is loaded). `name` leaves `registry` (and the module
    sys.modules) when the test ends."""
    added = []

    def write(source: str, registry: dict, name: str) -> str:
        path = tmp_path / f"{name.replace('-', '_')}.py"
        path.write_text(textwrap.dedent(source))
        monkeypatch.setenv(VARIABLE, str(path))
        added.append((registry, name, module_name(str(path))))
        assert name not in registry
        return module_name(str(path))

    yield write
    for registry, name, module in added:
        registry.pop(name, None)
        sys.modules.pop(module, None)


def config_for(*overrides, base=SMALL):
    """The run config as the command line composes and validates it."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=[*base, *overrides]))


def model_for(config, seed=0):
    torch.manual_seed(seed)
    return build_model(config.arch, VOCAB, SPECIAL_IDS, impl_.resolve(config.impl, config.arch)).eval()


def ids(seed=0, batch=2, seq=32):
    return torch.randint(5, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


POSITION = '''
    """A position table that is learned but starts as half the sinusoid table: its own init, through the model's
    init hook."""
    import torch
    from torch import nn

    from cramming.model.positions import POSITIONS, PositionScheme, rows, sinusoid_table


    class HalfSinusoidTable(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.table = nn.Parameter(torch.empty(config.max_seq_length, config.hidden_size))

        def init_weights_(self, init, std):
            init.copy_(self.table, 0.5 * sinusoid_table(*self.table.shape))

        def forward(self, seq_len, offset=0, ids=None):
            return rows(self.table, seq_len, offset, ids)


    @POSITIONS.register_one("half-sinusoid")
    class HalfSinusoid(PositionScheme):
        table = HalfSinusoidTable
'''


def test_a_position_scheme_is_one_file(one_file):
    from cramming.model.positions import POSITIONS, sinusoid_table

    one_file(POSITION, POSITIONS, "half-sinusoid")
    model = model_for(config_for("arch.position=half-sinusoid"))
    table = model.encoder.positions.table
    assert torch.equal(table, 0.5 * sinusoid_table(*table.shape))  # initialised by its own hook
    x, y = ids(), ids().flip(1)
    assert torch.isfinite(model(x).logits).all()
    with torch.no_grad():
        table.zero_()  # positions are what tells a token's place: without them a permutation permutes the output
        torch.testing.assert_close(model(x).logits.flip(1), model(y).logits)
    with pytest.raises(UserError, match="longer than the half-sinusoid position table"):  # the base class's problem
        config_for("arch.position=half-sinusoid", "arch.max_seq_length=16")


PATTERN = '''
    """Each query sees its neighbours only (keys at most one position away), whatever arch.attention.window says."""
    from cramming.model.patterns import PATTERNS, Global


    @PATTERNS.register_one("neighbours")
    class Neighbours(Global):
        token_subsets = False

        def kernel_args(self, config):
            return {"window": 1}

        def visible(self, query_pos, key_pos, window=None, **unused):
            return (query_pos[..., :, None] - key_pos[..., None, :]).abs() <= window
'''


def test_an_attention_pattern_is_one_file(one_file):
    from cramming.model.patterns import PATTERNS

    one_file(PATTERN, PATTERNS, "neighbours")
    for pattern, reaches in (("neighbours", False), ("global", True)):
        model = model_for(config_for(f"arch.attention.pattern=[{pattern}]"))
        x = ids()
        far = x.clone()
        far[:, 10] = (far[:, 10] + 1 - 5) % (VOCAB - 5) + 5  # a token ten places from position 0
        with torch.no_grad():
            moved = not torch.equal(model(x).logits[:, 0], model(far).logits[:, 0])
        assert moved == reaches, pattern  # one layer: position 0 sees positions 0 and 1 only under neighbours


OPTIMIZER = '''
    """Sign descent: every coordinate moves by train.lr against its gradient's sign."""
    import torch

    from cramming.train.optim import OPTIMIZERS


    class SignDescent(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad.sign(), alpha=-group["lr"])


    @OPTIMIZERS.register("sign-descent", normalised_updates=True)
    def sign_descent(model, cfg):
        return SignDescent([p for p in model.parameters() if p.requires_grad], cfg.lr)
'''


def test_an_optimizer_is_one_file(one_file):
    from cramming.train.optim import OPTIMIZERS, build_optimizer

    one_file(OPTIMIZER, OPTIMIZERS, "sign-descent")
    config = config_for("train.optim.name=sign-descent", "train.lr=0.5")
    model = model_for(config).train()
    optimizer = build_optimizer(model, config.train, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = ids()
    model(x, labels=x).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(p.detach(), before[name] - 0.5 * grads[name].sign(), rtol=0, atol=1e-6)


OBJECTIVE = '''
    """MLM whose chosen positions never show [MASK]: each gets a random token or keeps its own (BERT's 10/10, with
    no 80)."""
    from dataclasses import dataclass

    from cramming.train.masking import mask_tokens
    from cramming.train.objectives import OBJECTIVES, MaskedLM, documents_of


    @OBJECTIVES.register("mlm-nomask")
    @dataclass
    class NoMaskMLM(MaskedLM):
        def batch(self, ids, generator):
            inputs, labels = mask_tokens(ids, self.mask_prob, self.mask_id, self.vocab_size, self.special, 0.0,
                                         generator, self.masking, self.context)
            return {"input_ids": inputs, "labels": labels, **documents_of(ids, self.document_sep)}
'''


def test_an_objective_is_one_file(one_file):
    from cramming.train.objectives import OBJECTIVES, build_objective

    one_file(OBJECTIVE, OBJECTIVES, "mlm-nomask")
    config = config_for("arch.objective=mlm-nomask", "train.mask_prob=0.5")
    model = model_for(config).train()
    meta = {"special_ids": SPECIAL_IDS, "vocab_size": VOCAB}
    objective = build_objective(config.arch.objective, config.train, meta, torch.device("cpu"))
    batch = objective.batch(ids(), torch.Generator().manual_seed(0))
    assert (batch["labels"] != -100).sum() == 2 * 16 and not (batch["input_ids"] == SPECIAL_IDS["mask"]).any()
    loss = model(**batch).loss
    assert torch.isfinite(loss) and loss.requires_grad
    with torch.no_grad():
        predicted, targets = objective.scored(model.eval()(**batch), batch)  # validation's scoring (heldout.py)
    assert predicted.shape == targets.shape == (2 * 16,)


BENCHMARK = '''
    """A GLUE-style sequence classification task of its own (eval.kind=parity): is the count of the word "odd"
    in the sentence odd? Generated, so it needs no data folder."""
    import random

    from cramming.eval.kinds import BENCHMARKS, Benchmark
    from cramming.eval.tasks import Example, TaskData


    def examples(count, seed):
        rng = random.Random(seed)
        rows = []
        for _ in range(count):
            words = [rng.choice(["odd", "even", "word"]) for _ in range(6)]
            rows.append(Example(" ".join(words), None, words.count("odd") % 2))
        return rows


    def load(name, e):
        return TaskData(name="parity", train=examples(32, 0), dev={"dev": examples(8, 1)}, label_names=["even", "odd"],
                        metric_names=["accuracy"], main_metric="accuracy", source="generated")


    # One task that needs no settings: nothing to check, no average, no published scores.
    BENCHMARKS.register("parity", about="Is the count of the word odd in the sentence odd? Generated.")(
        Benchmark("Parity", "parity", load, trained=lambda e: ["parity"], published=False))
'''


def test_a_glue_style_benchmark_is_one_file(one_file, smoke_checkpoint, tmp_path):
    from cramming.eval.kinds import BENCHMARKS
    from cramming.eval.recipe import evaluate
    from cramming.validation.eval import load_eval_config

    one_file(BENCHMARK, BENCHMARKS, "parity")
    overrides = [f"checkpoint={smoke_checkpoint}", "eval.kind=parity", "impl=cpu", "eval.recipe.epochs=1",
                 "eval.recipe.batch_size=16", "eval.recipe.max_length=16", f"eval.results_table={tmp_path}/r.csv"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = load_eval_config(compose(config_name="eval", overrides=overrides))
    results = json.loads(evaluate(config, tmp_path / "eval").read_text())
    run = results["models"]["pretrained"]["tasks"]["parity"]["runs"][0]
    assert run["curve"][0]["train_examples"] == 32  # its own loader's rows, fine-tuned by eval's recipe
    assert 0 <= run["final"]["dev"]["accuracy"] <= 100  # scored by the task's own metric


ENGINE = '''
    """One process, as impl.distributed=none, that counts the optimizer steps it takes: an engine that does one
    thing of its own."""
    from cramming.engines import ENGINES, Engine


    class Counting(Engine):
        name = "counting"
        steps = 0

        def step(self, model, optimizer, scaler, step_loss, grad_clip):
            type(self).steps += 1
            return super().step(model, optimizer, scaler, step_loss, grad_clip)


    ENGINES["counting"] = Counting
'''


def test_an_engine_is_one_file(one_file, tmp_path):
    from cramming.engines import ENGINES, setup
    from cramming.pretraining import pretrain

    module = one_file(ENGINE, ENGINES, "counting")
    config = config_for("impl.distributed=counting", "train=cpu-smoke", "train.max_steps=3", "train.batch_size=8",
                        "data.max_chars=40000", "train.validation_sequences=8", "data.validation_fraction=0.1")
    counting = sys.modules[module].Counting
    assert isinstance(setup("counting", "cpu"), counting)
    pretrain(config, tmp_path)
    assert counting.steps == 3


def test_a_plugin_that_cannot_be_imported_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(VARIABLE, str(tmp_path / "missing.py"))
    with pytest.raises(UserError, match=r"CRAMMING_PLUGINS='.*missing.py' cannot be imported"):
        config_for()
    monkeypatch.setenv(VARIABLE, "no_such_module_here")
    with pytest.raises(UserError, match="CRAMMING_PLUGINS='no_such_module_here' cannot be imported"):
        config_for()


def test_without_the_plugin_the_name_is_refused(tmp_path):
    """The registrations above come from the file alone: unnamed in $CRAMMING_PLUGINS, the choice is unknown."""
    with pytest.raises(UserError, match="arch.position='half-sinusoid' is not a valid option"):
        config_for("arch.position=half-sinusoid")
