"""torch.library.opcheck on each custom op: schema, autograd registration, fake impl and AOT dispatch all agree
with the real kernel (run by Triton's interpreter on CPU tensors)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")
if os.environ["TRITON_INTERPRET"] != "1" and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is not 1 and there is no GPU to compile for", allow_module_level=True)
DEVICE = "cpu" if os.environ["TRITON_INTERPRET"] == "1" else "cuda"

from cramming.kernels import attention as attention_module  # registers the ops
from cramming.kernels import rotary as rotary_module
from cramming.model.rotary import rotary_cos_sin


def randn(*shape, grad=False):
    gen = torch.Generator().manual_seed(len(shape) + sum(shape))
    return torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_(grad)


@pytest.mark.parametrize("padded,docs,causal,window,alibi", [(False, False, False, None, False),
                                                            (True, True, True, 5, True)])
def test_attention_ops(padded, docs, causal, window, alibi):
    q, k, v = (randn(2, 2, 19, 16, grad=True) for _ in range(3))
    mask = torch.ones(2, 19, dtype=torch.bool, device=DEVICE)
    mask[1, 11:] = False
    mask = mask if padded else None
    documents = (torch.arange(19, device=DEVICE) // 7).to(torch.int32).expand(2, 19).contiguous() if docs else None
    args = (q, k, v, mask, documents, causal, window, alibi, 0.25)
    torch.library.opcheck(attention_module._attention_op, args)
    out, lse = attention_module._attention_op(*args)
    backward_args = (q.detach(), k.detach(), v.detach(), out.detach(), lse, randn(2, 2, 19, 16), mask, documents,
                     causal, window, alibi, 0.25)
    torch.library.opcheck(attention_module._attention_backward_op, backward_args)


@pytest.mark.parametrize("with_pos,interleaved", [(False, False), (True, True)])
def test_rotary_op(with_pos, interleaved):
    x = randn(2, 3, 11, 16, grad=True)
    cos, sin = rotary_cos_sin(11, 12, 10000.0, DEVICE)
    pos = torch.randint(0, 11, (1, 11), generator=torch.Generator().manual_seed(0)).to(DEVICE) if with_pos else None
    torch.library.opcheck(rotary_module._rotary_op, (x, cos, sin, pos, 12, interleaved, False))
