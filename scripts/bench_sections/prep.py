"""Section 3: data preparation, our tokenize-and-pack against the common Hugging Face `datasets` pipeline.

Ours: cramming.data.prepare.prepare_data with data=local-text (stream paragraphs, batch-encode, append ids to flat
files, count the sentence-length curriculum's periods). Hugging Face, as run_mlm.py does it: load_dataset("text")
(sample_by="paragraph", so both see the same documents), `.map(tokenize, batched=True)` with
return_special_tokens_mask, then `.map(group_texts, batched=True)` into blocks of seq_length. Both use the same
tokenizer (trained once by our full build, which is timed too, for information), so neither times tokenizer
training; ours runs with data.dedup=false, because the larger corpus is copies of the base one (dedup would drop
them) and the HF pipeline does not deduplicate.

Each run is a fresh subprocess (this file's __main__) with its own empty cache folder: it times the pipeline
after its imports and reports its own peak RSS (VmHWM from /proc/self/status; it starts no children) and the peak
after the imports, so the pipeline's own growth shows. The corpora: the shared prose (WikiText-2 raw, the Gutenberg
selections, the presidential speeches, tiny-shakespeare; about 12 MB) and 10 concatenated copies in a temp folder.
"""

import json
import os
import resource
import subprocess
import sys
import time
from itertools import chain
from pathlib import Path

from .common import REPO, compose_config, table, target

SOURCES = [("wikitext-2/raw", "*.raw"), ("gutenberg-nltk", "*.txt"), ("us-presidential-speeches", "*/*.txt"),
           ("tinyshakespeare", "*.txt")]
SMOKE_BYTES = 4000  # of each file, in --smoke runs


def source_files(shared: Path) -> list[Path]:
    return sorted(p for folder, pattern in SOURCES for p in (shared / folder).glob(pattern) if p.is_file())


def make_corpus(files: list[Path], folder: Path, copies: int, max_bytes: int | None = None) -> int:
    """Write `copies` concatenated copies of each file (a blank line between, so no paragraphs merge) into `folder`;
    max_bytes truncates each file (smoke runs). Returns the corpus size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for i, path in enumerate(files):
        text = path.read_bytes()[:max_bytes]
        body = (text.rstrip(b"\n") + b"\n\n") * copies
        (folder / f"{i:03d}-{path.name}.txt").write_bytes(body)
        total += len(body)
    return total


def data_overrides(corpus: Path, cache: Path, extra: list[str] = ()) -> list[str]:
    return ["data=local-text", f"data.path={corpus}", f"data.cache_dir={cache}", *extra]


def rss_mb() -> float:
    """This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: Linux carries that over an exec, so a
    worker started from a big parent would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: the best there is


def worker(kind: str, corpus: Path, cache: Path, tokenizer: str, seq: int, vocab: int) -> dict:
    """One pipeline run in this (fresh) process; the timing starts after the imports."""
    if kind == "ours":
        from cramming.data.prepare import prepare_data

        extra = [f"data.seq_length={seq}", f"data.vocab_size={vocab}", f"data.tokenizer.kind={tokenizer}",
                 "data.dedup=false"]
        cfg = compose_config(data_overrides(corpus, cache, extra)).data
        baseline = rss_mb()
        start = time.perf_counter()
        folder, meta = prepare_data(cfg)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "tokens": meta["train_tokens"] + meta["val_tokens"], "baseline_rss_mb": baseline,
                "peak_rss_mb": rss_mb(), "folder": str(folder)}
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    files = sorted(str(p) for p in corpus.iterdir())
    baseline = rss_mb()
    start = time.perf_counter()
    raw = datasets.load_dataset("text", data_files=files, sample_by="paragraph", split="train",
                                cache_dir=str(cache / "hf"))

    def tokenize(batch):
        return tok(batch["text"], return_special_tokens_mask=True)

    def group_texts(batch):
        joined = {k: list(chain(*batch[k])) for k in batch}
        usable = len(joined["input_ids"]) // seq * seq
        return {k: [v[i:i + seq] for i in range(0, usable, seq)] for k, v in joined.items()}

    tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])
    grouped = tokenized.map(group_texts, batched=True)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": len(grouped) * seq, "baseline_rss_mb": baseline, "peak_rss_mb": rss_mb()}


def start(kind: str, jobs: list[tuple[Path, Path]], tokenizer: str, seq: int, vocab: int) -> subprocess.Popen:
    """Pipeline runs, one per (corpus, cache) job, in a fresh interpreter (this file's __main__). The full run gives
    each job its own process, so each peak RSS is its own; --smoke hands one process both corpora."""
    args = [sys.executable, "-m", "bench_sections.prep", kind, tokenizer, str(seq), str(vocab),
            *(str(p) for job in jobs for p in job)]
    return subprocess.Popen(args, cwd=REPO / "scripts", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # this checkout's cramming, whatever the environment's install points at
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "scripts"), str(REPO)])})


def finish(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"prep worker {proc.args[3]} failed: {err.strip().splitlines()[-1:]}")
    return json.loads(out.strip().splitlines()[-1])


def full_build(corpus: Path, cache: Path, seq: int, vocab: int) -> tuple[Path, float]:
    """Our whole build of the base corpus (tokenizer training included), in this process: the quality section's
    pretrain.py finds this cache, and its tokenizer is the one both pipelines use here."""
    from cramming.data.prepare import prepare_data

    cfg = compose_config(data_overrides(corpus, cache, [f"data.seq_length={seq}", f"data.vocab_size={vocab}"])).data
    start_time = time.perf_counter()
    folder, _ = prepare_data(cfg)
    return folder, time.perf_counter() - start_time


def run(args, work: Path) -> dict:
    """Build the corpora and the tokenizer (our full build, whose cache the quality section reuses), then time each
    pipeline on each corpus, alternating ours and HF."""
    files = source_files(args.shared)
    seq, vocab, scale = args.seq, args.vocab, args.scale
    corpora = {"1x": work / "corpus-1x", f"{scale}x": work / f"corpus-{scale}x"}
    sizes = {name: make_corpus(files, folder, 1 if name == "1x" else scale, SMOKE_BYTES if args.smoke else None)
             for name, folder in corpora.items()}
    print(f"  corpus: {len(files)} files, {sizes['1x'] / 1e6:.1f} MB and {sizes[f'{scale}x'] / 1e6:.1f} MB", flush=True)
    folder, full_seconds = full_build(corpora["1x"], work / "cache", seq, vocab)
    tokenizer = str(folder / "tokenizer")
    print(f"  full build (tokenizer training + packing): {full_seconds:.1f} s", flush=True)
    runs = {}
    if args.smoke:  # numbers meaningless: one process per pipeline, both pipelines at once
        procs = {kind: start(kind, [(c, work / f"cache-{kind}-{n}") for n, c in corpora.items()], tokenizer, seq, vocab)
                 for kind in ("ours", "HF")}
        results = {kind: finish(proc) for kind, proc in procs.items()}
        runs = {f"{kind} {name}": r[i] for kind, r in results.items() for i, name in enumerate(corpora)}
    for name, corpus in corpora.items():
        for kind in ("ours", "HF"):  # alternating, one fresh process each
            key = f"{kind} {name}"
            r = runs.get(key) or finish(start(kind, [(corpus, work / f"cache-{kind}-{name}")], tokenizer, seq, vocab))[0]
            runs[key] = r | {"mb": sizes[name] / 1e6, "mb_per_s": sizes[name] / 1e6 / r["seconds"]}
            print(f"  {key}: {r['seconds']:.1f} s, {runs[key]['mb_per_s']:.2f} MB/s, peak RSS {r['peak_rss_mb']:.0f} MB",
                  flush=True)
    big = f"{scale}x"
    speed = {name: runs[f"HF {name}"]["seconds"] / runs[f"ours {name}"]["seconds"] for name in corpora}
    memory = runs[f"ours {big}"]["peak_rss_mb"] / runs["ours 1x"]["peak_rss_mb"]
    hf_memory = runs[f"HF {big}"]["peak_rss_mb"] / runs["HF 1x"]["peak_rss_mb"]
    targets = [target("data", f"tokenize+pack speed ours/HF, {name} corpus", speed[name], ">= 2.0x", ">=", 2.0)
               for name in corpora]
    targets.append(target("data", f"our peak RSS, {big} / 1x corpus", memory, "< 1.3x", "<", 1.3))
    targets.append(target("data", f"HF peak RSS, {big} / 1x corpus", hf_memory, "report", "report", None))
    rows = [[key, r["mb"], r["seconds"], r["mb_per_s"], r["tokens"], r["peak_rss_mb"],
             r["peak_rss_mb"] - r["baseline_rss_mb"]] for key, r in runs.items()]
    markdown = (f"Corpus: {len(files)} files of the shared prose, {sizes['1x'] / 1e6:.1f} MB, and {scale} concatenated "
                f"copies ({sizes[big] / 1e6:.1f} MB). Our full build of the 1x corpus, tokenizer training included: "
                f"{full_seconds:.1f} s.\n\n"
                + table(["pipeline, corpus", "MB", "seconds", "MB/s", "tokens", "peak RSS (MB)",
                         "RSS growth (MB)"], rows))
    return {"status": "ok", "files": [str(f) for f in files], "corpus_bytes": sizes, "full_build_seconds": full_seconds,
            "runs": runs, "speedup": speed, "memory_growth": memory, "hf_memory_growth": hf_memory,
            "targets": targets, "markdown": markdown, "corpus": str(corpora["1x"]), "cache": str(work / "cache")}


if __name__ == "__main__":
    kind, tok, seq, vocab, *paths = sys.argv[1:]
    print(json.dumps([worker(kind, Path(corpus), Path(cache), tok, int(seq), int(vocab))
                      for corpus, cache in zip(paths[::2], paths[1::2])]))
