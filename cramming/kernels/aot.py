"""Compile the Triton kernels ahead of time for GPU targets on a CPU-only machine, and check they can launch.

    python -m cramming.kernels.aot --arch 80,90 [--dtypes bf16,fp16,fp32] [--head-dims 32,64,128,256] [--all]

For every (arch, dtype, head dim) the attention kernels either have a config whose shared memory fits a block of
that arch, or the router refuses Triton there (impl.attention=auto then picks SDPA). Per kernel it compiles the
fitting config with the largest estimate (the tightest fit; --all: every fitting config) and checks the compiler's
shared memory (metadata.shared) against the limit and against the estimate the autotuner prunes by
(cramming.kernels.tuning.shared_bytes: it must not be lower). It reports each config's shared memory, registers
and local memory per thread (register spills, from the wheel's cuobjdump), then a one-line summary. Compiles run
with Triton's usual specialisation (pointers and 16-divisible ints aligned) for a padded bidirectional key, the
common pretraining case, and the tightest config once more for causal rows of packed documents
(data.document_masking); results land in Triton's cache, so a second run takes seconds.
"""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import flash_kernels, rotary
from .tuning import CONFIGS, SHARED_PER_BLOCK, block_d_of, fitting, shared_bytes, shared_memory_problem

DTYPES = {"bf16": ("bf16", 2), "fp16": ("fp16", 2), "fp32": ("fp32", 4)}
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
POINTERS = {"Q", "K", "V", "Out", "DO", "DK", "DV", "DQ", "x_ptr", "out_ptr"}
FP32_POINTERS = {"Lse", "Delta", "cos_ptr", "sin_ptr"}
UNALIGNED = {"smb", "smn", "sxb", "sxn", "window", "sm_scale", "H", "N", "D", "N_BUCKET", "S", "sxd", "spb", "sps"}
FLAGS = {"CAUSAL": False, "HAS_WINDOW": False, "HAS_PAD": True, "ALIBI": False, "HAS_DOCS": False}
DOCUMENT_FLAGS = {**FLAGS, "CAUSAL": True, "HAS_DOCS": True}  # data.document_masking: packed causal rows


def _signature(fn, dtype, constexprs):
    """Triton's signature and alignment attributes for `fn`, the way the JIT specialises real arguments."""
    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS or name in FP32_POINTERS or name in ("Kpm", "Docs", "pos_ptr"):
            signature[name] = "*" + (dtype if name in POINTERS else "fp32" if name in FP32_POINTERS else
                                     "u8" if name == "Kpm" else "i32" if name == "Docs" else "i64")
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name == "sm_scale" else "i32"
            if name not in UNALIGNED:  # batch/head/row strides of (batch, seq, heads, head_dim) tensors
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, attrs


def _resources(cubin: bytes) -> dict:
    """Registers and local memory (spills) per thread, from cuobjdump --dump-resource-usage."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([tool, "--dump-resource-usage", file.name], capture_output=True, text=True,
                              check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    return {"regs": int(found[1]), "spill_bytes": max(int(found[2]), int(found[3]))}


def compile_job(job: dict) -> dict:
    """Compile one (kernel, config) for one target; returns the job with shared, regs, spill_bytes, seconds."""
    fn = {"fwd": flash_kernels._attn_fwd, "dkdv": flash_kernels._attn_bwd_dkdv, "dq": flash_kernels._attn_bwd_dq,
          "delta": flash_kernels._attn_bwd_delta, "rotary": rotary._rotary_kernel}[job["kernel"]]
    signature, attrs = _signature(fn, DTYPES[job["dtype"]][0], job["constexprs"])
    started = time.perf_counter()
    try:
        kernel = triton.compile(ASTSource(fn, signature, job["constexprs"], attrs),
                                target=GPUTarget("cuda", job["arch"], 32),
                                options={"num_warps": job["warps"], "num_stages": job["stages"]})
    except Exception as error:  # noqa: BLE001  a config the compiler rejects is a finding, reported with the others
        return {**job, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return {**job, "shared": kernel.metadata.shared, **_resources(kernel.asm["cubin"]),
            "seconds": round(time.perf_counter() - started, 1)}


def attention_jobs(arch, dtype, head_dim, every):
    """The configs to compile for one (arch, dtype, head dim), or the router's refusal."""
    limit, elt, block_d = SHARED_PER_BLOCK[arch], DTYPES[dtype][1], block_d_of(head_dim)
    problem = shared_memory_problem(head_dim, getattr(torch, TORCH_DTYPE[dtype]), limit)
    jobs = []
    for kernel in CONFIGS:
        configs = sorted(fitting(kernel, head_dim, elt, limit), key=lambda c: shared_bytes(kernel, c[0], c[1], c[3],
                                                                                             block_d, elt))
        chosen = [(c, FLAGS) for c in (configs if every else configs[-1:])]
        chosen += [(c, DOCUMENT_FLAGS) for c in configs[-1:]]  # the tightest fit, with document masking too
        for (m, n, warps, stages), flags in chosen:
            constexprs = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_D": block_d, **flags, "EVEN_D": block_d == head_dim,
                          "DOT_PREC": "tf32" if dtype == "fp32" else "ieee"}
            label = (m, n) if flags is FLAGS else (m, n, "documents")
            jobs.append({"kernel": kernel, "arch": arch, "dtype": dtype, "head_dim": head_dim, "config": label,
                         "warps": warps, "stages": stages, "constexprs": constexprs, "limit": limit,
                         "estimate": shared_bytes(kernel, m, n, stages, block_d, elt)})
    return problem, jobs


def side_jobs(arch, dtypes):
    """The backward's row-sum kernel and the rotary kernel (forward and backward) at the largest head dim."""
    jobs = []
    for dtype in dtypes:
        common = {"arch": arch, "dtype": dtype, "head_dim": 256, "warps": 4, "stages": 3, "limit": 0, "estimate": None}
        jobs.append({**common, "kernel": "delta", "config": (64,), "constexprs": {"BLOCK_M": 64, "BLOCK_D": 256}})
        for backward in (False, True):
            jobs.append({**common, "kernel": "rotary", "config": ("bwd" if backward else "fwd",), "constexprs": {
                "HALF": 128, "PASS": 0, "BLOCK_S": 16, "BLOCK_HALF": 128, "BLOCK_PASS": 1, "INTERLEAVED": False,
                "HAS_POS": False, "BACKWARD": backward}})
    return jobs


def check(result) -> str | None:
    """What is wrong with one compiled config, or None."""
    if "error" in result:
        return result["error"]
    if result["limit"] and result["shared"] > result["limit"]:
        return f"shared {result['shared']:,} B exceeds the {result['limit']:,} B of sm_{result['arch']}"
    if result["estimate"] is not None and result["estimate"] < result["shared"]:
        return f"estimate {result['estimate']:,} B is below the compiled {result['shared']:,} B"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cramming.kernels.aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="80,90", help="compute capabilities, e.g. 80,90")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--head-dims", default="32,64,128,256")
    parser.add_argument("--all", action="store_true", help="compile every fitting config, not only the tightest")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: TRITON_INTERPRET=1 is set, so the kernels are built for the interpreter; unset it",
              file=sys.stderr)
        return 2
    archs, dtypes, head_dims = args.arch.split(","), args.dtypes.split(","), args.head_dims.split(",")
    bad = ([f"--arch {a}" for a in archs if a not in map(str, SHARED_PER_BLOCK)]
           + [f"--dtypes {d}" for d in dtypes if d not in DTYPES]
           + [f"--head-dims {d}" for d in head_dims if not d.isdigit() or not 0 < int(d) <= 256])
    if bad:
        print(f"error: unknown {bad[0]}; known: --arch {','.join(map(str, SHARED_PER_BLOCK))}, --dtypes "
              f"{','.join(DTYPES)}, --head-dims 1 to 256", file=sys.stderr)
        return 2
    archs, head_dims = [int(a) for a in archs], [int(d) for d in head_dims]
    started, jobs, refused = time.perf_counter(), [], []
    for arch in archs:
        for dtype in dtypes:
            for head_dim in head_dims:
                refusal, more = attention_jobs(arch, dtype, head_dim, args.all)
                jobs += more
                if refusal:
                    refused.append(f"sm_{arch} {dtype} d{head_dim}: router refuses triton ({refusal})")
        jobs += side_jobs(arch, dtypes)
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(compile_job, jobs))
    problems = []
    for result in results:
        problem = check(result)
        where = (f"sm_{result['arch']} {result['dtype']} d{result['head_dim']} {result['kernel']} "
                 f"{result['config']} w{result['warps']} s{result['stages']}")
        if problem:
            problems.append(f"{where}: {problem}")
        print(f"{where}: " + (problem or f"shared {result['shared']:,} B (estimate {result['estimate'] or '-'}), "
                                         f"{result['regs']} regs, {result['spill_bytes']} B spill/thread"))
    print("\n".join(refused) or "router refuses triton nowhere")
    spilling = sum(1 for r in results if r.get("spill_bytes"))
    print(f"aot: {'FAIL' if problems else 'OK'} sm_{'/'.join(map(str, archs))}: {len(results)} configs compiled, "
          f"{len(problems)} problems, {spilling} spilling, {len(refused)} refused shapes, "
          f"{time.perf_counter() - started:.0f}s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
