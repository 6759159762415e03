"""Resolve the `impl` settings against the machine: device, precision, compile, and which kernels to use."""

import contextlib
import functools
import os
from dataclasses import dataclass

import torch

from .errors import UserError

# Dense bf16 tensor-core peaks (TFLOP/s) from the vendor datasheets, by a part of torch.cuda.get_device_name();
# the longest part found wins, since one name holds another ("H200" in "H200 NVL", "L4" in "L40S").
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200 NVL": 835.0, "H200": 989.4,
               "A100": 312.0, "A6000": 154.8, "L40S": 362.0, "L40": 181.0, "L4": 121.0}


@dataclass
class Runtime:
    device: torch.device
    precision: str
    compile: bool
    attention: str = "sdpa"  # a name in ATTENTION_KERNELS
    rotary: str = "torch"  # a name in ROTARY_IMPLS
    loss: str = "plain"  # fused | plain (model/fused_loss.py)

    def autocast(self):
        """A context factory: autocast for bf16/fp16, nothing for fp32."""
        if self.precision == "fp32":
            return contextlib.nullcontext
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return functools.partial(torch.autocast, self.device.type, dtype=dtype)

    def peak_flops(self) -> float | None:
        """The device's datasheet dense bf16/fp16 tensor-core peak, for MFU; None where unknown (CPUs, fp32)."""
        if self.device.type != "cuda" or self.precision == "fp32":
            return None
        name = torch.cuda.get_device_name(self.device)
        found = [key for key in PEAK_TFLOPS if key in name]
        return PEAK_TFLOPS[max(found, key=len)] * 1e12 if found else None

    def grad_scaler(self):
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")


def triton_unavailable(device: torch.device) -> str | None:
    """Why Triton kernels cannot run here, or None. On CPU they run only under the interpreter (tests)."""
    from .kernels import HAVE_TRITON

    if not HAVE_TRITON:
        return "the triton package is not installed (it ships with torch on Linux)"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"Triton kernels need a CUDA GPU (device is {device.type}; TRITON_INTERPRET=1 runs them slowly on CPU)"
    return None


def attention_unsupported(name: str, arch, device=None, dtype=None) -> str | None:
    """Why attention kernel `name` cannot serve this architecture (on this CUDA device, in this dtype), or None:
    what the kernel computes against what the arch's patterns and positions need, then the kernel's own limits."""
    from . import kernels  # noqa: F401  registers the Triton kernels
    from .model.attention import ATTENTION_KERNELS, kernel_refusal

    if arch is None:
        return None
    kernel = ATTENTION_KERNELS[name]
    return kernel_refusal(kernel, arch) or (kernel.limits(arch, device, dtype) if kernel.limits else None)


def ieee_fp32(device: torch.device, dtype) -> bool:
    """fp32 attention on CUDA without TF32 (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision):
    the Triton kernel's exact IEEE dots spill registers and autotune for minutes, so `auto` takes SDPA there."""
    return device.type == "cuda" and dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"


def resolve_kernels(name: str, rotary: str, arch, device: torch.device, dtype=None) -> tuple[str, str]:
    """`auto` picks the Triton kernels on CUDA when they can serve the model (dtype: the attention inputs', i.e.
    the autocast dtype or fp32), else SDPA, else eager. An explicit choice that cannot serve the run is an error,
    never a silent fallback."""
    no_triton = triton_unavailable(device)
    if name == "auto":
        triton_ok = device.type == "cuda" and no_triton is None and not ieee_fp32(device, dtype)
        candidates = (["triton"] if triton_ok else []) + ["sdpa", "eager"]
        name = next(c for c in candidates if attention_unsupported(c, arch, device, dtype) is None)
    reason = (no_triton if name == "triton" else None) or attention_unsupported(name, arch, device, dtype)
    if reason:
        fallback = "eager" if name == "sdpa" else "sdpa"
        raise UserError(f"impl.attention={name} cannot serve this run: {reason}; or use impl.attention={fallback}")
    if rotary == "triton" and no_triton:
        raise UserError(f"impl.rotary=triton cannot serve this run: {no_triton}; or use impl.rotary=torch")
    if rotary == "auto":
        rotary = "triton" if device.type == "cuda" and no_triton is None else "torch"
    return name, rotary


def auto_loss(device: torch.device) -> str:
    """Fused on CPUs: the same step time within the noise there, and a fraction of the working memory (the
    benchmark's train section measures both). On GPUs neither is measured yet (scripts/bench.py --sections gpu
    does), and torch.compile fuses the plain path's elementwise work, so plain until a measurement says otherwise."""
    return "plain" if device.type == "cuda" else "fused"


def resolve(impl, arch=None) -> Runtime:
    device_name = impl.device
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name == "cuda" and not torch.cuda.is_available():
        raise UserError("impl.device=cuda but no CUDA device is visible; use impl=cpu or impl=auto")
    device = torch.device(device_name)
    precision = impl.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    compile_ = impl.compile if impl.compile is not None else device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    attention, rotary = resolve_kernels(impl.attention, impl.rotary, arch, device, dtype)
    loss = impl.loss if impl.loss != "auto" else auto_loss(device)
    return Runtime(device, precision, compile_, attention, rotary, loss)
