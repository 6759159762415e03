"""The pretraining recipe, top to bottom: config -> data -> model -> budget trainer -> checkpoint."""

import json
import random
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from . import impl as impl_
from .config import PretrainConfig, microbatch_size
from .data.loader import train_batches
from .data.prepare import load_tokenizer, prepare_data
from .data.tokenizer import SPECIAL_IDS
from .model import PRETRAINING_HEADS, CrammedConfig
from .train.checkpoint import save_checkpoint
from .train.curriculum import block_rows, sequence_length, stage_factors
from .train.evaluate import validation_metrics
from .train.flops import forward_flops_per_token
from .train.metrics import MetricsLog
from .train.microbatch import auto_microbatch
from .train.objectives import build_objective
from .train.optim import build_optimizer
from .train.resume import Checkpointer, find_resume, load_checkpoint
from .train.state import TrainState
from .train.trainer import Budget, train


def build_model(arch, vocab_size: int, special_ids: dict, runtime: impl_.Runtime):
    settings = asdict(arch)
    attention = settings.pop("attention")
    settings["linear_args"] = {k: v for k, v in settings["linear_args"].items() if v is not None}
    config = CrammedConfig(
        **settings,
        attention_pattern=attention["pattern"],
        attention_window=attention["window"],
        attention_topk=attention["topk"],
        vocab_size=vocab_size,
        attention_impl=runtime.attention,
        rotary_impl=runtime.rotary,
        pad_token_id=special_ids["pad"],
        cls_token_id=special_ids["cls"],
        sep_token_id=special_ids["sep"],
        mask_token_id=special_ids["mask"],
    )
    return PRETRAINING_HEADS[arch.objective](config)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model, config) -> int:
    sparse_mlm = config.arch.objective == "mlm" and config.arch.sparse_prediction
    return forward_flops_per_token(model, config.data.seq_length, config.train.mask_prob if sparse_mlm else 1.0)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pretrain(config: PretrainConfig, run_dir: Path) -> dict:
    """Run the whole recipe; returns train_summary (also written into the checkpoint)."""
    setup_start = time.time()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.seed)
    runtime = impl_.resolve(config.impl, config.arch)
    # AdamW's second moments decay into the denormal range, which x86 CPUs handle in slow microcode.
    torch.set_flush_denormal(True)

    if config.dryrun:  # validate and build, touch no data: lets sweeps check every job in seconds
        model = build_model(config.arch, config.data.vocab_size, SPECIAL_IDS, runtime)
        flops = flops_per_token(model, config)
        print(f"dryrun: config valid; model has {count_parameters(model):,} parameters, "
              f"{flops / 1e6:,.1f} MFLOPs per token forward; device {runtime.device}")
        return {"dryrun": True, "parameters": count_parameters(model), "flops_per_token": flops}

    folder, meta = prepare_data(config.data)
    tokenizer = load_tokenizer(folder)
    model = build_model(config.arch, meta["vocab_size"], meta["special_ids"], runtime)
    parameters, flops = count_parameters(model), flops_per_token(model, config)
    print(f"model: {parameters:,} parameters, {flops / 1e6:,.1f} MFLOPs per token forward (about 3x that to "
          f"train), device {runtime.device}, precision {runtime.precision}, "
          f"compile {runtime.compile}, attention {runtime.attention}, rotary {runtime.rotary}", flush=True)
    model.to(runtime.device)
    optimizer = build_optimizer(model, config.train, runtime.device)
    scaler = runtime.grad_scaler()
    generator = torch.Generator(device=runtime.device).manual_seed(config.seed)  # masking draws
    checkpointer = Checkpointer(run_dir, config.train.checkpoint_every_minutes, config.train.keep_checkpoints,
                                json.loads(json.dumps(asdict(config))))
    state = TrainState()
    resume_from = find_resume(config.train.resume, run_dir, config)
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scaler, generator)
        carry_metrics(resume_from, run_dir, state.step)
        print(f"resuming from {resume_from}: step {state.step}, {state.elapsed / 60:.1f} min of the budget spent",
              flush=True)
    step_model = torch.compile(model) if runtime.compile else model
    stages = stage_factors(config.train.seq_schedule, meta["seq_length"])
    blocks = block_rows(stages)
    microbatch = microbatch_size(config)
    if microbatch is None:  # impl.microbatch_size=auto
        longest = sequence_length(meta["seq_length"], max(k for _, k in stages))
        microbatch = auto_microbatch(model, config, meta["vocab_size"], longest, blocks, runtime,
                                     config.data.cache_dir)
        print(f"microbatch: {microbatch} sequences (impl.microbatch_size=auto)", flush=True)
    batches = train_batches(folder, meta, config.data.ordering, config.seed, microbatch,
                            config.impl.num_workers, pin_memory=runtime.device.type == "cuda",
                            start=state.sequences, block=blocks)
    setup_seconds = time.time() - setup_start

    eval_start = time.time()
    autocast = runtime.autocast()
    objective = build_objective(config.arch.objective, config.train, meta, runtime.device)
    val_batch = microbatch
    if not state.untrained:
        state.untrained = validation_metrics(model, objective, folder, meta, config.train, val_batch,
                                             runtime.device, autocast)
        if config.train.nonfinite == "rollback":  # a rollback needs somewhere to go from the first step on
            checkpointer.save(model, optimizer, scaler, state, generator)
    untrained = state.untrained
    eval_seconds = time.time() - eval_start
    print(f"untrained validation loss {untrained['val_loss']:.4f}", flush=True)

    log = MetricsLog(run_dir, config.train.tensorboard)
    try:
        result = train(step_model, optimizer, batches, objective, meta, config.train, microbatch,
                       Budget(config.budget * 3600, config.train.max_steps), runtime.device, autocast,
                       scaler, log, state, generator, checkpointer)
        eval_start = time.time()
        final = validation_metrics(model, objective, folder, meta, config.train, val_batch, runtime.device, autocast)
        eval_seconds += time.time() - eval_start
        log.log({"step": result["steps"], **final})
    finally:
        log.close()
    print(f"validation loss {final['val_loss']:.4f} (untrained {untrained['val_loss']:.4f}), "
          f"accuracy {final['val_accuracy']:.3f}, {result['steps']} steps, {result['tokens']:,} tokens", flush=True)

    peak = runtime.peak_flops()
    mfu = 3 * flops * result["tokens_per_s"] / peak if peak else None
    summary = {
        "name": config.name,
        "parameters": parameters,
        "flops_per_token": flops,
        "steps": result["steps"],
        "tokens": result["tokens"],
        "tokens_per_s": result["tokens_per_s"],
        "mfu": mfu,  # model FLOPs (3 x forward per token) over the device's peak; null where the peak is unknown
        "final_train_loss": result["final_train_loss"],
        "val_loss": final["val_loss"],
        "val_accuracy": final["val_accuracy"],
        "untrained_val_loss": untrained["val_loss"],
        "untrained_val_accuracy": untrained["val_accuracy"],
        "skipped_steps": result["skipped_steps"],
        "rollbacks": result["rollbacks"],
        "resumed_from": str(resume_from) if resume_from else None,
        "wall_seconds": {
            "setup": round(setup_seconds, 3),
            "compile": round(result["compile_seconds"], 3),
            "train": round(result["train_seconds"] - result["compile_seconds"], 3),
            "checkpoint": round(result["checkpoint_seconds"], 3),
            "eval": round(eval_seconds, 3),
        },
        "budget_hours": config.budget,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "device": str(runtime.device),
        "precision": runtime.precision,
        "data": {"cache": str(folder), **{k: meta[k] for k in ("train_sequences", "val_sequences", "train_tokens",
                                                                "val_tokens", "vocab_size")}},
        "config": asdict(config),
    }
    path = save_checkpoint(model, tokenizer, summary, run_dir)
    summary["checkpoint"] = str(path)
    (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    if mfu is not None:
        print(f"model FLOP utilisation {100 * mfu:.1f} % of {peak / 1e12:.0f} TFLOP/s", flush=True)
    print(f"checkpoint: {path}", flush=True)
    return summary


def carry_metrics(checkpoint: Path, run_dir: Path, step: int) -> None:
    """Resuming from another launch's folder: copy its metrics up to the checkpoint, so one log tells the run."""
    source = Path(checkpoint).parents[1] / "metrics.jsonl"
    target = Path(run_dir) / "metrics.jsonl"
    if source.resolve() == target.resolve() or not source.is_file():
        if target.is_file():  # same folder: drop what was logged after the checkpoint
            kept = [line for line in target.read_text().splitlines() if json.loads(line).get("step", 0) <= step]
            target.write_text("".join(line + "\n" for line in kept))
        return
    kept = [line for line in source.read_text().splitlines() if json.loads(line).get("step", 0) <= step]
    target.write_text("".join(line + "\n" for line in kept))
