"""Fused GPU kernels (Triton), each beside the eager PyTorch reference it is tested against.

Importing this package never needs Triton: the `*_torch` references work everywhere, and the `*_triton` entry
points raise a clear error when Triton is missing. To run the Triton kernels on CPU tensors (tests), set
TRITON_INTERPRET=1 before this package is first imported: Triton decides interpret-or-compile at decoration time.
"""

import importlib.util

from ..model.rotary import apply_rotary_torch, rotary_cos_sin  # the references, beside the kernels
from .attention import flash_attention
from .rotary import apply_rotary_triton
from .tuning import autotune_seconds

HAVE_TRITON = importlib.util.find_spec("triton") is not None

__all__ = ["HAVE_TRITON", "apply_rotary_torch", "apply_rotary_triton", "autotune_seconds", "flash_attention",
           "rotary_cos_sin"]
