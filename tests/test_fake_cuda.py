"""The whole model's forward on fake CUDA tensors under CUDA bf16 autocast, without a GPU.

CUDA autocast runs layer/RMS norms in fp32 where CPU autocast keeps bf16, so only a CUDA-autocast forward shows
what dtypes reach the attention kernel (with QK-norm: fp32 q, k beside a bf16 v). The Triton kernels run through
their custom ops' fake impls here. Also: the rotary table cache must never keep a fake tensor.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # no kernel runs here; later test files need the interpreter build

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

from cramming.kernels import HAVE_TRITON
from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.model.rotary import _TABLES, rotary_cos_sin

CUDA = torch.device("cuda", 0)
POSITIONS = ["learned", "sinusoidal", "scaled-sinusoidal", "rotary", "alibi", "rpe", "none"]


class BasicIndexing(TorchFunctionMode):
    """Python indexing (`t[:n]`, `t[:, None]`) opens a CUDA device guard, which a CPU-only build lacks even for fake
    tensors; the same views through aten ops need none. Test plumbing only: slices, None, ints, Ellipsis."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.Tensor.__getitem__:
            return func(*args, **(kwargs or {}))
        x, index = args
        index = index if isinstance(index, tuple) else (index,)
        if Ellipsis in index:
            at = index.index(Ellipsis)
            fill = x.dim() - sum(i is not None for i in index if i is not Ellipsis)
            index = index[:at] + (slice(None),) * fill + index[at + 1:]
        dim = 0
        for i in index:
            if i is None:
                x, dim = torch.ops.aten.unsqueeze.default(x, dim), dim + 1
            elif isinstance(i, slice):
                x = torch.ops.aten.slice.Tensor(x, dim, i.start, i.stop, i.step or 1)
                dim += 1
            elif isinstance(i, int):
                x = torch.ops.aten.select.int(x, dim, i)
            else:
                raise TypeError(f"the fake-CUDA indexing shim handles None, slices, ints and ...; got {i!r}")
        return x


def tiny_model(attention, qk_norm, norm, position):
    rotary = "triton" if attention == "triton" and HAVE_TRITON else "torch"
    config = CrammedConfig(vocab_size=61, hidden_size=64, num_layers=2, num_heads=2, ffn_size=64, max_seq_length=24,
                           hidden_dropout=0.0, attention_dropout=0.0, attention_impl=attention, rotary_impl=rotary,
                           qk_norm=qk_norm, norm=norm, position=position)
    return CrammedForMaskedLM(config)


def record_kernel_dtypes(model):
    """Wrap every attention layer's kernel to record the (q, k, v) dtypes it is called with."""
    seen = []
    for layer in model.modules():
        if hasattr(layer, "kernel") and hasattr(layer, "q_norm"):
            kernel = layer.kernel

            def recording(q, k, v, *args, _kernel=kernel, **kwargs):
                seen.append((q.dtype, k.dtype, v.dtype))
                return _kernel(q, k, v, *args, **kwargs)

            layer.kernel = recording
    return seen


def fake_cuda_forward(model, mode, ids_shape=(2, 16)):
    """model's forward with parameters, buffers and input ids as fake CUDA tensors, under CUDA bf16 autocast."""
    state = {name: FakeTensor(mode, t.detach().to("meta"), CUDA)
             for name, t in [*model.named_parameters(), *model.named_buffers()]}
    ids = FakeTensor(mode, torch.empty(ids_shape, dtype=torch.long, device="meta"), CUDA)
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)  # torch.autocast("cuda") turns itself off on a CPU-only build
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    try:
        with mode, BasicIndexing():
            return torch.func.functional_call(model, state, (ids,)).logits
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", dtype)


CASES = [(attention, qk_norm, norm, position) for attention in ("triton", "sdpa", "eager") for qk_norm in (False, True)
         for norm in ("layernorm", "rmsnorm") for position in POSITIONS
         if not (attention == "triton" and position == "rpe")]  # Triton has no learned bias: routing refuses it


@pytest.mark.parametrize("attention,qk_norm,norm,position", CASES)
def test_forward_on_fake_cuda_gives_every_kernel_one_dtype(attention, qk_norm, norm, position):
    if attention == "triton" and not HAVE_TRITON:
        pytest.skip("triton is not installed")
    model = tiny_model(attention, qk_norm, norm, position)
    seen = record_kernel_dtypes(model)
    logits = fake_cuda_forward(model, FakeTensorMode())
    assert logits.device == CUDA and logits.shape == (2, 16, 61)
    assert seen == [(torch.bfloat16,) * 3] * 2, seen


def test_two_fake_modes_one_after_the_other_share_no_rotary_table():
    """A fake table left in the module-global cache by the first mode would meet the second: 'Mixing fake modes'."""
    model = tiny_model("sdpa", False, "layernorm", "rotary")
    before = dict(_TABLES)
    for _ in range(2):
        logits = fake_cuda_forward(model, FakeTensorMode())
        assert logits.shape == (2, 16, 61)
    assert _TABLES == before and not any(isinstance(t, FakeTensor) for pair in _TABLES.values() for t in pair)


def test_compiling_twice_caches_no_traced_table():
    """torch.compile traces under fake tensors too: two compiles, then the eager cache still holds real tables."""
    model = tiny_model("sdpa", False, "layernorm", "rotary").eval()
    ids = torch.randint(5, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    want = model(ids).logits
    _TABLES.clear()
    for _ in range(2):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="aot_eager")(ids).logits, want)
    assert not _TABLES
    cos, sin = rotary_cos_sin(12, 32, 10000.0, "cpu")
    assert type(cos) is torch.Tensor and type(sin) is torch.Tensor
