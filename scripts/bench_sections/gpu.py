"""Section 5 (CUDA only): the kernel micro-benchmarks and end-to-end crammed-bert training throughput and MFU.

Kernels: scripts/bench_kernels.py in a subprocess (its own docstring says how it measures); its targets are copied
into this report. End to end: crammed-bert at seq 128, built as pretrain.py builds it with impl=gpu (bf16 autocast,
torch.compile, the Triton kernels; cramming.run.build_run), full training steps (Run.step: mask, forward,
backward, clip, fused AdamW) on random tokens; after warm-up steps (compilation), the median step. MFU = 3 x forward FLOPs/token
(cramming.run.flops_per_token) x tokens/s / bf16 peak, against the datasheet peak (cramming.impl
PEAK_TFLOPS) and, beside it, a bf16 matmul measured here. The same steps again with the other training loss
(impl.loss=fused against the plain one that impl.loss=auto picks on CUDA) give the ratio that decides that
default, and again with impl.precision=fp8 (cramming/train/fp8.py: the blocks' projections in float8) the
fp8 / bf16 throughput ratio, on GPUs of compute capability 8.9 and later (its MFU is against the bf16 peak, as
a run's is). After the timed steps, PROFILE_STEPS more run under torch.profiler: the kernels that took most of a
step's GPU time (on CPU, the ops by their own CPU time), so that a missed MFU target comes with where the time
went, from the same run. Without a GPU the section is skipped; --smoke runs the same end-to-end code on CPU with a
tiny model (fp32, eager; the fp8 run emulated, every projection converted) so the path is exercised.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from .common import REPO, MatmulPeak, compose_config, table, target, timed
from .train import SMOKE_ARCH


def kernels(out: Path, max_seconds: float) -> tuple[list[dict], str]:
    """Run bench_kernels.py; its targets as ours, and the path of its tables."""
    args = [sys.executable, str(REPO / "scripts" / "bench_kernels.py"), "--out", str(out), "--max-seconds",
            str(max_seconds)]
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        return [target("gpu", "kernels: bench_kernels.py", None, f"failed: {tail[0]}", "report", None)], ""
    res = json.loads((out / "kernels.json").read_text())
    rows = [{"section": "gpu", "name": f"kernels: {t['name']}", "value": t["worst"],
             "shown": "-" if t["worst"] is None else f"{t['worst']:.3g} (worst)",
             "target": "report" if t["threshold"] is None else f">= {t['threshold']:g} (worst case)",
             "status": t["status"]} for t in res["targets"]]
    return rows, str(out / "kernels.md")


PROFILE_STEPS = 3  # profiled after the timed steps (not timed themselves: the profiler slows them)
TOP_KERNELS = 12


def top_kernels(events, device_type: str, steps: int, count: int = TOP_KERNELS) -> list[dict]:
    """The `count` kernels (CUDA) or ops (CPU) with the most time of their own in torch.profiler's key_averages()
    over `steps` steps: name, milliseconds and calls per step, share of all such time. On CUDA only the device's
    kernels count (the host ops that launch them overlap with them)."""
    if device_type == "cuda":
        rows = [(e.key, e.self_device_time_total, e.count) for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        rows = [(e.key, e.self_cpu_time_total, e.count) for e in events]
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: r[1], reverse=True)
    total = sum(r[1] for r in rows)
    return [{"name": name, "ms_per_step": us / 1e3 / steps, "calls_per_step": calls / steps, "share": us / total}
            for name, us, calls in rows[:count]]


def profile_steps(step, device) -> list[dict] | str:
    """top_kernels of PROFILE_STEPS steps, or why there are none (a profiler failure must not cost the figures)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    try:
        with profile(activities=activities) as prof:
            for _ in range(PROFILE_STEPS):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
        return top_kernels(prof.key_averages(), device.type, PROFILE_STEPS)
    except Exception as err:  # noqa: BLE001  reported in place of the table
        return f"profile failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


FP8_SMOKE = ["impl.precision=fp8", "impl.fp8.emulate=true", "impl.fp8.min_elements=0"]  # CPU: emulated, all


def end_to_end(device, batch: int, steps: int, warmup: int, smoke: bool, loss: str = "auto", fp8=False,
               profile=False) -> dict:
    from cramming.run import build_run

    seq, vocab = (32, 512) if smoke else (128, 32768)
    overrides = ["arch=crammed-bert", f"data.seq_length={seq}", f"data.vocab_size={vocab}",
                 f"impl={'gpu' if device.type == 'cuda' else 'cpu'}", f"impl.loss={loss}", *(SMOKE_ARCH if smoke else [])]
    overrides += (FP8_SMOKE if smoke else ["impl.precision=fp8"]) if fp8 else []
    config = compose_config(overrides)
    run = build_run(config)  # FLOPs counted on the dense layers, before any float8 swap
    model, runtime, flops, converted = run.model, run.runtime, run.flops, run.fp8_layers
    generator = torch.Generator(device=device).manual_seed(0)

    def step():
        run.step(torch.randint(5, vocab, (batch, seq), generator=generator, device=device), generator)

    model.train()
    for _ in range(warmup):
        timed(step, device)
    times = [timed(step, device) for _ in range(steps)]
    median = statistics.median(times)
    kernels = profile_steps(step, device) if profile else None
    dtype = torch.bfloat16 if runtime.precision in ("bf16", "fp8") else torch.float32
    peak = MatmulPeak(device, dtype, 256 if smoke else 8192)
    peak.sample(5)
    tokens_per_s = batch * seq / median
    datasheet = runtime.peak_flops()
    return {"arch": "crammed-bert" + (" (smoke: tiny, CPU)" if smoke else ""), "batch": batch, "seq": seq,
            "precision": runtime.precision, "compile": runtime.compile, "attention": runtime.attention,
            "loss": runtime.loss, "float8_layers": len(converted),
            "step_s": median, "step_times": times, "tokens_per_s": tokens_per_s, "fwd_flops_per_token": flops,
            "datasheet_peak": datasheet, "measured_peak": peak.flops(),
            "mfu_datasheet": 3 * flops * tokens_per_s / datasheet if datasheet else None,
            "mfu_measured": 3 * flops * tokens_per_s / peak.flops(), "device": device.type, "top_kernels": kernels}


def run(args, out: Path) -> dict:
    has_gpu = torch.cuda.is_available()
    if not has_gpu and not args.smoke:
        return {"status": "skipped", "reason": "no CUDA GPU on this machine", "targets": [],
                "markdown": "Skipped: no CUDA GPU on this machine (`torch.cuda.is_available()` is false)."}
    device = torch.device("cuda" if has_gpu else "cpu")
    run_kernels = has_gpu and args.kernel_seconds > 0  # 0: scripts/gpu_checks.py runs bench_kernels.py itself
    rows, kernels_md = kernels(out / "kernels", args.kernel_seconds) if run_kernels else ([], "")
    e2e = end_to_end(device, 2 if args.smoke else args.gpu_batch, 2 if args.smoke else 20,
                     1 if args.smoke else 5, smoke=args.smoke or not has_gpu, profile=True)
    # impl.loss=auto keeps the plain loss on CUDA: the fused one is measured here against it, to decide that
    other = end_to_end(device, 2 if args.smoke else args.gpu_batch, 2 if args.smoke else 20, 1 if args.smoke else 5,
                       smoke=args.smoke or not has_gpu, loss="fused" if e2e["loss"] == "plain" else "plain")
    fused, plain = (other, e2e) if other["loss"] == "fused" else (e2e, other)
    rows.append(target("gpu", "crammed-bert training tokens/s, impl.loss=fused / plain", fused["tokens_per_s"] /
                       plain["tokens_per_s"], "report (auto picks plain on CUDA)", "report", None))
    fp8, no_fp8 = fp8_run(device, args, has_gpu, e2e)
    rows.append(target("gpu", f"crammed-bert training tokens/s, impl.precision=fp8 / {e2e['precision']}", fp8 and
                       fp8["tokens_per_s"] / e2e["tokens_per_s"], no_fp8 or "report", "report", None))
    mfu = e2e["mfu_datasheet"] if e2e["mfu_datasheet"] is not None else e2e["mfu_measured"]
    which = "datasheet" if e2e["mfu_datasheet"] is not None else "measured matmul"
    rows.append(target("gpu", f"crammed-bert seq {e2e['seq']} {e2e['precision']} compile={e2e['compile']}: MFU of the "
                              f"{which} {e2e['precision']} peak", mfu, ">= 50 %", ">=", 0.50, unit="%"))
    peak_note = f"{e2e['datasheet_peak'] / 1e12:.0f} TFLOP/s datasheet, " if e2e["datasheet_peak"] else ""
    markdown = (f"End to end, batch {e2e['batch']} x {e2e['seq']}: peak {peak_note}{e2e['measured_peak'] / 1e12:.3g} "
                f"TFLOP/s measured ({'bf16' if has_gpu else 'fp32'} matmul).\n\n"
                + table(["model", "precision", "compile", "loss", "step (ms)", "tokens/s", "MFU (datasheet)",
                         "MFU (measured)"],
                        [[r["arch"], r["precision"], str(r["compile"]), r["loss"], r["step_s"] * 1e3, r["tokens_per_s"],
                          "-" if r["mfu_datasheet"] is None else f"{100 * r['mfu_datasheet']:.1f} %",
                          f"{100 * r['mfu_measured']:.1f} %"] for r in (e2e, other, fp8) if r])
                + profile_table(e2e)
                + (f"\n\nKernel tables: `{kernels_md}` (and `python scripts/bench_kernels.py --write-docs "
                   "docs/benchmarks.md` for the Kernels block)." if kernels_md else ""))
    return {"status": "ok" if has_gpu else "smoke-cpu", "end_to_end": e2e, "end_to_end_other_loss": other,
            "end_to_end_fp8": fp8, "targets": rows, "markdown": markdown}


def profile_table(e2e: dict) -> str:
    """Where the first end-to-end run's step time went (profile_steps), as markdown."""
    kernels = e2e["top_kernels"]
    if isinstance(kernels, str):
        return f"\n\nProfile: {kernels}."
    what, unit = ("kernel", "GPU kernels") if e2e["device"] == "cuda" else ("op", "ops (CPU)")
    rows = [[k["name"][:90].replace("|", "/"), k["ms_per_step"], k["calls_per_step"], f"{100 * k['share']:.1f} %"]
            for k in kernels]
    return (f"\n\nWhere a step's time goes ({e2e['precision']}, compile={e2e['compile']}; torch.profiler over "
            f"{PROFILE_STEPS} steps, the top {len(kernels)} {unit} by their own time):\n\n"
            + table([what, "ms per step", "calls per step", "share"], rows))


def fp8_run(device, args, has_gpu: bool, e2e: dict) -> tuple[dict | None, str | None]:
    """The same steps with impl.precision=fp8 (the loss auto picks), or None and why not: a GPU before compute
    capability 8.9 has no float8 tensor cores; torchao missing (the fp8 extra)."""
    from cramming.config import Fp8Config
    from cramming.impl import fp8_device_problem
    from cramming.train.fp8 import torchao_problem

    smoke = args.smoke or not has_gpu
    if why := torchao_problem() or (None if smoke else fp8_device_problem(Fp8Config(), device)):
        return None, f"not measured: {why}"
    return end_to_end(device, 2 if args.smoke else args.gpu_batch, 2 if args.smoke else 20, 1 if args.smoke else 5,
                      smoke=smoke, fp8=True), None
