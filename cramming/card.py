"""The model card of every checkpoint folder: `README.md` in Hugging Face's card format (YAML front matter, then
markdown), so a folder pushed to the hub (`python -m cramming.push`) documents itself. pretrain.py writes it with
the checkpoint (from train_summary.json); eval.py adds its scores when it evaluates one of our folders."""

import json
import re
import shlex
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from .atomic import write_atomic
from .untrusted import inside, read_json

CARD = "README.md"


def launch_command() -> str:
    """The command that made the run: pretrain.py and its overrides (Hydra's, when it launched the run)."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra (a library call): the process's own arguments
        return " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    return " ".join(shlex.quote(a) for a in ["python", "pretrain.py", *overrides])


def card_text(summary: dict, evaluations: list[dict] = (), head=None) -> str:
    """The card of a checkpoint trained as `summary` (train_summary.json) says, with eval.py's results. head: the
    class its objective pretrains, which says how the hub shows it (`pipeline_tag`) and which Auto class loads it
    (`_auto_class`, set by register_for_auto_class); None: a plain AutoModel card."""
    config, data = summary["config"], summary["data"]
    arch = config["arch"]
    objective = arch["objective"]
    pipeline, loader = getattr(head, "pipeline_tag", None), getattr(head, "_auto_class", None) or "AutoModel"
    exported_as = summary.get("exported_as")  # transformers' own class (export_families.py): no remote code
    remote = "" if exported_as else ", trust_remote_code=True"
    front = ["---", "library_name: transformers", *([f"pipeline_tag: {pipeline}"] if pipeline else []),
             "tags:", "- cramming", f"- {objective}", "- custom_code" if not exported_as else f"- {exported_as}",
             "---", ""]
    source = config["data"]["source"] + (f" ({without_paths(config['data']['path'])})" if config["data"].get("path")
                                         else "")
    started = (f"; started from the weights of `{without_paths(summary['init_from'])}`" if summary.get("init_from")
               else "")
    step = summary.get("intermediate_step")  # an intermediate checkpoint (export.py): the run went on after it
    when = (f" It is the intermediate checkpoint after step {step:,}, {summary['elapsed_seconds'] / 3600:.2f} h "
            "into the budget." if step is not None else "")
    corpus = f"{data['train_tokens']:,} training tokens, " if data.get("train_tokens") is not None else ""
    where = f" on {summary['device']} ({summary['precision']})" if summary.get("device") else ""
    loss = (f"| final validation loss | {summary['val_loss']:.4f} (untrained {summary['untrained_val_loss']:.4f}) |"
            if summary.get("val_loss") is not None else
            f"| validation loss | not measured at this step (untrained {summary['untrained_val_loss']:.4f}) |")
    lines = [
        f"# {summary['name']}" + (f" (step {step:,})" if step is not None else ""), "",
        (f"{'An' if objective in ('mlm', 'rtd') else 'A'} {objective.upper()} model pretrained with [cramming](https://github.com/JonasGeiping/cramming)'s recipe "
         f"on a wall-clock budget of {summary['budget_hours']:g} hours{started}.{when}"), "",
        "| | |", "|---|---|",
        (f"| architecture | {arch['num_layers']} layers x {arch['hidden_size']} wide, {arch['num_heads']} heads, "
         f"{arch['ffn']} FFN {arch['ffn_size']}, {arch['norm_position']}-norm, {arch['position']} positions |"),
        f"| parameters | {summary['parameters']:,} |",
        f"| data | {source}: {corpus}vocabulary {data['vocab_size']:,} |",
        f"| budget | {summary['budget_hours']:g} h{where} |",
        f"| tokens seen | {summary['tokens']:,} in {summary['steps']:,} steps |",
        loss,
        "", "## How it was made", "", "```bash", without_paths(summary.get("command") or "(not recorded)"), "```", "",
        "## Use", "", "```python", f"from transformers import AutoTokenizer, {loader}",
        f"tok = AutoTokenizer.from_pretrained(path{remote})",
        f"model = {loader}.from_pretrained(path{remote})", "```", "",
        *([(f"Written as transformers' own `{exported_as}` (`python -m cramming.export --as`): it loads without "
            "remote code."), ""] if exported_as else []),
    ]
    return "\n".join(front + lines + evaluation_lines(evaluations))


# An absolute path (POSIX or a home folder) inside a text: the card names data by what it is, never by where it
# lay on the machine that made it.
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/-])(?:~|/)[^\s,;()'\"]*")


def without_paths(text: str) -> str:
    """`text` with each absolute path replaced by its last part (a folder's or a file's name)."""
    return ABSOLUTE_PATH.sub(lambda m: Path(m.group(0).rstrip("/")).name or m.group(0), str(text))


def evaluation_lines(evaluations) -> list[str]:
    """One section per eval.py run: what was evaluated (benchmark kind, data, metric), seeds, comparability."""
    if not evaluations:
        return ["## Evaluation", "", ("Not evaluated yet: `python eval.py checkpoint=<this folder>` adds its scores "
                                      "here."), ""]
    lines = ["## Evaluation", ""]
    for run in evaluations:
        scores = run["scores"]
        kind = f" (`eval={run['kind']}`)" if run.get("kind") else ""
        lines += [f"### {run['benchmark']}{kind}, {run['seeds']} seed(s), median, {run['finished_at'][:10]}", ""]
        for task, data in run.get("data", {}).items():
            lines.append(f"- {task}: {data}, metric {run['metrics'][task]}")
        lines += ["- comparable to published scores: " + ("yes" if run["comparable"] else "no"), "",
                  "| " + " | ".join(scores) + " |", "|" + "---:|" * len(scores),
                  "| " + " | ".join(f"{v:.1f}" for v in scores.values()) + " |", ""]
    return lines


EVALUATIONS = "eval_results.json"  # eval.py's scores of this folder, one entry per evaluation, oldest first


def evaluations_of(folder: Path) -> list[dict]:
    """The folder's eval_results.json (read inside the folder only: a link leading out is refused)."""
    path = inside(folder, EVALUATIONS, str(folder))
    done = read_json(path, what="eval_results.json") if path.is_file() else []
    return [entry for entry in done if is_evaluation(entry)] if isinstance(done, list) else []


def is_evaluation(entry) -> bool:
    """An entry of eval_results.json as eval.py writes it (what evaluation_lines reads of it); others are left out
    of the card, as a folder's files are data."""
    if not isinstance(entry, dict) or not {"benchmark", "seeds", "scores", "comparable", "finished_at"} <= set(entry):
        return False
    scores, data = entry["scores"], entry.get("data", {})
    return (isinstance(scores, dict) and all(isinstance(v, int | float) for v in scores.values())
            and isinstance(entry["finished_at"], str) and isinstance(data, dict)
            and (not data or isinstance(entry.get("metrics"), dict) and set(data) <= set(entry["metrics"])))


def write_card(folder: Path, summary: dict, head=None) -> None:
    write_atomic(Path(folder) / CARD, card_text(summary, evaluations_of(folder), head))


def add_evaluation(folder: Path, entry: dict, head_of) -> bool:
    """Add eval.py's scores (benchmark, seeds, scores, comparable, finished_at) to one of our checkpoints' cards,
    kept in its eval_results.json; other folders (a hub model's snapshot) are left alone. Returns whether the card
    was written. head_of(objective): the class that objective pretrains (card_text's head). What the folder holds
    is read inside it only; a write the file system refuses raises OSError for the caller to report."""
    folder = Path(folder)
    if not (folder / "train_summary.json").is_file() or not (folder / CARD).is_file():
        return False
    summary = read_json(inside(folder, "train_summary.json", str(folder)), what="train_summary.json")
    done = evaluations_of(folder)
    write_atomic(folder / EVALUATIONS, json.dumps([*done, entry], indent=2))
    write_card(folder, summary, head_of(summary["config"]["arch"]["objective"]))
    return True
