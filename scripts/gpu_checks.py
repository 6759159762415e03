"""Every check that needs a CUDA GPU in one command, also on a GPU machine that reaches no package registry.

In the order of what each is worth: install the wheels copied along in .whl/, a pre-flight of the imports, then the
product itself as a user types it (PRODUCT: `pretrain.py impl=gpu` with the default crammed BERT at full size on
the embedded corpus for 90 s of training, `eval.py` on RTE from the GLUE folder (.glue/), and the same pretraining
with impl.attention=sdpa beside it), the kernel figures, the benchmark's GPU section (its end-to-end MFU, the
fused / plain loss ratio and the fp8 / bf16 throughput ratio), 1-GPU NCCL smoke runs of FSDP2 and DeepSpeed
(ZeRO-1, ZeRO-2) on a tiny model with compile off, and compiled smoke runs of token dropping under CUDA graphs and
of ELECTRA (FEATURES). Each step has a time limit; the whole run stops in BUDGET_S.

Run through scripts/gpu_checks.sh (docs/benchmarks.md says how, and what to copy to the GPU machine). Only stdlib
here, so it runs on any python3 before the pre-flight has said what is missing. Work folders (logs, runs, the
wheels' --target) lie under /tmp. The results folder (--out; by default outputs/gpu_checks/<date>_<time>/ in the
checkout, git-ignored) gets a few files and no sub-folder, so it is quick to copy back: summary.md (rewritten
after every step, so a run cut short says so), kernels.json and bench.json (the figures), benchmarks.md
(docs/benchmarks.md with the Kernels block rewritten) and logs.tar.gz (every log, the kernel and bench tables,
the smoke runs' metrics and configs).
Rehearsal (--rehearsal or GPU_CHECKS_REHEARSAL=1): the same steps on CPU at tiny sizes (gloo, the Triton
interpreter), so the plumbing is tested where no GPU is.
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 540  # the whole run, pre-flight included: under 10 minutes of GPU time
LIMITS_S = {"product": 330, "product_eval": 90, "product_sdpa": 150, "kernels": 160, "bench_gpu": 240,
            "fsdp2": 60, "deepspeed_zero1": 60, "deepspeed_zero2": 60, "token_dropping_cudagraphs": 90,
            "rtd_compiled": 90}  # the last ones get what the budget leaves
REHEARSAL_SLOWER = 4  # a shared 2-core CPU runs even the tiny sizes slower than the GPU machine the full ones
MAX_FILES, MAX_BYTES = 8, 16 * 2**20  # the results stay few and small: quick to copy back (layout_problems)
DEFAULT_OUT = REPO / "outputs" / "gpu_checks"  # --out's default: a new <date>_<time>/ in it (outputs/ is git-ignored)
# Modules the checks import (pip name where it differs, for the message), then those only some runs need.
NEEDED = {"torch": "torch", "triton": "triton", "transformers": "transformers", "tokenizers": "tokenizers",
          "safetensors": "safetensors", "numpy": "numpy", "scipy": "scipy", "sklearn": "scikit-learn",
          "yaml": "pyyaml", "filelock": "filelock", "tqdm": "tqdm", "omegaconf": "omegaconf", "hydra": "hydra-core",
          "antlr4": "antlr4-python3-runtime", "pydantic": "pydantic", "hjson": "hjson", "deepspeed": "deepspeed"}
OPTIONAL = {"datasets": "hub data and GLUE from the hub", "matplotlib": "report plots",
            "torchao": "the GPU section's fp8 / bf16 measurement (impl.precision=fp8)"}
SMOKE = ["arch=crammed-bert-tiny", "arch.num_heads=2", "data=sanity", "data.vocab_size=512",
         "data.max_chars=100000", "data.validation_fraction=0.1", "train.checkpoint_every_minutes=null",
         "impl.compile=false"]
STEPS = {"gpu": 8, "rehearsal": 4}
SIZES = {"gpu": ["arch.num_layers=2", "arch.hidden_size=128", "arch.ffn_size=256", "data.seq_length=64",
                 "train.batch_size=32", "impl.microbatch_size=16", "train.validation_sequences=32"],
         "rehearsal": ["arch.num_layers=1", "arch.hidden_size=64", "arch.ffn_size=128", "data.seq_length=32",
                       "train.batch_size=8", "impl.microbatch_size=4", "train.validation_sequences=16"]}
# The product as a user runs it (issue 25): the default recipe (crammed BERT, 16 x 768, seq 128) under impl=gpu
# (bf16, compile, impl.attention=auto, impl.microbatch_size=auto) on the embedded corpus; its SDPA twin is shorter.
# A rehearsal runs the same commands on CPU with the tiny model on the sanity corpus.
# Budgets: 90 s and 30 s of training; setup (the corpus, the tokenizer), the microbatch probe, compile and the two
# validations come on top, which the limits allow for (not yet measured on the GPU: summary.md gives each step's time).
PRODUCT = {"product": ["budget=0.025"], "product_sdpa": ["budget=0.008", "impl.attention=sdpa"]}
PRODUCT_REHEARSAL = ["impl=cpu", "train=cpu-smoke", *SMOKE]
REHEARSAL_BUDGET = "budget=0.001"  # 3.6 s: a rehearsal's product runs, whatever PRODUCT's budgets
GLUE_TASK = "RTE"  # the GLUE task eval.py fine-tunes on the product's checkpoint, from --glue
EVAL = {"gpu": ["eval.max_train_examples=2000"],
        "rehearsal": ["impl=cpu", "eval.max_train_examples=64", "eval.recipe.epochs=1", "eval.recipe.batch_size=8"]}
ENGINES = {"fsdp2": ["impl.distributed=fsdp2"], "deepspeed_zero1": ["impl.distributed=deepspeed"],
           "deepspeed_zero2": ["impl.distributed=deepspeed", "impl.deepspeed.zero_stage=2"]}
# Single-process runs of features whose GPU path no CPU test reaches, compiled as a real run is (compile on):
# token dropping's gathers and importance buffer under CUDA graphs, and ELECTRA's two models in one compiled step.
# A rehearsal runs them eagerly on CPU, without impl.compile_mode (CUDA graphs need CUDA).
FEATURES = {"token_dropping_cudagraphs": ["arch.num_layers=3", "arch.token_dropping.keep=0.5",
                                          "impl.compile_mode=reduce-overhead"],
            "rtd_compiled": ["arch.objective=rtd"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rehearsal", action="store_true", default=os.environ.get("GPU_CHECKS_REHEARSAL") == "1",
                   help="the same steps on CPU at tiny sizes (also GPU_CHECKS_REHEARSAL=1)")
    p.add_argument("--out", type=Path, default=None,
                   help="the results folder, empty or new (default: outputs/gpu_checks/<date>_<time>/ in the checkout)")
    p.add_argument("--wheels", type=Path, default=REPO / ".whl",
                   help="the wheels scripts/fetch_wheels.py made (default .whl/)")
    p.add_argument("--glue", type=Path, default=Path(os.environ.get("GLUE_DIR") or REPO / ".glue"),
                   help=f"a glue_data/ folder holding {GLUE_TASK}/ (default $GLUE_DIR, else .glue/)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = DEFAULT_OUT / time.strftime("%Y-%m-%d_%H-%M-%S")
    # relative paths are the caller's: gpu_checks.sh runs this from the checkout's root and passes its caller's folder
    here = Path(os.environ.get("GPU_CHECKS_CALLER_DIR") or os.getcwd())
    args.out, args.wheels, args.glue = (here / path for path in (args.out, args.wheels, args.glue))
    return args


class Run:
    """The run's state: where things go, what each step gave; summary.md is rewritten from it after every step."""

    def __init__(self, args, work: Path):
        self.args, self.work, self.logs = args, work, work / "logs"
        self.logs.mkdir(parents=True)
        self.started, self.steps, self.notes = time.monotonic(), [], []
        self.slower = REHEARSAL_SLOWER if args.rehearsal else 1
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", CRAMMING_CACHE=str(work / "cache"))
        self.env.pop("TRITON_INTERPRET", None)  # bench_kernels and the kernels decide it for themselves

    def left(self) -> float:
        return BUDGET_S * self.slower - (time.monotonic() - self.started)

    def step(self, name: str, command: list[str], limit: float, verify=None) -> int:
        """Run command with its log in logs/NAME.log, cut at limit (or what the budget leaves); record it.
        verify(): what is wrong with what a successful command left, or None."""
        limit = max(1.0, min(limit * self.slower, self.left()))
        start = time.monotonic()
        print(f"== {name} (at most {limit:.0f} s)", flush=True)
        with open(self.logs / f"{name}.log", "w") as log:  # its own session: a timeout ends torchrun's workers too
            child = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            try:
                rc = child.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                end_tree(child)
                rc = 124
        lines = (self.logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if line.startswith("error: ")]  # our one-line errors, under torchrun's
        last = errors[-1] if rc and errors else lines[-1] if lines else ""
        if rc == 124:
            last = f"stopped after {limit:.0f} s; last line: {last}"
        elif rc == 0 and verify and (problem := verify()):
            rc, last = 1, problem
        self.steps.append({"step": name, "rc": rc, "seconds": round(time.monotonic() - start, 1), "last": last})
        print(f"{name} rc={rc} {self.steps[-1]['seconds']} s: {last}", flush=True)
        self.write_summary(done=False)
        return rc

    def write_summary(self, done: bool, figures: list[str] = ()) -> None:
        mode = "rehearsal on CPU (tiny sizes, numbers meaningless)" if self.args.rehearsal else "GPU"
        state = "complete" if done else "INCOMPLETE: still running, or cut short after the last step below"
        rows = [f"| {s['step']} | {'ok' if s['rc'] == 0 else 'FAILED'} | {s['rc']} | {s['seconds']} | "
                f"{s['last'].replace('|', '/')[:200]} |" for s in self.steps]
        head = (f"Mode: {mode}; {time.monotonic() - self.started:.0f} s in all; python {sys.version.split()[0]} at "
                f"{sys.executable}.")
        text = "\n".join([f"# GPU checks: {state}", "", head, "", *[f"- {note}" for note in self.notes], "",
                          "| step | status | rc | seconds | last line |", "|---|---|---|---|---|", *rows, "", *figures])
        (self.args.out / "summary.md").write_text(text.rstrip() + "\n", encoding="utf-8")


def end_tree(child: subprocess.Popen) -> None:
    """Kill child and everything under it: torchrun starts its workers in sessions of their own, out of killpg's
    reach (psutil is on both machines; without it, the child's own group)."""
    try:
        import psutil

        tree = psutil.Process(child.pid).children(recursive=True)
    except ImportError:
        tree = []
    os.killpg(child.pid, signal.SIGKILL)
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):  # it may have exited on its own meanwhile
            process.kill()
    child.wait()


def install_wheels(run: Run) -> str | None:
    """pip install --no-index --no-deps the wheels in --wheels that this python can load into a --target; that
    folder."""
    wheels = sorted(run.args.wheels.glob("*.whl"))
    if not wheels:
        run.notes.append(f"wheels: none in {run.args.wheels}, nothing installed (scripts/fetch_wheels.py makes them)")
        return None
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.tags import sys_tags
        from pip._vendor.packaging.utils import parse_wheel_filename

    here = set(sys_tags())
    fits = [w for w in wheels if parse_wheel_filename(w.name)[3] & here]
    skipped = [w.name for w in wheels if w not in fits]
    site = run.work / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--root-user-action=ignore"]
    rc = run.step("wheels", [*pip, "--no-index", "--no-deps", "--no-compile", "--target", str(site), *map(str, fits)],
                  120)
    run.notes.append(f"wheels: {len(fits)} installed into {site}" + (f"; not for this python, left out: "
                                                                      f"{', '.join(skipped)}" if skipped else ""))
    return str(site) if rc == 0 else None


PREFLIGHT = """
import importlib, json, sys
needed, optional, gpu = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
def why(module):
    try:
        importlib.import_module(module)
    except Exception as error:
        return f"{type(error).__name__}: {error}".splitlines()[0]
missing = {m: why(m) for m in list(needed) + ["cramming.pretraining"]}
missing = {m: e for m, e in missing.items() if e}
absent = {m: why(m) for m in optional}
print(json.dumps({"missing": missing, "optional": {m: e for m, e in absent.items() if e}}))
if not missing:
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    if gpu and not torch.cuda.is_available():
        missing["a CUDA GPU"] = "torch.cuda.is_available() is false"
if missing:
    print("error: missing " + "; ".join(f"{NAMES.get(m, m)} ({e})" for m, e in missing.items())
          + ": copy along the .whl/ that scripts/fetch_wheels.py makes (docs/benchmarks.md)", file=sys.stderr)
    sys.exit(2)
"""


def preflight(run: Run) -> bool:
    """Import everything the checks need in a child (with the wheels on its path); one line names what is not."""
    names = f"NAMES = {NEEDED!r}\n"
    gpu = "0" if run.args.rehearsal else "1"
    rc = run.step("preflight", [sys.executable, "-c", names + PREFLIGHT, json.dumps(NEEDED), json.dumps(OPTIONAL),
                                gpu], 60)
    lines = (run.logs / "preflight.log").read_text().splitlines()
    found = next((json.loads(line) for line in lines if line.startswith("{")), {})
    for module, error in found.get("optional", {}).items():
        run.notes.append(f"optional {module} not importable ({error}): only {OPTIONAL[module]} need it")
    run.notes += [line for line in lines if line.startswith(("torch ", "error: "))]
    if rc:
        print(next((line for line in lines if line.startswith("error: ")), f"error: the pre-flight failed ({rc})"),
              file=sys.stderr)
    return rc == 0


def product(run: Run) -> None:
    """pretrain.py as a user types it, eval.py on its checkpoint, and the SDPA twin: the figures users came for."""
    py, rehearsal = sys.executable, run.args.rehearsal
    for name, options in PRODUCT.items():
        folder = run.work / "runs" / name
        run.step(name, [py, "pretrain.py", *(PRODUCT_REHEARSAL if rehearsal else ["impl=gpu"]), *options,
                        *([REHEARSAL_BUDGET] if rehearsal else []), f"name={name}", f"hydra.run.dir={folder}"],
                 LIMITS_S[name],
                 verify=functools.partial(finished, folder, None, "none"))
        if name != "product":
            continue
        if not (run.args.glue / GLUE_TASK / "train.tsv").is_file():
            run.notes.append(f"product_eval: skipped, no {GLUE_TASK}/train.tsv in --glue {run.args.glue} (copy "
                             f"GLUE's {GLUE_TASK}/ folder into .glue/, or give --glue)")
            continue
        results = run.work / "runs" / "product_eval"
        run.step("product_eval", [py, "eval.py", f"checkpoint={folder / 'checkpoint'}", "eval=glue",
                                  f"eval.tasks=[{GLUE_TASK.lower()}]", f"eval.data_dir={run.args.glue}",
                                  *EVAL["rehearsal" if rehearsal else "gpu"], f"hydra.run.dir={results}"],
                 LIMITS_S["product_eval"], verify=functools.partial(scored, results))


def scored(folder: Path) -> str | None:
    """What is wrong with the product's evaluation: no results.json with a GLUE score."""
    path = folder / "results.json"
    if not path.is_file():
        return f"no results.json in {folder}"
    return None if glue_score(json.loads(path.read_text())) is not None else "results.json holds no GLUE score"


def glue_score(results: dict) -> float | None:
    """The pretrained model's median score on the evaluated task, as eval.py's table shows it."""
    return results.get("models", {}).get("pretrained", {}).get("scores", {}).get(GLUE_TASK.lower())


def checks(run: Run) -> None:
    py, smoke = sys.executable, ["--smoke"] if run.args.rehearsal else []
    docs = run.work / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", docs)
    run.step("kernels", [py, "scripts/bench_kernels.py", *smoke, "--out", str(run.work / "kernels"),
                         "--write-docs", str(docs), "--max-seconds", "110"], LIMITS_S["kernels"])
    # --kernel-seconds 0: the section would run bench_kernels.py again; its figures are the step above
    run.step("bench_gpu", [py, "scripts/bench.py", "--sections", "gpu", *smoke, "--out", str(run.work / "bench"),
                           "--kernel-seconds", "0"], LIMITS_S["bench_gpu"])
    mode = "rehearsal" if run.args.rehearsal else "gpu"
    impl = ["impl=cpu", "train=cpu-smoke"] if run.args.rehearsal else ["impl=gpu"]
    for name, engine in ENGINES.items():
        folder = run.work / "runs" / name
        run.step(name, [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "pretrain.py", *impl,
                        *SMOKE, *SIZES[mode], f"train.max_steps={STEPS[mode]}", *engine, f"hydra.run.dir={folder}"],
                 LIMITS_S[name], verify=functools.partial(finished, folder, STEPS[mode], engine[0].split("=")[1]))
    compiled = [] if run.args.rehearsal else ["impl.compile=true"]
    for name, feature in FEATURES.items():
        folder = run.work / "runs" / name
        feature = [o for o in feature if not (run.args.rehearsal and o.startswith("impl.compile_mode="))]
        run.step(name, [py, "pretrain.py", *impl, *SMOKE, *SIZES[mode], *compiled, *feature,
                        f"train.max_steps={STEPS[mode]}", f"hydra.run.dir={folder}"],
                 LIMITS_S[name], verify=functools.partial(finished, folder, STEPS[mode], "none"))


def finished(folder: Path, steps: int | None, engine: str) -> str | None:
    """What is wrong with a run's train_summary.json: missing, too few steps (None: a budget run, any count),
    another engine, no loss."""
    path = folder / "train_summary.json"
    if not path.is_file():
        return f"no {path.name} in {folder}"
    summary = json.loads(path.read_text())
    got = (summary.get("steps"), summary.get("distributed", {}).get("engine"))
    if steps is None:
        steps = got[0]
    if got != (steps, engine) or not isinstance(summary.get("val_loss"), float):
        return f"{path.name}: steps {got[0]} (of {steps}), engine {got[1]} (not {engine}), val_loss {summary.get('val_loss')}"
    return None


def figures(run: Run) -> list[str]:
    """The lines worth reading first: kernel targets, end-to-end MFU, each smoke run's last logged loss."""
    lines = []
    kernels = run.work / "kernels" / "kernels.json"
    if kernels.is_file():
        lines += ["## Kernel targets", ""] + [f"- {t['status']}: {t['name']} (worst {t['worst']})"
                                              for t in json.loads(kernels.read_text())["targets"]] + [""]
    bench = run.work / "bench" / "bench.json"
    if bench.is_file():
        report = json.loads(bench.read_text())
        lines += ["## Benchmark GPU section", ""] + [f"- {t['status']}: {t['name']}: {t['shown']} (target "
                                                     f"{t['target']})" for t in report["targets"]] + [""]
        lines += profile_lines(report["sections"].get("gpu", {}).get("end_to_end") or {})
    lines += product_figures(run)
    smoke = []
    for path in sorted((run.work / "runs").glob("*/train_summary.json")):
        if path.parent.name in PRODUCT:
            continue
        s = json.loads(path.read_text())
        smoke.append(f"- {path.parent.name}: {s['steps']} steps on {s['device']}, validation loss "
                     f"{s['untrained_val_loss']:.4g} untrained -> {s['val_loss']:.4g}, {s['tokens_per_s']:.0f} tokens/s")
    return lines + (["## Smoke runs", "", *smoke] if smoke else [])


def profile_lines(e2e: dict) -> list[str]:
    """The end-to-end step's top kernels (bench.py's profile of it), the first place to look at a missed MFU."""
    kernels = e2e.get("top_kernels")
    if not kernels:
        return []
    if isinstance(kernels, str):
        return [f"Profile of the end-to-end step: {kernels}", ""]
    return ["## Where the end-to-end step's time goes (torch.profiler; top kernels by their own time)", "",
            *[f"- {k['share']:.1%}, {k['ms_per_step']:.3g} ms per step ({k['calls_per_step']:g} calls): "
              f"{k['name'][:120]}" for k in kernels[:8]], ""]


def product_figures(run: Run) -> list[str]:
    """What the product run measured (train_summary.json), its GLUE score and its speed against the SDPA twin."""
    runs, lines = run.work / "runs", []
    summaries = {name: json.loads((runs / name / "train_summary.json").read_text()) for name in PRODUCT
                 if (runs / name / "train_summary.json").is_file()}
    for name, s in summaries.items():
        wall, mfu = s["wall_seconds"], s.get("mfu")
        lines.append(f"- {name}: {s['tokens_per_s']:,.0f} tokens/s, MFU {f'{mfu:.1%}' if mfu else 'unknown'}, "
                     f"microbatch {s.get('microbatch')}, kernels {s.get('kernels')}, {s['precision']}, compile "
                     f"{wall['compile']:.0f} s (autotune {wall['autotune']:.0f} s), setup {wall['setup']:.0f} s, "
                     f"peak memory {s.get('peak_memory_gib')} GiB, {s['steps']} steps, validation loss "
                     f"{s['untrained_val_loss']:.4g} untrained -> {s['val_loss']:.4g}")
    results = runs / "product_eval" / "results.json"
    if results.is_file():
        lines.append(f"- product_eval: {GLUE_TASK} {glue_score(json.loads(results.read_text()))} (pretrained)")
    if len(summaries) == len(PRODUCT):
        auto, sdpa = (summaries[name]["tokens_per_s"] for name in PRODUCT)
        lines.append(f"- impl.attention=auto / sdpa: {auto / sdpa:.2f}x tokens/s")
    return ["## The product", "", *lines, ""] if lines else []


def collect(run: Run) -> None:
    """Copy the figures to the results folder (--out) and pack the logs, tables and smoke runs' text files into one
    tarball."""
    out = run.args.out
    for source, name in ((run.work / "kernels" / "kernels.json", "kernels.json"),
                         (run.work / "bench" / "bench.json", "bench.json"), (run.work / "benchmarks.md", "benchmarks.md")):
        if source.is_file():
            shutil.copy(source, out / name)
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(run.logs, arcname="logs")
        for table in ("kernels/kernels.md", "bench/bench.md"):
            if (run.work / table).is_file():
                tar.add(run.work / table, arcname=table)
        for path in sorted((run.work / "runs").rglob("*")):  # metrics, configs, summaries; no weights
            if path.is_file() and path.suffix in (".jsonl", ".json", ".yaml", ".txt", ".log", ".md"):
                tar.add(path, arcname=str(path.relative_to(run.work)))


def layout_problems(out: Path) -> list[str]:
    """What breaks the results folder's promise of a few small files (quick to copy back): too many files, one too
    big, or folders too deep."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files (at most {MAX_FILES})"] if len(files) > MAX_FILES else []
    problems += [f"{p.relative_to(out)} is {p.stat().st_size} bytes" for p in files if p.stat().st_size > MAX_BYTES]
    return problems + [f"{p.relative_to(out)} is too deep" for p in files if len(p.relative_to(out).parts) > 3]


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if stale := [p.name for p in args.out.iterdir()]:
        print(f"error: --out {args.out} holds {', '.join(sorted(stale))}; give an empty or new folder", file=sys.stderr)
        return 2
    print(f"gpu_checks: results in {args.out} (summary.md there is rewritten after every step)", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_checks.") as tmp:
        run = Run(args, Path(tmp))
        site, path = install_wheels(run), run.env.get("PYTHONPATH")
        if site:
            run.env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, path]))
        ok = preflight(run)
        if site and args.rehearsal:  # .venv holds the same versions; a second DeepSpeed would rebuild its CPU op
            run.env["PYTHONPATH"] = path or ""
            run.notes.append("rehearsal: the wheels served the pre-flight; the checks use .venv's own copies (the "
                             "same versions), as DeepSpeed compiles its CPU shared-memory op against its own path")
        if ok:
            product(run)
            checks(run)
        collect(run)
        run.write_summary(done=True, figures=figures(run))
    failed = [s["step"] for s in run.steps if s["rc"] != 0]
    problems = layout_problems(args.out)
    for problem in problems:
        print(f"error: results in {args.out}: {problem}", file=sys.stderr)
    print(f"gpu_checks: {len(run.steps)} steps, failed: {', '.join(failed) or 'none'}; results in {args.out}")
    return 2 if not ok else 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
