"""The pretraining recipe, top to bottom: config -> data -> model -> budget trainer -> checkpoint."""

import contextlib
import io
import json
import random
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from . import deepspeed_engine
from . import distributed as dist_
from . import impl as impl_
from .atomic import write_atomic
from .cli import cpu_recipe_note
from .config import PretrainConfig, microbatch_size
from .data.loader import train_batches
from .data.prepare import load_tokenizer, prepare_data
from .data.tokenizer import SPECIAL_IDS
from .errors import UserError
from .kernels import autotune_seconds
from .model import PRETRAINING_HEADS, CrammedConfig
from .train.checkpoint import save_checkpoint
from .train.curriculum import block_rows, sequence_length, stage_factors
from .train.evaluate import PeriodicValidation, validation_metrics
from .train.flops import forward_flops_per_token
from .train.masking import PositionalMasks
from .train.metrics import MetricsLog, SilentLog, whole_lines
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
        loss_impl=runtime.loss,
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
    seed_everything(config.seed)
    runtime = impl_.resolve(config.impl, config.arch)
    if (note := cpu_recipe_note(config, runtime.device.type)) and dist_.env_rank() == 0:
        print(note, flush=True)  # the GPU batch recipe on a CPU: say so before the run is mysteriously short
    if config.dryrun:  # validate and build, touch no data: lets sweeps check every job in seconds
        return dryrun(config, runtime)
    distributed = dist_.setup(config.impl.distributed, runtime.device.type)
    try:
        return _pretrain(config, run_dir, runtime, distributed, setup_start)
    finally:
        distributed.close()


def dryrun(config: PretrainConfig, runtime) -> dict:
    model = build_model(config.arch, config.data.vocab_size, SPECIAL_IDS, runtime)
    flops = flops_per_token(model, config)
    checked = " (and eval_after's evaluation; nothing is trained or evaluated)" if config.eval_after else ""
    print(f"dryrun: config valid{checked}; model has {count_parameters(model):,} parameters, "
          f"{flops / 1e6:,.1f} MFLOPs per token forward; device {runtime.device}")
    return {"dryrun": True, "parameters": count_parameters(model), "flops_per_token": flops, "checkpoint": None}


def check_distributed(config: PretrainConfig, runtime, distributed) -> None:
    """What the engines cannot do, said before any work (the same on every rank, so all ranks stop)."""
    engine = distributed.engine
    if engine == "fsdp2" and config.train.optim.name == "muon":
        raise UserError("train.optim.name=muon cannot run under impl.distributed=fsdp2: Muon orthogonalises whole "
                        "matrices and FSDP2 gives each rank a shard; use ddp, or another optimizer")
    if engine == "fsdp2" and runtime.precision == "fp16":
        raise UserError("impl.precision=fp16 is not supported with impl.distributed=fsdp2 (its grad scaler would "
                        "see only this rank's shard); use bf16")
    micro = microbatch_size(config)
    if engine == "deepspeed" and (problem := deepspeed_engine.problem(config, runtime, micro)):
        raise UserError(problem)
    if micro is None and engine == "fsdp2":
        raise UserError("impl.microbatch_size=auto cannot probe a sharded model (every rank would have to fail "
                        "together); give impl.microbatch_size a number under impl.distributed=fsdp2")
    if config.train.batch_size % distributed.world:
        raise UserError(f"train.batch_size={config.train.batch_size} must be a multiple of the world size "
                        f"{distributed.world}: the global batch keeps its meaning on any number of GPUs")
    if micro is not None and config.train.batch_size % (micro * distributed.world):
        raise UserError(f"train.batch_size={config.train.batch_size} must be a multiple of impl.microbatch_size "
                        f"x world size = {micro} x {distributed.world}: the global batch keeps its meaning on any "
                        "number of GPUs")


def _pretrain(config: PretrainConfig, run_dir, runtime, distributed, setup_start: float) -> dict:
    check_distributed(config, runtime, distributed)
    say = print if distributed.main else (lambda *args, **kwargs: None)
    run_dir = Path(distributed.broadcast(str(run_dir)))  # Hydra's folder of rank 0 is the run's folder
    if distributed.main:
        run_dir.mkdir(parents=True, exist_ok=True)
    runtime.device = dist_.device_for(distributed, runtime.device)
    # AdamW's second moments decay into the denormal range, which x86 CPUs handle in slow microcode.
    torch.set_flush_denormal(True)

    if distributed.main:
        folder, meta = prepare_data(config.data)
        distributed.barrier()
    else:  # rank 0 tokenizes and caches; the others then find the cache, quietly
        distributed.barrier()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            folder, meta = prepare_data(config.data)
    tokenizer = load_tokenizer(folder)
    model = build_model(config.arch, meta["vocab_size"], meta["special_ids"], runtime)
    torch.manual_seed(config.seed + distributed.rank)  # same initial weights everywhere, different dropout
    parameters, flops = count_parameters(model), flops_per_token(model, config)
    engine = f", {distributed.engine} on {distributed.world} processes" if distributed.active else ""
    say(f"model: {parameters:,} parameters, {flops / 1e6:,.1f} MFLOPs per token forward (about 3x that to "
          f"train), device {runtime.device}, precision {runtime.precision}, "
          f"compile {runtime.compile}, attention {runtime.attention}, rotary {runtime.rotary}{engine}", flush=True)
    model.to(runtime.device)
    model = dist_.wrap(model, distributed, runtime.device)  # before the optimizer: FSDP2 swaps the parameters
    optimizer = build_optimizer(model, config.train, runtime.device)
    scaler = runtime.grad_scaler()
    if distributed.engine == "deepspeed":  # the engine holds (and shards) the optimizer, and scales fp16 itself
        model, optimizer = deepspeed_engine.initialize(model, optimizer, config, runtime, microbatch_size(config),
                                                       distributed)
        scaler = torch.amp.GradScaler(runtime.device.type, enabled=False)
    masks = PositionalMasks(config.seed, runtime.device)
    checkpointer = Checkpointer(run_dir, config.train.checkpoint_every_minutes, config.train.keep_checkpoints,
                                json.loads(json.dumps(asdict(config))), distributed)
    state = TrainState()
    resume_from = distributed.broadcast(find_resume(config.train.resume, run_dir, config) if distributed.main
                                        else None)
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scaler, distributed)
        if distributed.main:
            carry_metrics(resume_from, run_dir, state.step)
        say(f"resuming from {resume_from}: step {state.step}, {state.elapsed / 60:.1f} min of the budget spent",
              flush=True)
    step_model = model
    if runtime.compile and distributed.engine == "deepspeed":
        model.compile()  # the engine compiles its module in place and keeps its own methods (backward, step)
    elif runtime.compile:
        step_model = torch.compile(model)
    stages = stage_factors(config.train.seq_schedule, meta["seq_length"])
    blocks = block_rows(stages)
    microbatch = microbatch_size(config)
    if microbatch is None:  # impl.microbatch_size=auto
        longest = sequence_length(meta["seq_length"], max(k for _, k in stages))
        per_rank = replace(config, train=replace(config.train, batch_size=config.train.batch_size // distributed.world))
        microbatch = auto_microbatch(dist_.unwrap(model), per_rank, meta["vocab_size"], longest, blocks, runtime,
                                     config.data.cache_dir)
        microbatch = distributed.smallest(microbatch, runtime.device)  # the GPU with the least room decides
        check_distributed(replace(config, impl=replace(config.impl, microbatch_size=microbatch)), runtime,
                          distributed)
        say(f"microbatch: {microbatch} sequences (impl.microbatch_size=auto)", flush=True)
    batches = train_batches(folder, meta, config.data.ordering, config.seed, microbatch * distributed.world,
                            config.impl.num_workers, pin_memory=runtime.device.type == "cuda",
                            start=state.sequences, block=blocks, world=distributed.world)
    setup_seconds = time.time() - setup_start

    eval_start = time.time()
    autocast = runtime.autocast()
    objective = build_objective(config.arch.objective, config.train, meta, runtime.device)
    val_batch = microbatch
    eval_model = dist_.unwrap(model)  # every rank validates on all validation rows; FSDP2 needs them all anyway
    if not state.untrained:
        state.untrained = validation_metrics(eval_model, objective, folder, meta, config.train, val_batch,
                                             runtime.device, autocast)
        if config.train.nonfinite == "rollback":  # a rollback needs somewhere to go from the first step on
            checkpointer.save(model, optimizer, scaler, state)
    untrained = state.untrained
    eval_seconds = time.time() - eval_start
    say(f"untrained validation loss {untrained['val_loss']:.4f}", flush=True)

    log = MetricsLog.for_run(run_dir, config) if distributed.main else SilentLog()
    validation = None
    if config.train.validate_every_minutes:
        validation = PeriodicValidation(config.train.validate_every_minutes, lambda: validation_metrics(
            eval_model, objective, folder, meta, config.train, val_batch, runtime.device, autocast))
    try:
        result = train(step_model, optimizer, batches, objective, meta, config.train, microbatch,
                       Budget(config.budget * 3600, config.train.max_steps), runtime.device, autocast,
                       scaler, log, state, masks, checkpointer, distributed, validation)
        eval_seconds += validation.seconds if validation else 0.0
        eval_start = time.time()
        final = validation_metrics(eval_model, objective, folder, meta, config.train, val_batch, runtime.device,
                                   autocast)
        eval_seconds += time.time() - eval_start
        log.log({"step": result["steps"], **final})
    finally:
        log.close()
    say(f"validation loss {final['val_loss']:.4f} (untrained {untrained['val_loss']:.4f}), "
          f"accuracy {final['val_accuracy']:.3f}, {result['steps']} steps, {result['tokens']:,} tokens", flush=True)

    peak = runtime.peak_flops()  # per device; the run's tokens/s is over all of them
    peak = peak * distributed.world if peak else None
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
            "train": round(result["train_seconds"], 3),  # without compile and checkpoints: tokens_per_s's seconds
            "checkpoint": round(result["checkpoint_seconds"], 3),
            "eval": round(eval_seconds, 3),
            "autotune": round(autotune_seconds(), 3),  # Triton kernels' compiling and autotuning: inside compile/train
        },
        "budget_hours": config.budget,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "device": str(runtime.device),
        "distributed": {"engine": distributed.engine, "world_size": distributed.world},
        "precision": runtime.precision,
        "data": {"cache": str(folder), **{k: meta[k] for k in ("train_sequences", "val_sequences", "train_tokens",
                                                                "val_tokens", "vocab_size")}},
        "config": asdict(config),
    }
    final_model = whole_model(model, distributed, config, meta, runtime)
    if distributed.main:
        path = save_checkpoint(final_model, tokenizer, summary, run_dir)
        summary["checkpoint"] = str(path)
        write_atomic(run_dir / "train_summary.json", json.dumps(summary, indent=2))
        if mfu is not None:
            print(f"model FLOP utilisation {100 * mfu:.1f} % of {peak / 1e12:.0f} TFLOP/s", flush=True)
        print(f"checkpoint: {path}", flush=True)
    distributed.barrier()
    return summary


def whole_model(model, distributed, config, meta, runtime):
    """The trained model in one piece for the final checkpoint; FSDP2's shards and DeepSpeed's ZeRO partitions
    are gathered onto rank 0's CPU."""
    if distributed.engine == "deepspeed":  # the fp32 master weights, gathered from the ZeRO partitions
        weights = deepspeed_engine.full_weights(model)
        return load_whole(weights, config, meta, runtime) if distributed.main else None
    if distributed.engine != "fsdp2":
        return dist_.unwrap(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return load_whole(weights, config, meta, runtime) if distributed.main else None


def load_whole(weights: dict, config, meta, runtime):
    whole = build_model(config.arch, meta["vocab_size"], meta["special_ids"], runtime)
    whole.load_state_dict(weights)
    return whole


def carry_metrics(checkpoint: Path, run_dir: Path, step: int) -> None:
    """Resuming from another launch's folder: copy its metrics up to the checkpoint, so one log tells the run."""
    source = Path(checkpoint).parents[1] / "metrics.jsonl"
    target = Path(run_dir) / "metrics.jsonl"
    if source.resolve() == target.resolve() or not source.is_file():
        source = target  # same folder: drop what was logged after the checkpoint
    if not source.is_file():
        return
    kept = [line for line in whole_lines(source) if json.loads(line).get("step", 0) <= step]
    write_atomic(target, "".join(line + "\n" for line in kept))
