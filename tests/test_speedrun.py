"""The GPT speedrun's blocks, each observed doing what it claims: logit soft-capping (inference, plain and fused
loss), zero-initialised output projections, value embeddings, U-net skips, and the attention-window warm-up
(planned windows, and a stopped run resuming bit for bit); plus the speedrun preset (their refusals: the table in
tests/test_refusals.py)."""

import itertools
import os
import signal
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file
from torch.nn import functional as F

from cramming import pretraining
from cramming import run as run_module
from cramming.errors import exit_on_user_error
from cramming.kernels.fused_loss import linear_cross_entropy
from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM
from cramming.model.losses import LOSSES, soft_cap
from cramming.model.modeling_crammed import SelfAttention
from cramming.train.schedule import window_at
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
HEADS = {"causal": CrammedForCausalLM, "masked": CrammedForMaskedLM}


def tiny(objective="clm", **kwargs) -> CrammedConfig:
    args = dict(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2, ffn_size=64, ffn="mlp",
                objective=objective, position="rotary", hidden_dropout=0.0, attention_dropout=0.0)
    return CrammedConfig(**{**args, **kwargs})


def ids(batch=2, seq=16, seed=0):
    return torch.randint(5, 64, (batch, seq), generator=torch.Generator().manual_seed(seed))


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=list(overrides)))


# ---- logit soft-capping

@pytest.mark.parametrize("head", HEADS)
def test_softcap_bounds_the_logits_by_the_formula(head):
    torch.manual_seed(0)
    plain = HEADS[head](tiny("clm" if head == "causal" else "mlm", init_std=1.0))  # large logits
    capped = HEADS[head](tiny("clm" if head == "causal" else "mlm", init_std=1.0, logit_softcap=2.0))
    capped.load_state_dict(plain.state_dict())
    raw, out = plain(ids()).logits, capped(ids()).logits
    assert raw.abs().max() > 4  # the cap has something to do
    assert out.abs().max() <= 2.0  # tanh reaches 1 in fp32 for large inputs
    torch.testing.assert_close(out, 2.0 * torch.tanh(raw / 2.0))


@pytest.mark.parametrize("loss", ["plain", "fused"])
def test_both_losses_train_on_the_capped_logits(loss):
    """The loss and its gradients are those of cross-entropy on c * tanh(logits / c), in training (where fused
    never builds the logits) as in evaluation."""
    torch.manual_seed(0)
    hidden = torch.randn(40, 16, requires_grad=True)
    decoder = torch.nn.Linear(16, 50)
    decoder.weight.data *= 20  # logits well past the cap
    targets = torch.randint(50, (40,))
    targets[::7] = -100
    got, _ = LOSSES[loss](hidden, decoder, targets, True, 3.0)
    got_grads = torch.autograd.grad(got, (hidden, decoder.weight, decoder.bias))
    want = F.cross_entropy(3.0 * torch.tanh(decoder(hidden) / 3.0), targets, ignore_index=-100)
    want_grads = torch.autograd.grad(want, (hidden, decoder.weight, decoder.bias))
    uncapped = F.cross_entropy(decoder(hidden), targets, ignore_index=-100)
    assert abs(uncapped.item() - want.item()) > 1.0
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w)


def test_fused_softcap_in_chunks(monkeypatch):
    """Several chunks: each chunk's slope buffer is its own."""
    import cramming.kernels.fused_loss as fused

    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", 7 * 50)
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = (torch.randn(50, 16) * 5).requires_grad_()
    targets = torch.randint(50, (40,))
    got = linear_cross_entropy(hidden, weight, None, targets, 3.0)
    got.backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    F.cross_entropy(soft_cap(ref_h @ ref_w.t(), 3.0), targets).backward()
    torch.testing.assert_close(hidden.grad, ref_h.grad)
    torch.testing.assert_close(weight.grad, ref_w.grad)


# ---- zero-initialised output projections

@pytest.mark.parametrize("ffn", ["mlp", "glu"])
def test_zero_init_zeroes_the_output_projections_and_blocks_start_as_the_identity(ffn):
    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(ffn=ffn, zero_init_out=True))
    baseline = CrammedForCausalLM(tiny(ffn=ffn))
    x = torch.randn(2, 16, 32)
    for layer, plain in zip(model.encoder.layers, baseline.encoder.layers):
        assert torch.count_nonzero(layer.attn.out.weight) == 0 and torch.count_nonzero(layer.ffn.down.weight) == 0
        assert torch.count_nonzero(layer.attn.qkv.weight) == layer.attn.qkv.weight.numel()  # only those
        assert torch.count_nonzero(plain.attn.out.weight) > 0
        assert torch.equal(layer(x), x)
        assert not torch.allclose(plain(x), x)


# ---- value embeddings

def layer_io(model, tokens, replace_inputs=None):
    """Each layer's (input, output) in one forward; `replace_inputs[i]` replaces layer i's input."""
    seen, handles = {}, []
    for i, layer in enumerate(model.encoder.layers):
        def pre(module, args, kwargs, i=i):
            if replace_inputs is not None and i in replace_inputs:
                return (replace_inputs[i], *args[1:]), kwargs
            return None

        def post(module, args, kwargs, output, i=i):
            seen[i] = (args[0], output)

        handles += [layer.register_forward_pre_hook(pre, with_kwargs=True),
                    layer.register_forward_hook(post, with_kwargs=True)]
    model(tokens)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("head", HEADS)
def test_value_embeddings_change_only_the_chosen_layers(head):
    """k=1 of 4 layers: table 0 serves layers 0 and 3. Perturbing it, each layer fed its original input gives
    its original output unless it is a chosen layer."""
    torch.manual_seed(0)
    model = HEADS[head](tiny("clm" if head == "causal" else "mlm", value_embeddings=1))
    tokens = ids()
    before = layer_io(model, tokens)
    with torch.no_grad():
        model.encoder.value_embeddings.tables[0].weight.add_(torch.randn_like(model.encoder.value_embeddings.tables[0].weight))
    for i in range(4):
        after = layer_io(model, tokens, replace_inputs={i: before[i][0]})
        changed = not torch.allclose(after[i][1], before[i][1])
        assert changed == (i in (0, 3)), i


def test_the_last_layers_take_the_value_tables_in_the_same_order():
    """modded-nanogpt's layout, ve = [ve0, ve1] + [None] * (L - 4) + [ve0, ve1]: table t serves layer t and layer
    L - k + t, in the same order at both ends (not mirrored). k=2 of 6 layers: table 0 serves 0 and 4, table 1
    serves 1 and 5."""
    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(num_layers=6, value_embeddings=2))
    tokens = ids()
    before = layer_io(model, tokens)
    for table, served in [(0, {0, 4}), (1, {1, 5})]:
        weight = model.encoder.value_embeddings.tables[table].weight
        saved = weight.detach().clone()
        with torch.no_grad():
            weight.add_(torch.randn_like(weight))
        after = layer_io(model, tokens, replace_inputs={i: before[i][0] for i in range(6)})
        with torch.no_grad():
            weight.copy_(saved)
        assert {i for i in range(6) if not torch.allclose(after[i][1], before[i][1])} == served, table


def test_value_embeddings_and_their_mix_get_gradients():
    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(value_embeddings=2))
    model(ids(), labels=ids()).loss.backward()
    for table in model.encoder.value_embeddings.tables:
        assert table.weight.grad.abs().sum() > 0
    mixes = [layer.attn.value_mix for layer in model.encoder.layers]
    assert all(m is not None and m.weights.grad.abs().sum() > 0 for m in mixes)  # 2 tables x 2 ends: every layer


# ---- U-net skips

@pytest.mark.parametrize("layers", [4, 5])
def test_unet_weights_get_gradients_and_zero_weights_are_the_plain_model(layers):
    torch.manual_seed(0)
    unet = CrammedForCausalLM(tiny(num_layers=layers, unet_skips=True))
    plain = CrammedForCausalLM(tiny(num_layers=layers))
    missing = plain.load_state_dict(unet.state_dict(), strict=False)
    assert missing.unexpected_keys == ["encoder.unet.weights"] and not missing.missing_keys
    tokens = ids()
    unet(tokens, labels=tokens).loss.backward()
    assert unet.encoder.unet.weights.shape == (layers // 2,)
    assert (unet.encoder.unet.weights.grad.abs() > 0).all()
    assert not torch.allclose(unet(tokens).logits, plain(tokens).logits)
    with torch.no_grad():
        unet.encoder.unet.weights.zero_()
    torch.testing.assert_close(unet(tokens).logits, plain(tokens).logits, rtol=0, atol=0)


def test_unet_skips_feed_the_mirrored_block():
    """Block i's output enters block num_layers - 1 - i, times its weight: with weights (0, 1) of 4 blocks, block 2
    gets block 1's output alone, block 3 gets block 2's plus block 0's."""
    torch.manual_seed(0)
    unet = CrammedForCausalLM(tiny(num_layers=4, unet_skips=True))
    with torch.no_grad():
        unet.encoder.unet.weights.copy_(torch.tensor([0.0, 1.0]))  # receivers: block 2 (from 1), block 3 (from 0)
        seen = layer_io(unet, ids())
    torch.testing.assert_close(seen[2][0], seen[1][1], rtol=0, atol=0)
    torch.testing.assert_close(seen[3][0], seen[2][1] + seen[0][1])


# ---- the attention-window warm-up

SCHEDULE = [[0.25, 4], [0.25, 8], [0.5, 16]]


def test_window_schedule_gives_the_planned_window():
    assert [window_at(SCHEDULE, f) for f in (0.0, 0.2, 0.25, 0.49, 0.5, 0.99, 1.0)] == [4, 4, 8, 8, 16, 16, 16]


def test_a_compiled_model_follows_a_new_window():
    """torch.compile guards on the window: after set_attention_window the compiled model computes with the new one
    (dynamo's own tracing; the eager backend keeps it cheap)."""
    from cramming.model.modeling_crammed import set_attention_window

    torch.manual_seed(0)
    model = CrammedForCausalLM(tiny(attention_pattern=["local"], attention_window=2)).eval()
    compiled = torch.compile(model, backend="eager")
    tokens = ids()
    narrow = compiled(tokens).logits
    set_attention_window(model, 8)
    wide = compiled(tokens).logits
    assert model.config.attention.window == 8
    assert not torch.allclose(narrow, wide)
    torch.testing.assert_close(wide, model(tokens).logits)
    set_attention_window(model, 2)
    torch.testing.assert_close(compiled(tokens).logits, narrow)


WINDOWED = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "arch.attention.pattern=[local]", "arch.attention.window=32", "impl=cpu", "train=cpu-smoke",
            "train.validation_sequences=16", "data=sanity", "data.vocab_size=256", "data.seq_length=32",
            "data.max_chars=60000", "data.validation_fraction=0.1", "train.schedule=step-triangle",
            "train.max_steps=8", "train.batch_size=8", "impl.microbatch_size=8", "train.checkpoint_every_minutes=null",
            "train.window_schedule=[[0.25,4],[0.25,8],[0.5,16]]"]


@pytest.fixture
def windows_seen(monkeypatch):
    """The window every training forward ran with, and a SIGTERM at the forwards listed in `stop`."""
    seen, stop = [], []
    original = run_module.build_model

    def build(*args, **kwargs):
        model = original(*args, **kwargs)
        forward, count = model.forward, itertools.count(1)

        def recording(*a, **k):
            if model.training:
                seen.append({m.spec.window for m in model.modules() if isinstance(m, SelfAttention)})
                if next(count) in stop:
                    os.kill(os.getpid(), signal.SIGTERM)
            return forward(*a, **k)

        model.forward = recording
        return model

    monkeypatch.setattr(run_module, "build_model", build)
    return seen, stop


def test_a_run_follows_the_window_schedule_and_resumes_it_exactly(windows_seen, tmp_path):
    seen, stop = windows_seen
    whole = pretraining.pretrain(config_for(*WINDOWED), tmp_path / "whole")
    planned = [{window_at(SCHEDULE, step / 8)} for step in range(8)]
    assert seen == planned == [{4}] * 2 + [{8}] * 2 + [{16}] * 4
    assert whole["config"]["arch"]["attention"]["window"] == 32  # the config's window: the schedule overrides it
    assert CrammedConfig.from_pretrained(tmp_path / "whole" / "checkpoint").attention.window == 16  # the last one

    seen.clear()
    stop.append(3)  # inside step 3, at window 8
    with pytest.raises(SystemExit):
        exit_on_user_error(pretraining.pretrain)(config_for(*WINDOWED), tmp_path / "stopped")
    stop.clear()
    seen.clear()
    pretraining.pretrain(config_for(*WINDOWED), tmp_path / "stopped")  # train.resume=auto
    assert seen == planned[3:]
    want, got = load_file(tmp_path / "whole/checkpoint/model.safetensors"), load_file(
        tmp_path / "stopped/checkpoint/model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_nine_windows_are_fine_without_compile():
    config_for(*WINDOWED, "train.window_schedule=[[0.1,1],[0.1,2],[0.1,3],[0.1,4],[0.1,5],[0.1,6],[0.1,7],"
               "[0.1,8],[0.2,9]]")


# ---- the preset

def test_the_speedrun_preset_has_every_block():
    config = config_for("arch=speedrun", "impl=cpu")
    a = config.arch
    assert (a.objective, a.qk_norm, a.activation, a.norm) == ("clm", True, "relu2", "rmsnorm")
    assert a.logit_softcap and a.zero_init_out and a.value_embeddings > 0 and a.unet_skips
    assert "local" in a.attention.pattern


def test_speedrun_smoke_run(tmp_path):
    """The experiment preset's speedrun arm trains at smoke scale: muon, the window warm-up and every block."""
    summary = pretraining.pretrain(config_for("+experiment=speedrun", "experiment/speedrun@_global_=speedrun",
                                              "data=sanity", "data.max_chars=300000", "data.vocab_size=512",
                                              "train.max_steps=3", "train.batch_size=8", "impl.microbatch_size=8",
                                              "train.validation_sequences=8", "train.checkpoint_every_minutes=null"),
                                   tmp_path)
    assert summary["steps"] == 3
    assert summary["val_loss"] < summary["untrained_val_loss"]
    assert summary["config"]["train"]["optim"]["name"] == "muon"
