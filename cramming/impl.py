"""Resolve the `impl` settings against the machine: device, precision, compile."""

import contextlib
import functools
from dataclasses import dataclass

import torch

from .errors import UserError


@dataclass
class Runtime:
    device: torch.device
    precision: str
    compile: bool

    def autocast(self):
        """A context factory: autocast for bf16/fp16, nothing for fp32."""
        if self.precision == "fp32":
            return contextlib.nullcontext
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return functools.partial(torch.autocast, self.device.type, dtype=dtype)

    def grad_scaler(self):
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")


def resolve(impl) -> Runtime:
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
    return Runtime(device, precision, compile_)
