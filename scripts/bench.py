"""The benchmark suite: one command that measures ours against the usual Hugging Face way, side by side, in one run.

Sections (each module's docstring in scripts/bench_sections/ says how it measures and why it is fair):
  1. train     training tokens/s and MFU: crammed BERT (tiny, mini; crammed-bert on GPU) vs BertForMaskedLM, and
               gpt-tiny (gpt-small on GPU) vs GPT2LMHeadModel, same dimensions, steps interleaved, MFU against an
               fp32 (GPU: bf16) matmul peak measured in the same run
  2. quality   validation MLM loss after the same wall-clock budget: pretrain.py vs BertForMaskedLM trained on the
               same token sequences with the same recipe, evaluated on the same masked validation sequences
  3. data      tokenize-and-pack throughput and peak memory: prepare_data vs datasets.map + group_texts, on the
               shared prose and on a corpus 10x larger, each in a fresh subprocess
  4. finetune  SST-2 fine-tuning examples/s: eval.py vs a plain Trainer, same checkpoint, batch and length
  5. gpu       (CUDA only) scripts/bench_kernels.py and end-to-end crammed-bert bf16 + compile tokens/s and MFU
  6. generate  gpt-tiny greedy generation with the KV cache vs recomputing the prefix (use_cache=False), same tokens
  7. token-dropping  training steps with arch.token_dropping.keep=0.5 vs without, same model and batches, in turn
  8. documents  training steps with data.document_masking=true vs without (crammed-bert-tiny MLM, gpt-tiny CLM),
               same model and packed batches of several documents a row, in turn
Machines are noisy: measurements alternate between the two sides and medians count; every figure is a ratio against
a reference timed in the same run. Every ratio is printed with its target and PASS / FAIL, the results go to
<out>/bench.json and <out>/bench.md, and --write-docs replaces the block between the bench markers in that file.

    python scripts/bench.py --write-docs docs/benchmarks.md    # the full suite: about 11 minutes on 2 CPU cores
    python scripts/bench.py --smoke --out /tmp/bench           # every code path in well under a minute, numbers meaningless
    python scripts/bench.py --sections train,data              # a subset
    python scripts/bench.py --sections generate --out /tmp/g   # the KV cache speed-up alone (3 minutes on 2 cores)
    python scripts/bench.py --sections token-dropping          # token dropping's training speed-up alone
    python scripts/bench.py --sections documents               # what document masking costs in training speed
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SECTIONS = ["train", "quality", "data", "finetune", "gpu", "generate", "token-dropping", "documents"]
TITLES = {"train": "1. Training throughput and MFU", "quality": "2. Quality per budget",
          "data": "3. Data preparation", "finetune": "4. Fine-tuning throughput", "gpu": "5. GPU",
          "generate": "6. Generation with the KV cache", "token-dropping": "7. Token dropping",
          "documents": "8. Document masking"}
NEEDS_SHARED = {"quality", "data", "finetune"}
DEFAULT_SHARED = Path(os.environ.get("CRAMMING_SHARED", REPO.parent / "shared")) / "data"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes and budgets: every code path, numbers meaningless")
    p.add_argument("--out", type=Path, default=REPO / "bench_out", help="bench.json and bench.md go here")
    p.add_argument("--write-docs", type=Path, metavar="PATH", help=f"replace the {BEGIN} ... {END} block in PATH")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ", ".join(SECTIONS))
    p.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help="the shared data folder (default %(default)s)")
    p.add_argument("--train-rounds", type=int, default=5, help="timed training steps per model and pair")
    p.add_argument("--quality-minutes", type=float, default=1.5, help="training budget of each model in section 2")
    p.add_argument("--scale", type=int, default=10, help="the larger corpus of section 3 is this many copies")
    p.add_argument("--finetune-examples", type=int, default=2000, help="SST-2 training examples in section 4")
    p.add_argument("--finetune-rounds", type=int, default=2, help="alternating runs of each loop in section 4")
    p.add_argument("--gpu-batch", type=int, default=256, help="sequences per step of the end-to-end GPU run")
    p.add_argument("--kernel-seconds", type=float, default=240.0, help="bench_kernels.py --max-seconds; 0 skips it")
    p.add_argument("--generate-tokens", type=int, default=32, help="new tokens per generate call in section 6")
    p.add_argument("--generate-rounds", type=int, default=3, help="timed generate calls each way in section 6")
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        p.exit(2, f"error: --sections has {', '.join(unknown)}; choose from {', '.join(SECTIONS)}\n")
    counts = {"--train-rounds": args.train_rounds, "--scale": args.scale, "--finetune-examples": args.finetune_examples,
              "--finetune-rounds": args.finetune_rounds, "--gpu-batch": args.gpu_batch,
              "--generate-tokens": args.generate_tokens, "--generate-rounds": args.generate_rounds}
    if bad := [f"{k}={v}" for k, v in counts.items() if v < 1] + (
            [f"--quality-minutes={args.quality_minutes}"] if args.quality_minutes <= 0 else []):
        p.exit(2, f"error: {', '.join(bad)}: must be positive\n")
    if NEEDS_SHARED & set(args.sections) and not (args.shared / "glue" / "SST-2").is_dir():
        p.exit(2, f"error: shared data not found at {args.shared} (set CRAMMING_SHARED or --shared, or run only "
                  "--sections train,gpu,generate)\n")
    if args.write_docs and BEGIN not in read(args.write_docs):
        p.exit(2, f"error: {args.write_docs} has no {BEGIN} ... {END} block to replace\n")
    args.seq, args.vocab = (32, 1024) if args.smoke else (128, 32768)
    if args.smoke:
        args.quality_minutes, args.scale = 0.05, 2
    return args


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def render(res: dict) -> str:
    from bench_sections import common

    lines = ["**Smoke run (`--smoke`: tiny shapes and budgets): the numbers below are meaningless.**", ""] if res["smoke"] else []
    loads = ", ".join(f"{name} {s['load_average'][0]}-{s['load_average'][1]}" for name, s in res["sections"].items())
    header = (f"Measured with `{res['command']}` in {res['seconds'] / 60:.1f} min on: {common.describe(res['machine'])}. "
              f"The machine is shared: its 1-minute load average, before-after each section, was {loads} "
              f"(on {res['machine']['cpus_usable']} CPUs; other work slows both sides, ratios hold up best).")
    lines += [header, "", "### Targets", "",
              common.table(["section", "figure", "measured", "target", "status"],
                           [[t["section"], t["name"], t["shown"], t["target"], f"**{t['status']}**"]
                            for t in res["targets"]])]
    for name in SECTIONS:
        if name in res["sections"]:
            section = res["sections"][name]
            lines += ["", f"### {TITLES[name]}", "", section.get("markdown") or f"Failed: {section.get('error')}"]
    return "\n".join(lines) + "\n"


def write_docs(path: Path, markdown: str) -> None:
    text = read(path)
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown.strip()}\n{END}{tail}", encoding="utf-8")


def run_section(name: str, args, work: Path, res: dict, device) -> dict:
    from bench_sections import documents, finetune, generate, gpu, prep, quality, token_dropping, train

    if name == "train":
        return train.run(args, device)
    if name == "generate":
        return generate.run(args, device)
    if name == "token-dropping":
        return token_dropping.run(args, device)
    if name == "documents":
        return documents.run(args, device)
    if name == "data":
        return prep.run(args, work)
    if name == "quality":
        data = res["sections"].get("data", {})
        if "corpus" not in data:  # the data section builds the corpus and the cache; run its setup alone
            files = prep.source_files(args.shared)
            corpus = work / "corpus-1x"
            prep.make_corpus(files, corpus, 1, prep.SMOKE_BYTES if args.smoke else None)
            data = {"corpus": str(corpus), "cache": str(work / "cache")}
        return quality.run(args, work, Path(data["corpus"]), Path(data["cache"]))
    if name == "finetune":
        checkpoint = res["sections"].get("quality", {}).get("checkpoint")
        if checkpoint is None:
            return {"status": "skipped", "reason": "needs the quality section's checkpoint", "targets": [],
                    "markdown": "Skipped: it fine-tunes the quality section's checkpoint, which was not run."}
        return finetune.run(args, work, checkpoint)
    return gpu.run(args, args.out)


def main(argv=None) -> int:
    args = parse_args(argv)  # before the heavy imports, so a bad argument fails at once
    import torch
    from bench_sections import common

    started = time.time()
    torch.manual_seed(0)
    torch.set_flush_denormal(True)  # as pretrain.py: AdamW's moments decay into slow x86 denormals otherwise
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"smoke": args.smoke, "command": "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "machine": common.machine(), "sections": {}, "targets": []}
    print(f"bench: {common.describe(res['machine'])}", flush=True)
    order = [s for s in ["train", "data", "quality", "finetune", "gpu", "generate", "token-dropping", "documents"]
             if s in args.sections]
    with tempfile.TemporaryDirectory(prefix="cramming-bench-") as tmp:
        for name in order:
            print(f"\n== {TITLES[name]}", flush=True)
            section_start, load = time.time(), common.load_average()
            try:
                section = run_section(name, args, Path(tmp), res, device)
            except Exception as error:  # noqa: BLE001  (one broken section must not lose the others' results)
                section = {"status": "failed", "error": f"{type(error).__name__}: {error}", "targets": []}
                print(f"  failed: {section['error']}", flush=True)
            section["seconds"] = round(time.time() - section_start, 1)
            section["load_average"] = [load, common.load_average()]  # before and after
            res["sections"][name] = section
            res["targets"] = [t for s in res["sections"].values() for t in s["targets"]]
            res["seconds"] = time.time() - started
            if section.get("markdown"):
                print(section["markdown"], flush=True)
            (args.out / "bench.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    res["seconds"] = time.time() - started
    markdown = render(res)
    (args.out / "bench.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    (args.out / "bench.md").write_text(markdown, encoding="utf-8")
    print("\n## Targets")
    for t in res["targets"]:
        print(f"{t['status']:>12}  {t['name']}: {t['shown']} (target {t['target']})")
    if args.write_docs:
        write_docs(args.write_docs, markdown)
        print(f"wrote the bench block of {args.write_docs}")
    print(f"total {res['seconds'] / 60:.1f} min; wrote {args.out / 'bench.json'} and {args.out / 'bench.md'}")
    return 1 if any(s["status"] == "failed" for s in res["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
