"""Kernel micro-benchmarks on one CUDA GPU: our Triton attention and rotary kernels next to PyTorch's.

Attention (bf16, hidden 2048 = heads x head_dim, batch = 16384 // seq, so ~16k tokens a call): forward, backward
and fwd+bwd TFLOP/s of ours (cramming.kernels.attention.flash_attention), PyTorch SDPA held to its flash backend,
and the eager reference (cramming.model.attention.eager_attention, skipped above seq 4096). FLOPs: forward
4*B*H*N^2*D, halved when causal; backward 2.5x, fwd+bwd 3.5x the forward. Each shape is checked once: max |ours -
SDPA| of the output and of dq, dk, dv.

Rotary (bf16, 16 heads, ~16k tokens): fwd+bwd GB/s of cramming.kernels.rotary.apply_rotary_triton next to the eager
cramming.model.rotary.apply_rotary_torch. Bytes = 4 * numel * itemsize (read x, write out, read grad, write grad);
the cos/sin tables are not counted (their share is reported). Set against the card's datasheet peak bandwidth and
a measured plain copy_ (read + write) of a large tensor. Rotary calls are short, so they are timed twice: queued
behind a GPU sleep, which hides the host's Python/autograd/launch overhead (these decide the targets), and as called.

Timing: triton.testing.do_bench (median, L2 flushed before each run). --max-seconds stops new cases from starting;
kernels.json and kernels.md are rewritten in --out after every case, so a cut-short run still leaves its results.

On a GPU, from the repository root (a few minutes, Triton compilation included):
    python scripts/bench_kernels.py --write-docs docs/benchmarks.md
Dry run of every code path on CPU (tiny shapes, fp32, Triton interpreter, perf_counter; numbers meaningless):
    TRITON_INTERPRET=1 python scripts/bench_kernels.py --smoke --out /tmp/bench_kernels
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
from bench_kernels_report import (
    ATT_HEAD,
    BEGIN,
    EAGER_MAX_SEQ,
    ROT_HEAD,
    att_line,
    evaluate_targets,
    fmt,
    render,
    rot_line,
    target_line,
    write_docs,
)

REPO = Path(__file__).resolve().parents[1]
# Datasheet peak memory bandwidth (TB/s); the first pattern found in torch.cuda.get_device_name() wins.
PEAK_TBPS = [(r"H200", 4.8), (r"H100.*PCIe", 2.0), (r"H100.*NVL", None), (r"H100", 3.35),
             (r"A100.*SXM.*80GB", 2.039), (r"A100.*80GB", 1.935), (r"A100", 1.555), (r"A6000", 0.768),
             (r"\bL4\b", 0.3), (r"4090", 1.008)]
# batch / att_heads None: 16384 // seq sequences (~16k tokens a call) and 2048 // head_dim heads (hidden 2048).
# The target shapes run first, so that a run cut short by --max-seconds still has them; the tables are sorted.
FULL = {"att_seqs": [512, 1024, 2048, 4096, 128, 256, 8192], "rot_seqs": [512, 1024, 2048, 4096],
        "head_dims": [64, 128], "batch": None, "att_heads": None, "rot_heads": 16,
        "target_seqs": [512, 1024, 2048, 4096], "target_dim": 64}
SMOKE = {"att_seqs": [16, 32], "rot_seqs": [16, 32], "head_dims": [16], "batch": 1, "att_heads": 2, "rot_heads": 2,
         "target_seqs": [16, 32], "target_dim": 16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes; on CPU under TRITON_INTERPRET=1")
    p.add_argument("--out", type=Path, default=Path("bench_out"), help="kernels.json and kernels.md go here")
    p.add_argument("--write-docs", type=Path, metavar="PATH", help=f"replace the {BEGIN} block in PATH")
    p.add_argument("--max-seconds", type=float, default=300.0, help="start no new case after this long")
    p.add_argument("--warmup-ms", type=int, default=10, help="do_bench warmup (ms)")
    p.add_argument("--rep-ms", type=int, default=40, help="do_bench repetition time (ms)")
    return p.parse_args(argv)


def one_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def try_import(module, name):
    try:
        return getattr(__import__(module, fromlist=[name]), name), None
    except Exception as error:
        return None, one_line(error)


def max_diff(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True))


class Bench:
    def __init__(self, args, cuda, res, save, started):
        self.args, self.cuda, self.res, self.save, self.started = args, cuda, res, save, started
        self.device, self.dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        self.cycles_per_ms = None

    def new(self, *shape, grad=False):
        return torch.randn(shape, device=self.device, dtype=self.dtype, generator=self.generator).requires_grad_(grad)

    def timer(self, fn, grads=(), called_ms=None):
        """Median ms of fn, each gradient in `grads` set to None before every timed call. With called_ms (the
        plain figure), queued: (ms, host_hidden), see queued()."""
        if self.cuda and called_ms is not None:
            return self.queued(fn, grads, called_ms)
        if self.cuda:
            from triton.testing import do_bench
            return do_bench(fn, self.args.warmup_ms, self.args.rep_ms, grad_to_none=list(grads), return_mode="median")
        for t in grads:  # CPU (smoke): do_bench needs a GPU; one run (the interpreter is slow, the number moot)
            t.grad = None
        start = time.perf_counter()
        fn()
        ms = (time.perf_counter() - start) * 1e3
        return ms if called_ms is None else (ms, None)

    def queued(self, fn, grads, called_ms, n=10):
        """n calls queued behind a GPU sleep run back to back on the GPU (L2 flushed before each), so host overhead
        drops out. host_hidden: the host finished queueing before the sleep ended (else some may remain)."""
        from triton.runtime import driver
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        if self.cycles_per_ms is None:  # torch.cuda._sleep counts clock cycles
            torch.cuda.synchronize()
            events[0][0].record()
            torch.cuda._sleep(10**7)
            events[0][1].record()
            torch.cuda.synchronize()
            self.cycles_per_ms = 10**7 / max(events[0][0].elapsed_time(events[0][1]), 1e-3)
        cache, slept = driver.active.get_empty_cache_for_benchmark(), torch.cuda.Event()
        torch.cuda._sleep(int(self.cycles_per_ms * (2 * n * called_ms + 5)))
        slept.record()
        for start, stop in events:
            for t in grads:
                t.grad = None
            driver.active.clear_cache(cache)
            start.record()
            fn()
            stop.record()
        host_hidden = not slept.query()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(stop) for start, stop in events), host_hidden

    def out_of_time(self):
        if time.monotonic() - self.started <= self.args.max_seconds:
            return False
        if not self.res.get("budget_exhausted"):
            self.res["budget_exhausted"] = True
            self.res["notes"].append(f"--max-seconds {self.args.max_seconds:.0f} reached: later cases not run")
            print(f"bench_kernels: --max-seconds {self.args.max_seconds:.0f} reached; no new cases", flush=True)
        return True

    def run(self, result, label, fn, measure, skip=None):
        """Fill `result` with measure()'s fields and status ok, or with why it was not measured."""
        if fn is None or skip or self.out_of_time():
            result["status"] = "n/a (not importable)" if fn is None else skip or "not run (time budget)"
            return
        try:
            result.update(measure(), status="ok")
        except Exception as error:
            result["status"] = f"error: {one_line(error)}"
            print(f"bench_kernels: {label}: {result['status']}", flush=True)
        if self.cuda:
            torch.cuda.empty_cache()

    def attention_impl(self, fn, ctx, q, k, v, g, causal, flops, outs, key):
        q.grad = k.grad = v.grad = None
        with ctx():
            out = fn(q, k, v, causal)  # the correctness check doubles as the warm-up (and autotune)
            grads = torch.autograd.grad(out, (q, k, v), g)
            if key:
                outs[key] = (out.detach(), *grads)
            del out, grads
            ms = {"fwd": self.timer(lambda: fn(q, k, v, causal)),
                  "fwdbwd": self.timer(lambda: fn(q, k, v, causal).backward(g), (q, k, v))}
            try:  # backward alone: one forward, then its graph replayed (kept by retain_graph)
                ms["bwd"] = self.timer(partial(fn(q, k, v, causal).backward, g, retain_graph=True), (q, k, v))
            except Exception as error:
                print(f"bench_kernels: backward alone failed ({one_line(error)})", flush=True)
        return {**{f"{p}_ms": t for p, t in ms.items()},
                **{f"{p}_tflops": factor * flops / ms[p] / 1e9 for p, factor in (("fwd", 1), ("bwd", 2.5),
                                                                                  ("fwdbwd", 3.5)) if p in ms}}

    def attention(self, fns, grid):
        print(f"\n## Attention (TFLOP/s)\n{ATT_HEAD}", flush=True)
        for head_dim in grid["head_dims"]:
            for seq in grid["att_seqs"]:
                for causal in (False, True):
                    batch, heads = grid["batch"] or max(1, 16384 // seq), grid["att_heads"] or 2048 // head_dim
                    flops = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
                    row = {"seq": seq, "head_dim": head_dim, "causal": causal, "batch": batch, "heads": heads,
                           "fwd_flops": flops, "impls": {}}
                    qkvg, outs = [self.new(batch, heads, seq, head_dim, grad=i < 3) for i in range(4)], {}
                    for name in ("sdpa", "ours", "eager"):
                        skip = f"skipped (seq > {EAGER_MAX_SEQ})" if name == "eager" and seq > EAGER_MAX_SEQ else None
                        ctx = fns["sdpa_ctx"] if name == "sdpa" and self.cuda else nullcontext
                        measure = partial(self.attention_impl, fns[name], ctx, *qkvg, causal, flops, outs,
                                          name != "eager" and name)
                        self.run(row["impls"].setdefault(name, {}),
                                 f"attention {name} seq {seq} d {head_dim} causal {causal}", fns[name], measure, skip)
                    if len(outs) == 2:
                        row["max_abs_diff_out"] = max_diff(outs["ours"][:1], outs["sdpa"][:1])
                        row["max_abs_diff_grad"] = max_diff(outs["ours"][1:], outs["sdpa"][1:])
                    ours, sdpa = row["impls"]["ours"], row["impls"]["sdpa"]
                    if ours["status"] == sdpa["status"] == "ok":
                        row["ratio_fwdbwd"] = ours["fwdbwd_tflops"] / sdpa["fwdbwd_tflops"]
                    del qkvg, outs
                    self.res["attention"].append(row)
                    self.res["attention"].sort(key=lambda r: (r["head_dim"], r["seq"], r["causal"]))
                    print(att_line(row), flush=True)
                    self.save()

    def rotary_impl(self, fn, x, g, cos, sin, pct, nbytes, outs, key):
        out = fn(x, cos, sin, None, pct)  # the correctness check doubles as the warm-up
        outs[key] = (out.detach(), *torch.autograd.grad(out, (x,), g))
        del out
        called_ms = self.timer(lambda: fn(x, cos, sin, None, pct).backward(g), (x,))
        ms, hidden = self.timer(lambda: fn(x, cos, sin, None, pct).backward(g), (x,), called_ms)
        return {"fwdbwd_ms": ms, "gbps": nbytes / ms / 1e6, "host_hidden": hidden, "called_fwdbwd_ms": called_ms,
                "called_gbps": nbytes / called_ms / 1e6}

    def rotary(self, fns, grid):
        from cramming.model.rotary import rotary_cos_sin
        print(f"\n## Rotary fwd+bwd\n{ROT_HEAD}", flush=True)
        dev = self.res["device"]
        for head_dim in grid["head_dims"]:
            for pct in (0.25, 1.0):
                for seq in grid["rot_seqs"]:
                    batch, heads = grid["batch"] or max(1, 16384 // seq), grid["rot_heads"]
                    cos, sin = rotary_cos_sin(seq, int(head_dim * pct) // 2 * 2, 10000.0, self.device, torch.float32)
                    x, g = self.new(batch, heads, seq, head_dim, grad=True), self.new(batch, heads, seq, head_dim)
                    nbytes = 4 * x.numel() * x.element_size()
                    row = {"seq": seq, "head_dim": head_dim, "rotary_pct": pct, "batch": batch, "heads": heads,
                           "bytes": nbytes, "table_bytes_fraction": 2 * cos.numel() * cos.element_size() / nbytes,
                           "impls": {}}
                    outs = {}
                    for name in ("ours", "eager"):
                        fn = fns["rot_" + name]
                        self.run(row["impls"].setdefault(name, {}), f"rotary {name} seq {seq} d {head_dim} pct {pct}",
                                 fn, partial(self.rotary_impl, fn, x, g, cos, sin, pct, nbytes, outs, name))
                    ours, eager = row["impls"]["ours"], row["impls"]["eager"]
                    if len(outs) == 2:
                        row["max_abs_diff_out"] = max_diff(outs["ours"][:1], outs["eager"][:1])
                        row["max_abs_diff_grad"] = max_diff(outs["ours"][1:], outs["eager"][1:])
                    if ours["status"] == eager["status"] == "ok":
                        row["speedup"] = ours["gbps"] / eager["gbps"]
                        row["speedup_called"] = ours["called_gbps"] / eager["called_gbps"]
                    if ours["status"] == "ok":
                        row["frac_copy"] = ours["gbps"] / dev["copy_gbps"]
                        if dev["peak_tbps"]:
                            row["frac_peak"] = ours["gbps"] / (1000 * dev["peak_tbps"])
                    self.res["rotary"].append(row)
                    print(rot_line(row), flush=True)
                    self.save()


def new_results(args, argv, cuda: bool, name: str, peak, triton_version: str) -> dict:
    """The results record before any measurement: what ran, where, with which versions and settings."""
    return {"smoke": args.smoke, "date": datetime.date.today().isoformat(), "dtype": "bfloat16" if cuda else "float32",
            "command": " ".join(["python", "scripts/bench_kernels.py", *(sys.argv[1:] if argv is None else argv)]),
            "device": {"name": name, "peak_tbps": peak, "peak_source": "datasheet"},
            "versions": {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
                         "python": platform.python_version(), "triton_interpret": os.environ.get("TRITON_INTERPRET")},
            "settings": {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "max_seconds": args.max_seconds},
            "notes": [], "attention": [], "rotary": [], "targets": []}


def kernel_functions(res: dict) -> dict:
    """The kernels compared: ours (None where it does not import, noted in res), SDPA's flash path, eager."""
    from torch.nn import functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cramming.model.attention import eager_attention
    from cramming.model.attention_masks import AttentionSpec
    from cramming.model.rotary import apply_rotary_torch

    flash, flash_error = try_import("cramming.kernels.attention", "flash_attention")
    rot_triton, rot_error = try_import("cramming.kernels.rotary", "apply_rotary_triton")
    res["import_errors"] = {"flash_attention": flash_error, "apply_rotary_triton": rot_error}
    for what, error in (("flash_attention", flash_error), ("apply_rotary_triton", rot_error)):
        if error:
            res["notes"].append(f"ours ({what}) not importable, its columns show n/a: {error}")
            print(f"bench_kernels: {what} not importable ({error}); benchmarking the rest", flush=True)
    return {"ours": flash and (lambda q, k, v, causal: flash(q, k, v, AttentionSpec(causal=causal))),
            "sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            "sdpa_ctx": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
            "eager": lambda q, k, v, causal: eager_attention(q, k, v, AttentionSpec(causal=causal)),
            "rot_ours": rot_triton, "rot_eager": apply_rotary_torch}


def measure_copy(bench, res: dict, cuda: bool) -> None:
    """copy_'s bandwidth, the rotary target's reference (on a CPU smoke run it also stands in for the peak)."""
    src = bench.new((1 << 28) if cuda else (1 << 16))  # 512 MiB of bf16 on a GPU: far beyond any L2
    res["device"]["copy_gbps"] = 2 * src.numel() * src.element_size() / 1e6 / bench.timer(
        partial(torch.empty_like(src).copy_, src))
    del src
    if not cuda:  # no datasheet for a CPU: in the smoke run the copy stands in, so the peak code path still runs
        res["device"].update(peak_tbps=res["device"]["copy_gbps"] / 1000, peak_source="smoke: the measured copy_")
    print(f"copy_: {fmt(res['device']['copy_gbps'])} GB/s; peak: {res['device']['peak_tbps'] or 'unknown'} TB/s "
          f"({res['device']['peak_source']})", flush=True)


def main(argv=None):
    started, args, cuda = time.monotonic(), parse_args(argv), torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("bench_kernels: needs a CUDA GPU (use --smoke for a CPU dry run)", file=sys.stderr)
        return 2
    # Triton reads TRITON_INTERPRET when cramming's kernels are decorated, so it is settled before any import.
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif os.environ.get("TRITON_INTERPRET", "0") != "0":
        print("bench_kernels: ignoring TRITON_INTERPRET on a GPU (the interpreter is no benchmark)", flush=True)
        os.environ["TRITON_INTERPRET"] = "0"
    sys.path.insert(0, str(REPO))
    import triton

    if args.smoke:
        args.warmup_ms, args.rep_ms = min(args.warmup_ms, 2), min(args.rep_ms, 5)
    grid, name = SMOKE if args.smoke else FULL, torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})"
    peak = next((t for p, t in PEAK_TBPS if re.search(p, name)), None) if cuda else None
    res = new_results(args, argv, cuda, name, peak, triton.__version__)

    def save():
        res["elapsed_s"], res["targets"] = round(time.monotonic() - started, 1), evaluate_targets(res, grid)
        markdown = render(res)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernels.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
        (args.out / "kernels.md").write_text(markdown, encoding="utf-8")
        if args.write_docs:
            write_docs(args.write_docs, markdown)

    fns = kernel_functions(res)

    print(f"bench_kernels: {name}, torch {torch.__version__}, triton {triton.__version__}, {res['dtype']}"
          + (" (smoke: numbers meaningless)" if args.smoke else ""), flush=True)
    bench = Bench(args, cuda, res, save, started)
    measure_copy(bench, res, cuda)
    bench.rotary(fns, grid)
    bench.attention(fns, grid)
    save()
    print("\n## Targets", *map(target_line, res["targets"]), sep="\n")
    print(f"bench_kernels: wrote {args.out / 'kernels.json'} and {args.out / 'kernels.md'}"
          + (f", updated {args.write_docs}" if args.write_docs else "") + f" in {res['elapsed_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
