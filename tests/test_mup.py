"""arch.parametrization=mup (model/mup.py), observed: the coordinate check (how much a few Adam steps
move the logits stays flat with width under muP and grows under the standard parametrization), muP at its base
width being the standard parametrization exactly, the init (arch.init=small composed with it), learning-rate and
weight-decay groups, readout W (h / m) + b and attention scale it sets, each against the `mup` package's rule, and
the refusals."""

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from cramming.config import TrainConfig
from cramming.errors import exit_on_user_error
from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM
from cramming.model.attention import ATTENTION_KERNELS, AttentionSpec
from cramming.model.kv_cache import CACHE_KEY
from cramming.model.losses import LOSSES, head_logits
from cramming.model.parametrization import hidden_weights
from cramming.train.optim import build_optimizer
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
WIDTHS = (32, 64, 128, 256)


def model(width=64, parametrization="mup", base=32, head=CrammedForCausalLM, seed=0, **kwargs):
    """Two heads at every width: muP here scales the head dim (the base model has the same heads)."""
    args = dict(vocab_size=256, hidden_size=width, num_layers=2, num_heads=2, ffn_size=4 * width, ffn="mlp",
                objective="clm" if head is CrammedForCausalLM else "mlm", position="rotary",
                parametrization=parametrization, mup_base_width=base, attention_impl="eager")
    torch.manual_seed(seed)
    return head(CrammedConfig(**{**args, **kwargs}))


def ids(seed=1):
    return torch.randint(5, 256, (8, 16), generator=torch.Generator().manual_seed(seed))


def adam(m, lr=1e-3):
    return build_optimizer(m, TrainConfig(lr=lr, weight_decay=0.0), torch.device("cpu"))


def changes(parametrization: str, width: int, steps: int = 3) -> tuple[float, float]:
    """The std of how much `steps` Adam steps on one fixed batch move the logits and the last block's output (the
    residual stream before the final norm): muP's "maximal update" is Theta(1) in width for both."""
    m, tokens = model(width, parametrization), ids()
    optimizer, seen = adam(m), {}
    m.encoder.layers[-1].register_forward_hook(lambda module, args, out: seen.__setitem__("stream", out))

    def forward():
        with torch.no_grad():
            return m(tokens).logits, seen["stream"]

    logits, stream = forward()
    for _ in range(steps):
        m(tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    new_logits, new_stream = forward()
    return (new_logits - logits).std().item(), (new_stream - stream).std().item()


def test_coordinate_check_flat_under_mup_and_growing_under_standard():
    """Standard: Adam moves every weight by ~lr whatever the width, so the logits move ~width times more (measured:
    x8 from 32 to 256) and the residual stream too (x2.6). muP: the stream stays flat (x0.99); the logits are flat at
    the wide end (x0.94 from 128 to 256; the narrow end still carries the readout's vanishing 1/sqrt(width) term,
    x0.55 overall). The final norm hides the stream's growth from the logits: both are checked."""
    std = [changes("standard", w) for w in WIDTHS]
    mup = [changes("mup", w) for w in WIDTHS]
    (mup_logits, mup_stream), (std_logits, std_stream) = ([b / a for a, b in zip(x[0], x[-1])] for x in (mup, std))
    assert 0.4 < mup_logits < 1.5 and abs(math.log(mup[-1][0] / mup[-2][0])) < math.log(1.25), mup
    assert std_logits > 4 and std_logits > 4 * mup_logits, (std, mup)
    assert all(b[0] > a[0] for a, b in zip(std[1:], std[2:])), std  # it keeps growing
    assert 0.8 < mup_stream < 1.25, mup
    assert std_stream > 2 and std_stream > 2 * mup_stream, (std, mup)


@pytest.mark.parametrize("head", [CrammedForCausalLM, CrammedForMaskedLM])
def test_mup_at_its_base_width_is_standard_exactly(head):
    kwargs = dict(head=head, head_transform=head is CrammedForMaskedLM)
    mup, std = model(64, "mup", base=64, **kwargs), model(64, "standard", **kwargs)
    for (name, a), b in zip(mup.state_dict().items(), std.state_dict().values()):
        assert torch.equal(a, b), name
    opt_mup, opt_std = adam(mup), adam(std)
    assert [(g["base_lr"], len(g["params"])) for g in opt_mup.param_groups] == [
        (g["base_lr"], len(g["params"])) for g in opt_std.param_groups]
    tokens = ids()
    for m, opt in ((mup, opt_mup), (std, opt_std)):
        m(tokens, labels=tokens).loss.backward()
        opt.step()
    mup.eval(), std.eval()
    assert torch.equal(mup(tokens).logits, std(tokens).logits)


def test_hidden_matrices_get_lr_over_m_and_the_rest_keep_lr():
    m = model(128, base=32, head=CrammedForMaskedLM, head_transform=True, bias=True)  # m = 4
    groups = adam(m).param_groups
    hidden = {id(p) for p in hidden_weights(m)}
    # every dense weight in the blocks and the head transform's; never an embedding, norm or bias
    blocks = {id(p) for n, p in m.named_parameters() if ("layers." in n or "transform." in n) and n.endswith(
        "weight") and p.ndim == 2}
    assert hidden == blocks and id(m.encoder.tokens.weight) not in hidden
    for group in groups:
        ids_ = {id(p) for p in group["params"]}
        assert ids_ <= hidden or not ids_ & hidden
        assert group["base_lr"] == pytest.approx(1e-3 / 4 if ids_ <= hidden else 1e-3)
    assert sum(len(g["params"]) for g in groups) == len(list(m.parameters()))


def test_hidden_init_is_scaled_by_one_over_sqrt_m_and_embeddings_are_not():
    m = model(256, base=32)  # m = 8
    for w in hidden_weights(m):
        assert w.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.1)
    assert m.encoder.tokens.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_logits_are_multiplied_by_one_over_m_before_the_softcap():
    m = model(128, base=32, logit_softcap=0.5).eval()  # m = 4
    tokens = ids()
    hidden = m.encoder(tokens).last_hidden_state
    raw = m.decoder(hidden)
    want = 0.5 * torch.tanh(raw / 4 / 0.5)
    with torch.no_grad():
        torch.testing.assert_close(m(tokens).logits, want)
    targets = torch.randint(0, 256, hidden.shape[:2])
    plain, _ = LOSSES["plain"](hidden, m.decoder, targets, True, 0.5, 0.25)
    fused, _ = LOSSES["fused"](hidden, m.decoder, targets, True, 0.5, 0.25)
    torch.testing.assert_close(plain, torch.nn.functional.cross_entropy(want.reshape(-1, 256), targets.reshape(-1)))
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(head_logits(hidden, m.decoder, None, 0.25), raw / 4)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_attention_scores_are_scaled_by_sqrt_d0_over_d(kernel):
    """hidden 128, base 32, two heads: d = 64, d0 = 16, scale sqrt(16) / 64 = 1/16 (standard: 1/8)."""
    attention = model(128, base=32, attention_impl=kernel).encoder.layers[0].attn
    assert attention.spec.scale == 1 / 16
    q, k, v = torch.randn(3, 2, 2, 8, 64).unbind(0)
    want = torch.softmax(q @ k.transpose(-2, -1) / 16, -1) @ v
    torch.testing.assert_close(ATTENTION_KERNELS[kernel](q, k, v, AttentionSpec(scale=attention.spec.scale)), want)
    assert model(32, base=32).encoder.layers[0].attn.spec.scale is None  # m = 1: the kernel's own 1/sqrt(d)


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=["arch=gpt-tiny", *overrides]))


def test_a_bad_value_exits_2_with_one_line(capsys):
    """What the command line's wrapper makes of a refusal (each refusal: the table in tests/test_refusals.py)."""
    with pytest.raises(SystemExit) as stopped:
        exit_on_user_error(config_for)("arch.parametrization=mup", "train.optim.name=sgd")
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: train.optim.name='sgd' is invalid: arch.parametriz") and "\n" not in err, err


def test_mup_with_adamw_and_lion_is_accepted():
    for name in ("adamw", "lion"):
        assert config_for("arch.parametrization=mup", f"train.optim.name={name}").arch.parametrization == "mup"


def test_the_kv_cache_path_uses_the_same_scale():
    """A cached step (attention.attend_at) gives the logits of the full forward under muP's scale (init_std 0.5: at
    0.02 the scores are all about 0 and no scale would show)."""
    m, tokens = model(128, base=32, init_std=0.5).eval(), ids()
    with torch.no_grad():
        full = m(tokens).logits[:, -1]
        prompt = m(tokens[:, :-1], use_cache=True)
        step = m(tokens[:, -1:], attention_mask=torch.ones_like(tokens), use_cache=True,
                 **{CACHE_KEY: getattr(prompt, CACHE_KEY)}).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["adamw", "lion"])
def test_hidden_matrices_decay_by_lr_times_wd_at_every_width(name):
    """The `mup` package's MuAdam (optim.py), for an optimizer whose decay is lr * wd (torch's AdamW and our Lion:
    p <- p (1 - lr wd), its decoupled_wd=False): "group['lr'] /= width_mult; if not decoupled_wd:
    group['weight_decay'] *= width_mult". So lr * wd is train.lr * train.weight_decay at m = 1, 2, 4, and one step
    on a zero gradient (no Adam or Lion update, decay alone) shrinks a hidden matrix by the same factor everywhere."""
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1)
    cfg.optim.name = name
    for width in (32, 64, 128):  # base 32: m = 1, 2, 4
        m = model(width, base=32)
        optimizer = build_optimizer(m, cfg, torch.device("cpu"))
        hidden = {id(p) for p in hidden_weights(m)}
        groups = [g for g in optimizer.param_groups if {id(p) for p in g["params"]} & hidden]
        assert len(groups) == 1 and {id(p) for p in groups[0]["params"]} >= hidden
        assert groups[0]["lr"] * groups[0]["weight_decay"] == pytest.approx(1e-3, rel=1e-12), width
        before = [w.detach().clone() for w in hidden_weights(m)]
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        for weight, old in zip(hidden_weights(m), before):
            torch.testing.assert_close(weight.detach(), old * (1 - 1e-3), rtol=1e-6, atol=0)


def std_of(m):
    """(hidden matrices' std, token embeddings' std) of a fresh model."""
    hidden = torch.cat([w.detach().flatten() for w in hidden_weights(m)])
    return hidden.std().item(), m.encoder.tokens.weight.std().item()


def test_small_init_composes_with_mup():
    """muP's init (the `mup` package's init.py): its initializers "behave exactly the same as the torch versions
    when the model shapes are equal to their base shapes" and "scale with width correctly": hidden (two infinite
    dims) std times width_mult**-0.5, so variance 1 / fan_in, and input weights (embeddings) constant; its normal_
    asks for an std that does not "depend on fan-in, fan-out, or other notions of width". arch.init=small's
    sqrt(2 / (5 width)) is therefore taken at the base width and muP scales it: the hidden std falls as
    1 / sqrt(m) (x1/2 from 64 to 256, not 1/4) and the embeddings keep the base model's std."""
    (h64, e64), (h256, e256) = (std_of(model(w, base=64, init="small", vocab_size=4096)) for w in (64, 256))
    assert h256 / h64 == pytest.approx(0.5, rel=0.05)
    assert h64 == pytest.approx((2 / (5 * 64)) ** 0.5, rel=0.05)
    assert e256 == pytest.approx(e64, rel=0.05) and e64 == pytest.approx((2 / (5 * 64)) ** 0.5, rel=0.05)
    standard = std_of(model(256, "standard", init="small", vocab_size=4096))  # unchanged: all width 256
    assert standard == pytest.approx(((2 / (5 * 256)) ** 0.5,) * 2, rel=0.05)
    assert h256 == pytest.approx(standard[0], rel=0.05)  # the hidden matrices get small's own std at this width


def readout_model(head):
    m = model(128, base=32, head=head, bias=True, logit_softcap=3.0).eval()  # m = 4
    with torch.no_grad():
        m.decoder.bias.normal_(0, 1.0)  # zero at init: a bias scaled or not would look the same
    return m


@pytest.mark.parametrize("head", [CrammedForCausalLM, CrammedForMaskedLM])
def test_readout_scales_its_input_not_its_bias(head):
    """The `mup` package's MuReadout (layer.py): forward returns super().forward(self.output_mult * x /
    self.width_mult()), i.e. W (h / m) + b, the bias unscaled; then arch.logit_softcap. Every head path computes
    that: the model's logits (generation's logits_to_keep too), and the plain and fused losses with their
    gradients; (W h + b) / m, the old rule, differs."""
    m, tokens = readout_model(head), ids()
    with torch.no_grad():
        hidden = m.encoder(tokens).last_hidden_state
        hidden = m.transform(hidden) if head is CrammedForMaskedLM else hidden
        raw = hidden @ m.decoder.weight.t() / 4 + m.decoder.bias
        want = 3.0 * torch.tanh(raw / 3.0)
        old = 3.0 * torch.tanh((hidden @ m.decoder.weight.t() + m.decoder.bias) / 4 / 3.0)
        torch.testing.assert_close(m(tokens).logits, want)
        assert (want - old).abs().max() > 0.1
        if head is CrammedForCausalLM:
            torch.testing.assert_close(m(tokens, logits_to_keep=1).logits, want[:, -1:])
    targets = torch.randint(0, 256, hidden.shape[:2])
    results = {}
    for name in ("plain", "fused"):
        h = hidden.clone().requires_grad_()
        m.decoder.zero_grad()
        loss, _ = LOSSES[name](h, m.decoder, targets, True, 3.0, 0.25)
        loss.backward()
        results[name] = (loss, h.grad, m.decoder.weight.grad.clone(), m.decoder.bias.grad.clone())
    torch.testing.assert_close(results["plain"][0], torch.nn.functional.cross_entropy(
        want.reshape(-1, 256), targets.reshape(-1)))
    for plain, fused in zip(results["plain"], results["fused"]):
        torch.testing.assert_close(fused, plain)
