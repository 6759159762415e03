"""Section 4: fine-tuning throughput, eval.py's GLUE loop against a plain Hugging Face `Trainer`, on SST-2.

Both fine-tune the same checkpoint (the quality section's pretrained model) through the same classifier
(cramming.eval.classifier_head.build_classifier: pooler, dropout 0.1) on the same training examples (the subset
eval.max_train_examples draws), with the same batch size (16), maximum length (128), tokenisation, optimiser
settings and schedule (AdamW lr 4e-5, betas (0.9, 0.98), eps 1e-6, cosine with 10 % warm-up), one epoch.
Ours runs as a user runs it (`eval.py ... eval.tasks=[sst2]`, a subprocess) and its results.json gives the training
loop's seconds; the Trainer is set as its users set it for this (DataCollatorWithPadding: each batch padded to its
longest row; train_sampling_strategy="group_by_length", which batches rows of similar length as ours does; default
optimizer), and its `train_runtime` counts. Examples/s = training examples / those seconds; the two take turns (ours,
HF, ours, HF, ...) and the medians count. No target in the brief: against a Trainer set this way we check parity,
>= 1.0x.
"""

import json
import random
import statistics
import subprocess
from pathlib import Path

from .common import launch, table, target, wait_ok

RECIPE = {"batch_size": 16, "max_length": 128, "lr": 4e-5, "betas": (0.9, 0.98), "eps": 1e-6, "warmup": 0.1}


def start_ours(checkpoint: str, glue: Path, examples: int, run_dir: Path) -> subprocess.Popen:
    """eval.py on SST-2 for one epoch, as a user runs it."""
    return launch("eval.py", [f"checkpoint={checkpoint}", "eval.tasks=[sst2]", f"eval.data_dir={glue}",
                              f"eval.max_train_examples={examples}", "eval.recipe.epochs=1", "eval.seeds=1", "impl=cpu",
                              f"eval.results_table={run_dir / 'results.csv'}", f"hydra.run.dir={run_dir}"])


def finish_ours(proc: subprocess.Popen, run_dir: Path) -> float:
    """The training loop's seconds, from eval.py's results.json."""
    wait_ok(proc, "eval.py")
    results = json.loads((run_dir / "results.json").read_text())
    return results["models"]["pretrained"]["tasks"]["sst2"]["runs"][0]["curve"][0]["train_seconds"]


def run_trainer(checkpoint: str, glue: Path, examples: int, out: Path) -> float:
    """The Hugging Face Trainer on the same examples and model; returns its train_runtime."""
    import transformers
    from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    from cramming.eval.classifier_head import build_classifier, encode_texts
    from cramming.eval.tasks import load_task

    transformers.logging.set_verbosity_error()
    task = load_task("sst2", str(glue))
    rows = random.Random(0).sample(task.train, examples) if len(task.train) > examples else task.train
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)
    ids = encode_texts(tokenizer, rows, RECIPE["max_length"])
    dataset = [{"input_ids": i, "labels": r.label} for i, r in zip(ids, rows)]
    model = build_classifier(checkpoint, task, 0.1, False)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=RECIPE["batch_size"], num_train_epochs=1,
                             learning_rate=RECIPE["lr"], adam_beta1=RECIPE["betas"][0], adam_beta2=RECIPE["betas"][1],
                             adam_epsilon=RECIPE["eps"], weight_decay=0.0, lr_scheduler_type="cosine",
                             warmup_steps=RECIPE["warmup"], use_cpu=True, seed=0, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             train_sampling_strategy="group_by_length")
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=DataCollatorWithPadding(tokenizer))
    return trainer.train().metrics["train_runtime"]


def run(args, work: Path, checkpoint: str) -> dict:
    glue = args.shared / "glue"
    examples = 64 if args.smoke else args.finetune_examples
    rounds = 1 if args.smoke else args.finetune_rounds
    times = {"ours": [], "HF": []}
    for r in range(rounds):  # ours, then HF; --smoke overlaps the two (its numbers mean nothing anyway)
        proc = start_ours(checkpoint, glue, examples, work / f"finetune-ours-{r}")
        if not args.smoke:
            times["ours"].append(finish_ours(proc, work / f"finetune-ours-{r}"))
        times["HF"].append(run_trainer(checkpoint, glue, examples, work / f"finetune-hf-{r}"))
        if args.smoke:
            times["ours"].append(finish_ours(proc, work / f"finetune-ours-{r}"))
        print(f"  round {r + 1}: ours {times['ours'][-1]:.1f} s, HF Trainer {times['HF'][-1]:.1f} s", flush=True)
    results = {name: {"seconds": statistics.median(t), "samples": t, "examples": examples,
                      "examples_per_s": examples / statistics.median(t)} for name, t in times.items()}
    ratio = results["ours"]["examples_per_s"] / results["HF"]["examples_per_s"]
    rows = [[name, examples, r["seconds"], r["examples_per_s"]] for name, r in
            (("ours (eval.py)", results["ours"]), ("HF Trainer", results["HF"]))]
    markdown = (f"SST-2, {examples:,} training examples, one epoch, batch {RECIPE['batch_size']}, max length "
                f"{RECIPE['max_length']}, median of {rounds} alternating run(s) each.\n\n"
                + table(["loop", "examples", "train seconds", "examples/s"], rows))
    return {"status": "ok", "results": results, "ratio": ratio, "markdown": markdown,
            "targets": [target("finetune", "SST-2 fine-tuning examples/s ours/HF Trainer", ratio, ">= 1.0x", ">=", 1.0)]}
