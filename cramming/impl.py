"""Resolve the `impl` settings against the machine: device, precision, compile, and which kernels to use."""

import contextlib
import functools
import os
import time
from dataclasses import dataclass

import torch

from . import kernels  # kernels.HAVE_TRITON says whether Triton is there
from .config import ImplConfig
from .errors import UserError
from .model.attention import ATTENTION_KERNELS, kernel_problem
from .model.losses import LOSSES
from .model.rotary import ROTARY_IMPLS
from .registry import Registry, invalid, listed

kernels.register()  # impl.attention and impl.rotary may name the Triton kernels: this layer chooses them

# Dense 16-bit tensor-core peaks with fp32 accumulation (what autocast runs: bf16 from compute capability 8.0,
# fp16 before it), TFLOP/s, from the vendor datasheets and architecture whitepapers, by a part of
# torch.cuda.get_device_name(); the longest part found wins, since one name holds another ("H200" in "H200 NVL",
# "L4" in "L40S", "V100" in "V100-PCIE"). GeForce cards accumulate in fp32 at half their fp16-accumulate rate.
# impl.peak_tflops overrides the table for any other card.
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200 NVL": 835.0, "H200": 989.4,
               "A100": 312.0, "A6000": 154.8, "RTX A4000": 76.7, "L40S": 362.0, "L40": 181.0, "L4": 121.0,
               "RTX 4090": 165.2, "RTX 3090": 71.0, "RTX 2080 Ti": 53.8,
               "V100": 125.0, "V100-PCIE": 112.0, "V100S": 130.0, "T4": 65.0}
BF16_CAPABILITY = (8, 0)  # Ampere: the first tensor cores with bf16; older GPUs train in fp16 with a grad scaler


@dataclass
class Runtime:
    device: torch.device
    precision: str
    compile: bool
    attention: str = "sdpa"  # a name in ATTENTION_KERNELS
    rotary: str = "torch"  # a name in ROTARY_IMPLS
    loss: str = "plain"  # fused | plain (model/losses.py)
    compile_mode: str = "default"  # a name in COMPILE_MODES: what the engine passes to torch.compile
    peak_tflops: float | None = None  # impl.peak_tflops: the user's figure for MFU instead of the table's
    why: str = ""  # impl.precision=auto: why this precision (the run's first lines say it)

    def autocast(self):
        """A context factory: autocast for bf16/fp16, nothing for fp32; fp8 runs what is not float8 in bf16."""
        if self.precision == "fp32":
            return contextlib.nullcontext
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
        return functools.partial(torch.autocast, self.device.type, dtype=dtype)

    def peak_flops(self) -> float | None:
        """The device's datasheet dense bf16/fp16 tensor-core peak, for MFU; None where unknown (CPUs, fp32).
        impl.peak_tflops, where given, is the peak whatever the device. An fp8 run is measured against the bf16
        peak too (not the float8 one, twice that on Hopper): only some of its matmuls run in float8."""
        if self.peak_tflops is not None:
            return self.peak_tflops * 1e12
        if self.device.type != "cuda" or self.precision == "fp32":
            return None
        name = torch.cuda.get_device_name(self.device)
        found = [key for key in PEAK_TFLOPS if key in name]
        return PEAK_TFLOPS[max(found, key=len)] * 1e12 if found else None

    def grad_scaler(self):
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")


def triton_problem(device: torch.device) -> str | None:
    """Why Triton kernels cannot run here, or None. On CPU they run only under the interpreter (tests)."""
    if not kernels.HAVE_TRITON:
        return "the triton package is not installed (it ships with torch on Linux)"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"Triton kernels need a CUDA GPU (device is {device.type}; TRITON_INTERPRET=1 runs them slowly on CPU)"
    return None


def attention_kernel_problem(name: str, arch, device=None, dtype=None, documents: bool = False) -> str | None:
    """Why attention kernel `name` cannot serve this architecture (on this CUDA device, in this dtype), or None:
    what the kernel computes against what the arch's patterns and positions need, then what its tiles cannot fit."""
    if arch is None:
        return None
    kernel = ATTENTION_KERNELS[name]
    return kernel_problem(kernel, arch, documents) or (kernel.fit_problem(arch, device, dtype) if kernel.fit_problem else None)


def ieee_fp32(device: torch.device, dtype) -> bool:
    """fp32 attention on CUDA without TF32 (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision):
    the Triton kernel's exact IEEE dots spill registers and autotune for minutes, so `auto` takes SDPA there."""
    return device.type == "cuda" and dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"


# impl.attention, impl.rotary and impl.loss name these registries' entries, or auto, which is resolved here
ATTENTION_KERNELS.serves(ImplConfig, "attention")
ROTARY_IMPLS.serves(ImplConfig, "rotary")
LOSSES.serves(ImplConfig, "loss")

# `auto`'s preference, fastest first: Triton where it may run (on CUDA, TF32 allowed), then SDPA, then eager, which
# serves every pattern. The first that can serve the run is taken; a refused choice's message lists the others.
AUTO_ATTENTION = ("triton", "sdpa", "eager")
# bf16 on a CPU: the eager formula with bf16 products first; SDPA's CPU kernel has a slow bf16 backward (the
# benchmark's train section times whole steps with each: docs/benchmarks.md).
CPU_BF16_ATTENTION = ("matmul", "sdpa", "eager")


def resolve_kernels(name: str, rotary: str, arch, device: torch.device, dtype=None,
                    documents: bool = False) -> tuple[str, str]:
    """`auto` picks the Triton kernels on CUDA when they can serve the model (dtype: the attention inputs', i.e.
    the autocast dtype or fp32), else SDPA, else eager. An explicit choice that cannot serve the run is an error,
    never a silent fallback."""
    no_triton = triton_problem(device)

    def problem(kernel: str) -> str | None:
        return ((no_triton if ATTENTION_KERNELS.trait(kernel, "needs_triton") else None)
                or attention_kernel_problem(kernel, arch, device, dtype, documents))

    if name == "auto":
        triton_ok = device.type == "cuda" and no_triton is None and not ieee_fp32(device, dtype)
        order = CPU_BF16_ATTENTION if device.type == "cpu" and dtype == torch.bfloat16 else AUTO_ATTENTION
        name = next(c for c in order
                    if (triton_ok or not ATTENTION_KERNELS.trait(c, "needs_triton")) and problem(c) is None)
    if reason := problem(name):
        ranked = [*AUTO_ATTENTION, *sorted(set(ATTENTION_KERNELS) - set(AUTO_ATTENTION))]
        serving = [c for c in ranked if c != name and c in ATTENTION_KERNELS and problem(c) is None]
        raise UserError(f"impl.attention={name} cannot serve this run: {reason}; or use impl.attention="
                        f"{listed(serving)}")
    if ROTARY_IMPLS.trait(rotary, "needs_triton") and no_triton:
        raise UserError(f"impl.rotary={rotary} cannot serve this run: {no_triton}; or use impl.rotary="
                        f"{ROTARY_IMPLS.choices('needs_triton', has=False)}")
    if rotary == "auto":
        rotary = "triton" if device.type == "cuda" and no_triton is None else "torch"
    return name, rotary


def auto_loss(device: torch.device) -> str:
    """Fused on CPUs: the same step time within the noise there, and a fraction of the working memory (the
    benchmark's train section measures both). On GPUs neither is measured yet (scripts/bench.py --sections gpu
    does), and torch.compile fuses the plain path's elementwise work, so plain until a measurement says otherwise."""
    return "plain" if device.type == "cuda" else "fused"


def resolve(impl, arch=None, documents: bool = False, training: bool = True) -> Runtime:
    """documents: data.document_masking, which the attention kernel must serve. training: pretraining (CPUs may
    choose bf16 under impl.precision=auto), not evaluation (CPU_EVAL_PRECISION)."""
    device_name = impl.device
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name == "cuda" and not torch.cuda.is_available():
        raise UserError("impl.device=cuda but no CUDA device is visible; use impl=cpu or impl=auto")
    device = torch.device(device_name)
    precision, why = impl.precision, ""
    if precision == "auto":
        precision, why = auto_precision_why(device, training)
    if precision == "fp8" and (problem := fp8_device_problem(impl.fp8, device)):
        raise UserError(problem)
    compile_ = impl.compile if impl.compile is not None else device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(precision, torch.float32)
    attention, rotary = resolve_kernels(impl.attention, impl.rotary, arch, device, dtype, documents)
    loss = impl.loss if impl.loss != "auto" else auto_loss(device)
    if problem := compile_mode_problem(impl.compile_mode, compile_, impl.compile, device.type):
        raise UserError(problem)
    return Runtime(device, precision, compile_, attention, rotary, loss, impl.compile_mode, impl.peak_tflops, why)


def fp8_device_problem(fp8, device: torch.device) -> str | None:
    """impl.precision=fp8 against this device: float8 tensor cores from compute capability 8.9 (train/fp8.py)."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return device_problem(fp8, device.type, capability)


FP8_CAPABILITY = (8, 9)  # Ada and Hopper: the first tensor cores with float8


def device_problem(fp8, device_type: str, capability: tuple[int, int] | None) -> str | None:
    """Float8 matmuls need tensor cores of compute capability 8.9 or later; impl.fp8.emulate runs anywhere."""
    if fp8.emulate:
        return None
    need = "impl.precision=fp8 needs a GPU of compute capability 8.9 or later (Ada, Hopper)"
    if device_type != "cuda":
        return f"{need}; this run is on {device_type} (impl.precision=bf16 there, or impl.fp8.emulate=true to test)"
    if tuple(capability) < FP8_CAPABILITY:
        return f"{need}; this one is {capability[0]}.{capability[1]} (use impl.precision=bf16)"
    return None


def auto_precision(device: torch.device, training: bool = True) -> str:
    return auto_precision_why(device, training)[0]


def auto_precision_why(device: torch.device, training: bool = True) -> tuple[str, str]:
    """impl.precision=auto, and why: bf16 autocast on GPUs from compute capability 8.0, fp16 with the grad scaler on
    older ones (V100, T4, RTX 20xx: fp32 there would forgo their tensor cores); on CPUs, cpu_precision's choice for
    pretraining, CPU_EVAL_PRECISION for evaluation."""
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability >= BF16_CAPABILITY:
            return "bf16", f"compute capability {capability[0]}.{capability[1]} has bf16 tensor cores"
        return "fp16", f"compute capability {capability[0]}.{capability[1]} has fp16 tensor cores but no bf16"
    if not training:
        return CPU_EVAL_PRECISION
    return cpu_precision()


# ---------------------------------------------------------------- bf16 on CPUs
# A CPU with AMX or AVX512-BF16 multiplies bf16 matrices natively, several times faster than fp32 (2.6x on an
# AMD EPYC with AVX512-BF16, 6.6x on a Xeon with AMX, docs/benchmarks.md); without them bf16 is emulated and slower.
# impl.precision=auto pretrains in bf16 autocast where torch detects either and a probe measures bf16 products at
# least BF16_MIN_SPEEDUP x fp32's, in fp32 elsewhere.
BF16_MIN_SPEEDUP = 1.5
PROBE_SIZE = 1024  # the probe's square products: a few milliseconds each in fp32
# Fine-tuning and evaluation: fp32 on CPUs under auto (measured on RTE and SST-2, docs/benchmarks.md).
CPU_EVAL_PRECISION = ("fp32", "evaluation on CPUs stays fp32 (docs/benchmarks.md, *bf16 on CPUs*)")


def native_bf16() -> list[str]:
    """The instruction sets this CPU multiplies bf16 matrices with, as torch detects them (none: bf16 is emulated)."""
    found = [("AMX", torch.cpu._is_amx_tile_supported()), ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported())]
    return [name for name, present in found if present]


def bf16_speedup(n: int = PROBE_SIZE, repeats: int = 3) -> float:
    """bf16 over fp32 matrix-product speed at torch's thread count: the best of `repeats` n^3 products each, after
    one warm-up (a few milliseconds in all)."""
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    return best[torch.float32] / best[torch.bfloat16]


@functools.cache
def cpu_precision() -> tuple[str, str]:
    """Pretraining's precision under impl.precision=auto on this CPU, and why (measured once per process)."""
    native = native_bf16()
    if not native:
        return "fp32", "this CPU has no native bf16 matrix products (neither AMX nor AVX512-BF16)"
    speedup = bf16_speedup()
    if speedup < BF16_MIN_SPEEDUP:
        return "fp32", (f"this CPU has {', '.join(native)}, but its bf16 matrix products measured {speedup:.1f}x "
                        f"fp32's speed, under the {BF16_MIN_SPEEDUP}x that pays for autocast's casts")
    return "bf16", (f"this CPU multiplies bf16 matrices natively ({', '.join(native)}), measured {speedup:.1f}x "
                    "fp32's speed")


@dataclass(frozen=True)
class CompileMode:
    """One `impl.compile_mode`: the mode torch.compile gets (None: its default) and whether it records CUDA graphs,
    as torch itself lists the mode's inductor options."""

    name: str

    @property
    def torch_mode(self) -> str | None:
        return None if self.name == "default" else self.name

    @property
    def cuda_graphs(self) -> bool:
        import torch._inductor  # over 1 s to import: only when a compile mode is asked about

        return bool(torch._inductor.list_mode_options(self.torch_mode).get("triton.cudagraphs"))


COMPILE_MODES = Registry("compile mode")
for _name, _about in (
        ("default", "torch.compile's own default: quick to compile, no autotuning, no CUDA graphs."),
        ("max-autotune", "Autotunes matmul and Triton configs and records CUDA graphs: the longest compile."),
        ("max-autotune-no-cudagraphs", "Autotunes like max-autotune, without CUDA graphs (runs off CUDA too)."),
        ("reduce-overhead", "Records CUDA graphs to cut per-kernel launch overhead, without autotuning.")):
    COMPILE_MODES.register(_name, about=_about)(CompileMode(_name))


def compile_mode_problem(name: str, compiled: bool, asked, device_type: str | None) -> str | None:
    """What impl.compile_mode refuses with compile on or off (`asked`: impl.compile as given) on this device type
    (None: not known yet), or None."""
    if name not in COMPILE_MODES:
        return f"impl.compile_mode={name!r} is not a valid option; choose one of: {', '.join(sorted(COMPILE_MODES))}"
    if COMPILE_MODES[name].torch_mode is None:  # torch's default: nothing asked of the compiler
        return None
    if not compiled:
        why = "impl.compile=false" if asked is False else f"impl.compile=null (off on {device_type})"
        return invalid("impl.compile_mode", name, f"{why} compiles nothing; set impl.compile=true or drop the mode")
    if COMPILE_MODES[name].cuda_graphs and device_type not in (None, "cuda"):
        return invalid("impl.compile_mode", name, f"it records CUDA graphs, which need a CUDA device (device is "
                       f"{device_type}); use impl.compile_mode=max-autotune-no-cudagraphs or default")
    return None


def compile_problem(config) -> str | None:
    """impl.compile_mode against the rest of the config, at load time (the device is checked again once known)."""
    i = config.impl
    device = None if i.device == "auto" else i.device
    compiled = i.compile if i.compile is not None else (None if device is None else device == "cuda")
    return compile_mode_problem(i.compile_mode, compiled is not False, i.compile, device)


def compile_note(config) -> str | None:
    """CUDA graphs hold one recording per input shape: a sequence curriculum's stages each record their own (torch
    re-records a graph for every distinct shape). They work, at a memory cost worth a line before the run."""
    mode, stages = COMPILE_MODES[config.impl.compile_mode], config.train.seq_schedule
    if not mode.cuda_graphs or not stages or len({length for _, length in stages}) < 2:
        return None
    return (f"note: impl.compile_mode={mode.name} records one CUDA graph (and its memory pool) per input shape, "
            f"and train.seq_schedule has {len({length for _, length in stages})} lengths")
