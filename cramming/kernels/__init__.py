"""Fused GPU kernels (Triton), each beside the eager PyTorch reference it is tested against, and the fused chunked
loss (fused_loss.py, plain PyTorch: training only).

Importing this package never needs Triton: the `*_torch` references work everywhere, and the `*_triton` entry
points raise a clear error when Triton is missing. To run the Triton kernels on CPU tensors (tests), set
TRITON_INTERPRET=1 before this package is first imported: Triton decides interpret-or-compile at decoration time.
Importing a kernel changes no registry: `register()` names them where the model's kernels are chosen (impl.py).
"""

import importlib.util

from ..model.attention import ATTENTION_KERNELS, attention_kernel
from ..model.rotary import ROTARY_IMPLS, apply_rotary_torch, rotary_cos_sin  # the references, beside the kernels
from . import fused_loss
from .attention import SERVES, flash_attention, triton_fit_problem
from .rotary import apply_rotary_triton
from .tuning import autotune_seconds

HAVE_TRITON = importlib.util.find_spec("triton") is not None


def register() -> None:
    """The Triton kernels join the model's registries as impl.attention=triton and impl.rotary=triton, the fused
    loss as impl.loss=fused (once)."""
    if "triton" not in ATTENTION_KERNELS:
        attention_kernel("triton", serves=SERVES, fit_problem=triton_fit_problem, needs_triton=True)(flash_attention)
    if "triton" not in ROTARY_IMPLS:
        ROTARY_IMPLS.register("triton", needs_triton=True)(apply_rotary_triton)
    fused_loss.register()


__all__ = ["HAVE_TRITON", "apply_rotary_torch", "apply_rotary_triton", "autotune_seconds", "flash_attention",
           "register", "rotary_cos_sin"]
