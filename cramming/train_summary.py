"""train_summary.json: what a pretraining run did, measured (written into its checkpoint and beside it)."""

from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch

from .card import launch_command
from .kernels import autotune_seconds
from .train.heldout import target_summary


def train_summary(job, result: dict, final: dict) -> dict:
    """train_summary.json: what the run did, measured. job: the run's Pretraining (cramming/pretraining.py), after
    its fit (result, final: what that returned)."""
    config, runtime, engine, run, meta = job.config, job.runtime, job.engine, job.run, job.meta
    peak = runtime.peak_flops()  # per device; the run's tokens/s is over all of them
    peak = peak * engine.world if peak else None
    untrained = job.state.untrained
    return {
        "name": config.name,
        "parameters": run.parameters,
        "flops_per_token": run.flops,
        "steps": result["steps"],
        "tokens": result["tokens"],
        "tokens_per_s": result["tokens_per_s"],
        # model FLOPs (3 x forward per token) over the device's peak; null where the peak is unknown
        "mfu": 3 * run.flops * result["tokens_per_s"] / peak if peak else None,
        "final_train_loss": result["final_train_loss"],
        "val_loss": final["val_loss"],
        "val_accuracy": final["val_accuracy"],
        "untrained_val_loss": untrained["val_loss"],
        "untrained_val_accuracy": untrained["val_accuracy"],
        "skipped_steps": result["skipped_steps"],
        "rollbacks": result["rollbacks"],
        "resumed_from": str(job.resumed_from) if job.resumed_from else None,
        "init_from": config.train.init_from,  # the weights the run started from (train.init_from), or null
        "wall_seconds": {
            "setup": round(job.seconds["setup"], 3),
            "compile": round(result["compile_seconds"], 3),
            "train": round(result["train_seconds"], 3),  # without compile and checkpoints: tokens_per_s's seconds
            "checkpoint": round(result["checkpoint_seconds"], 3),
            "eval": round(job.seconds["eval"], 3),
            "autotune": round(autotune_seconds(), 3),  # Triton's compiling and autotuning: inside compile/train
        },
        "budget_hours": config.budget,
        "command": launch_command(),  # the command that made the run (the model card shows it)
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "device": str(runtime.device),
        "distributed": {"engine": engine.name, "world_size": engine.world},
        "precision": runtime.precision,
        "microbatch": result.get("microbatch"),  # per device, as impl.microbatch_size gave or `auto` chose
        "kernels": {"attention": runtime.attention, "rotary": runtime.rotary, "loss": runtime.loss},
        "peak_memory_gib": peak_memory_gib(runtime.device),  # this process's CUDA peak; null off CUDA
        "data": {"cache": str(job.folder), **{k: meta[k] for k in ("train_sequences", "val_sequences",
                                                                     "train_tokens", "val_tokens", "vocab_size")}},
        "config": asdict(config),
        **job.energy.summary(engine, runtime.device, result["tokens"]),
        **target_summary(job.validation),
    }


def averaging_summary(averaging, averaged, final: dict, run_dir: Path, objective: str, say) -> dict | None:
    """train_summary.json's `averaging`: the kind, its settings, the averaged weights' validation and folder."""
    if averaging is None:
        return None
    metrics, _ = averaged
    path = (Path(run_dir) / averaging.folder).resolve()
    say(f"{averaging.name}-averaged weights: validation loss {metrics['val_loss']:.4f} (last weights "
        f"{final['val_loss']:.4f}), accuracy {metrics['val_accuracy']:.3f}; saved as {path}; the sweep "
        f"objective ({objective}) is theirs", flush=True)
    return {**averaging.describe(), "val_loss": metrics["val_loss"], "val_accuracy": metrics["val_accuracy"],
            "checkpoint": str(path)}


def peak_memory_gib(device) -> float | None:
    """The most CUDA memory this process's tensors held (torch's allocator), in GiB; None off CUDA."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
