"""The record run's report: one GLUE table (ours, HF's recipe, the random-init twin), the pretraining facts, the
targets with their measured values, and the validation-loss plots by tokens and by time. Everything is read from
what scripts/record.py left in its folder; nothing here is typed in by hand."""

import itertools
import json
import re
import shutil
import statistics
from pathlib import Path

TITLES = {"cola": "CoLA (MCC)", "sst2": "SST-2 (acc)", "stsb": "STS-B (Pearson)", "rte": "RTE (acc)",
          "mrpc": "MRPC (F1)", "qnli": "QNLI (acc)", "wnli": "WNLI (acc)"}
MODELS = {"ours": "ours (crammed-bert-micro)", "hf": "HF BertForMaskedLM", "random-init": "random-init twin"}
TARGETS = {"gain": 5.0, "time_to_loss": 3.0}  # the issue's bars: GLUE points over random-init, speed-up


def read_jsonl(path: Path) -> list[dict]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a torn last line
            continue
    return records


def curve(records: list[dict], start_loss: float, end: dict) -> list[tuple[float, int, float]]:
    """(budget seconds, tokens, validation loss): untrained, every periodic validation, final."""
    points = [(0.0, 0, start_loss)]
    points += [(r["elapsed_s"], r["tokens"], r["val_loss"]) for r in records
               if r.get("event") == "validation" and r.get("step", 0) > 0]
    return points + [(end["seconds"], end["tokens"], end["val_loss"])]


def pretraining(out: Path) -> dict:
    ours = json.loads((out / "ours" / "train_summary.json").read_text())
    hf = json.loads((out / "hf" / "summary.json").read_text())
    spent = ours["wall_seconds"]
    ours_seconds = spent["train"] + spent["compile"] + spent["checkpoint"]  # the budget clock's total
    runs = {
        "ours": {"parameters": ours["parameters"], "steps": ours["steps"], "tokens": ours["tokens"],
                 "tokens_per_s": ours["tokens_per_s"], "untrained": ours["untrained_val_loss"],
                 "val_loss": ours["val_loss"], "val_accuracy": ours["val_accuracy"], "seconds": ours_seconds,
                 "validation_seconds": spent["eval"]},
        "hf": {"parameters": hf["parameters"], "steps": hf["steps"], "tokens": hf["tokens"],
               "tokens_per_s": hf["tokens_per_s"], "untrained": hf["untrained_val_loss"], "val_loss": hf["val_loss"],
               "val_accuracy": hf["val_accuracy"], "seconds": hf["train_seconds"],
               "validation_seconds": hf["validation_seconds"], "intermediate_size": hf["intermediate_size"]},
    }
    runs["ours"]["curve"] = curve(read_jsonl(out / "ours" / "metrics.jsonl"), ours["untrained_val_loss"],
                                  runs["ours"])
    runs["hf"]["curve"] = curve(read_jsonl(out / "hf" / "metrics.jsonl"), hf["untrained_val_loss"], runs["hf"])
    return runs


def time_to(points, loss: float) -> float | None:
    """Budget seconds at which a validation curve first reaches `loss`, interpolated between measurements."""
    for (t0, _, l0), (t1, _, l1) in itertools.pairwise(points):
        if l1 <= loss:
            return t1 if l1 == l0 else t0 + (t1 - t0) * (l0 - loss) / (l0 - l1)
    return None


def glue(out: Path, tasks: list[str]) -> dict:
    """model -> task -> the per-seed dev scores of the main metric (eval.py's results.json of each job)."""
    scores = {model: {} for model in MODELS}
    for task in tasks:
        for job, models in ((f"ours-{task}", {"pretrained": "ours", "random-init": "random-init"}),
                            (f"hf-{task}", {"pretrained": "hf"})):
            results = json.loads((out / "glue" / job / "results.json").read_text())
            for label, model in models.items():
                entry = results["models"][label]["tasks"][task]
                scores[model][task] = {"values": entry["summary"]["dev"]["values"], "source": entry["source"],
                                       "train_examples": entry["train_examples"], "epochs": entry["recipe"]["epochs"],
                                       "seconds": results["seconds"]}
    return scores


def cell(values: list[float]) -> str:
    median = statistics.median(values)
    return f"{median:.1f}" if len(values) == 1 else f"{median:.1f} ({min(values):.1f}–{max(values):.1f})"


def glue_table(scores: dict, tasks: list[str]) -> tuple[str, dict]:
    averages = {m: statistics.mean(statistics.median(scores[m][t]["values"]) for t in tasks) for m in MODELS}
    lines = ["| task | " + " | ".join(MODELS.values()) + " | seeds | epochs | train examples |",
             "|---|" + "---:|" * (len(MODELS) + 3)]
    for t in tasks:
        first = scores["ours"][t]
        lines.append(f"| {TITLES.get(t, t)} | " + " | ".join(cell(scores[m][t]["values"]) for m in MODELS)
                     + f" | {len(first['values'])} | {first['epochs']} | {first['train_examples']:,} |")
    lines.append("| **average** | " + " | ".join(f"**{averages[m]:.1f}**" for m in MODELS) + " | | | |")
    return "\n".join(lines), averages


def plots(runs: dict, folder: Path) -> list[str]:
    from matplotlib.figure import Figure

    names = []
    for x, index, label, scale in (("tokens", 1, "tokens seen (millions)", 1e6),
                                   ("time", 0, "budget minutes", 60)):
        fig = Figure(figsize=(7, 4), dpi=110, layout="constrained")
        ax = fig.add_subplot()
        for key, color in (("ours", "tab:blue"), ("hf", "tab:orange")):
            points = runs[key]["curve"]
            ax.plot([p[index] / scale for p in points], [p[2] for p in points], marker="o", markersize=3,
                    color=color, label=MODELS[key])
        ax.set_xlabel(label)
        ax.set_ylabel("validation MLM loss (same sequences, same masks)")
        ax.set_ylim(top=min(max(r["untrained"] for r in runs.values()), max(r["val_loss"] for r in runs.values()) * 1.6))
        ax.grid(alpha=0.3)
        ax.legend()
        name = f"loss_by_{x}.png"
        fig.savefig(folder / name)
        names.append(name)
    return names


def machine_line(state: dict) -> str:
    m = state.get("machine", {})
    return (f"{m.get('cpu', '?')}, {m.get('cpus_usable', '?')} usable CPUs, one torch thread per process; "
            f"torch {m.get('torch', '?')}, transformers {m.get('transformers', '?')}; started {m.get('date', '?')}")


def render(out: Path, state: dict, images: str) -> tuple[str, str]:
    settings = state["settings"]
    tasks = settings["tasks"]
    runs = pretraining(out)
    scores = glue(out, tasks)
    table, averages = glue_table(scores, tasks)
    ours, hf = runs["ours"], runs["hf"]
    hf_to_ours = time_to(hf["curve"], ours["val_loss"])
    ours_to_hf = time_to(ours["curve"], hf["val_loss"])
    speedup = hf["seconds"] / ours_to_hf if ours_to_hf else None
    gain = averages["ours"] - averages["random-init"]
    lead = averages["ours"] - averages["hf"]
    reach = (f"HF's recipe reached our final validation loss ({ours['val_loss']:.3f}) after "
             f"{hf_to_ours / 60:.1f} budget minutes, {hf_to_ours / ours['seconds']:.1f}x our time"
             if hf_to_ours else
             f"HF's recipe did not reach our final validation loss ({ours['val_loss']:.3f}) within its budget "
             f"(it ended at {hf['val_loss']:.3f}): more than {hf['seconds'] / ours['seconds']:.1f}x our time")
    faster = (f"ours reached HF's final loss ({hf['val_loss']:.3f}) after {ours_to_hf / 60:.1f} minutes: "
              f"**{speedup:.1f}x faster** to that loss" if speedup else "ours never reached HF's final loss")
    stage = {k: state.get(k, {}).get("seconds", 0) / 60 for k in ("corpus", "prepare", "pretrain", "finetune")}
    jobs = {m: sum(scores[m][t]["seconds"] for t in tasks) / 60 for m in ("ours", "hf")}  # eval.py's own clock
    verdict = lambda ok: "met" if ok else "**missed**"
    pre = ("| pretraining | parameters | steps | tokens seen | tokens/s | val MLM loss (untrained → end) | "
           "val accuracy | budget min | validating min |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for key in ("ours", "hf"):
        r = runs[key]
        pre += (f"| {MODELS[key]} | {r['parameters'] / 1e6:.2f} M | {r['steps']:,} | {r['tokens'] / 1e6:.2f} M | "
                f"{r['tokens_per_s']:,.0f} | {r['untrained']:.3f} → **{r['val_loss']:.3f}** | "
                f"{100 * r['val_accuracy']:.1f} % | {r['seconds'] / 60:.1f} | {r['validation_seconds'] / 60:.1f} |\n")
    targets = (f"- ours minus random-init: **{gain:+.1f}** GLUE points on average (target ≥ +{TARGETS['gain']:g}: "
               f"{verdict(gain >= TARGETS['gain'])})\n"
               f"- ours minus HF's recipe at equal budget: **{lead:+.1f}** points (target > 0: {verdict(lead > 0)})\n"
               f"- time to loss: {faster}; {reach} (target ≥ {TARGETS['time_to_loss']:g}x: "
               f"{verdict(bool(speedup) and speedup >= TARGETS['time_to_loss'])})\n")
    body = (f"Budget **{settings['minutes']:g} minutes** of pretraining for each model, side by side, one CPU core "
            f"each. Machine: {machine_line(state)}. Wall time: corpus {stage['corpus']:.1f} min, data "
            f"{stage['prepare']:.1f} min, pretraining {stage['pretrain']:.1f} min (both at once), fine-tuning "
            f"{stage['finetune']:.1f} min ({settings['jobs']} jobs at a time; the jobs of ours and its twin took "
            f"{jobs['ours']:.1f} min, HF's {jobs['hf']:.1f} min).\n\n"
            "GLUE dev sets, fine-tuned with eval.py's defaults (Cramming's recipe: AdamW lr 4e-5, batch 16, cosine "
            "with 10 % warm-up, dropout 0.1; epochs as in the table), "
            + ("the whole training sets" if not settings["smoke"] else "a few training examples (--smoke)")
            + "; the median over seeds (range):\n\n"
            f"{table}\n\n{targets}\n{pre}\n"
            f"![validation loss by tokens]({images}loss_by_tokens.png)\n"
            f"![validation loss by time]({images}loss_by_time.png)\n")
    return body, f"{table}\n\n{targets}"


def write_report(out: Path, state: dict, docs: Path | None = None) -> Path:
    """<out>/results.md and the plots; with `docs`, also docs/results.md (its measured part, between markers),
    docs/results/*.png and the README's table."""
    from cramming.atomic import write_atomic

    out = Path(out)
    names = plots(pretraining(out), out)
    body, table = render(out, state, "")
    write_atomic(out / "results.md", "# The CPU record run\n\n" + body)
    if docs is not None:
        (docs / "results").mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copy(out / name, docs / "results" / name)
        replace_between(docs / "results.md", "record", render(out, state, "results/")[0])
        replace_between(docs.parent / "README.md", "record", table)
    return out / "results.md"


def replace_between(path: Path, marker: str, text: str) -> None:
    """The text between <!-- marker:start --> and <!-- marker:end -->, which must be there: the prose around
    the measured part is written by hand and stays."""
    from cramming.atomic import write_atomic

    source = path.read_text(encoding="utf-8")
    pattern = re.compile(rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)", re.DOTALL)
    if not pattern.search(source):
        raise SystemExit(f"error: {path} has no <!-- {marker}:start --> ... <!-- {marker}:end --> block to fill")
    write_atomic(path, pattern.sub(lambda m: m.group(1) + text + m.group(2), source))
