"""The pretraining recipe, top to bottom: config -> data -> model -> budget trainer -> checkpoint."""

import contextlib
import functools
import io
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from . import engines
from . import impl as impl_
from .atomic import write_atomic
from .checkpoints.model_folder import save_checkpoint
from .checkpoints.step_folder import saved_precision
from .config import PretrainConfig
from .data.loader import train_batches
from .data.prepare import load_tokenizer, prepare_data
from .data.tokenizer import SPECIAL_IDS
from .engines import env_rank
from .errors import refuse
from .run import Run, build_model, build_run, count_parameters, flops_per_token, quiet
from .train.averaging import average_final, build_averaging
from .train.checkpointing import Checkpointer, find_resume, load_checkpoint
from .train.curriculum import block_rows, sequence_length, stage_factors
from .train.energy import EnergyMeter
from .train.heldout import PeriodicHeldout, heldout_metrics
from .train.init_from import open_source, with_source_tokenizer
from .train.masking import PositionalMasks
from .train.metrics import MetricsLog, SilentLog, whole_lines
from .train.microbatch import auto_microbatch, microbatch_size
from .train.nonfinite import NONFINITE
from .train.signals import StopFlag
from .train.state import TrainState
from .train.trainer import Budget, Parts, Trainer
from .train_summary import averaging_summary, train_summary
from .untrusted import leads_outside
from .validation.across import engine_problem

CPU_BATCH = 1024  # train=cpu-smoke uses 64; a CPU step of 1024 sequences takes tens of seconds even for tiny models


def cpu_recipe_note(config, device_type: str) -> str | None:
    """The default recipe ramps the batch towards 8192 sequences: on a CPU a short run then makes a handful of
    steps, and without this line nothing says why."""
    train = config.train
    if device_type != "cpu" or train.batch_size < CPU_BATCH:
        return None
    return (f"note: train.batch_size={train.batch_size} is a GPU recipe (the batch grows to it over "
            f"{train.batch_ramp:.0%} of the budget), so on this CPU each step is slow and a short run makes few "
            "steps; for CPU runs use train=cpu-smoke (batch 64)")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pretrain(config: PretrainConfig, run_dir: Path) -> dict:
    """Run the whole recipe; returns train_summary (also written into the checkpoint)."""
    setup_start = time.time()
    seed_everything(config.seed)
    runtime = impl_.resolve(config.impl, config.arch, documents=config.data.document_masking)
    if (note := cpu_recipe_note(config, runtime.device.type)) and env_rank() == 0:
        print(note, flush=True)  # the GPU batch recipe on a CPU: say so before the run is mysteriously short
    if runtime.why and env_rank() == 0:
        print(f"precision {runtime.precision} (impl.precision=auto: {runtime.why})", flush=True)
    if config.dryrun:  # validate and build, touch no data: lets sweeps check every job in seconds
        return dryrun(config, runtime)
    engine = engines.setup(config.impl.distributed, runtime.device.type)
    try:
        return train_and_save(config, run_dir, runtime, engine, setup_start)
    finally:  # the run's parts (its DDP wrapper among them) are gone by now: see Torchrun.close
        engine.close()


def train_and_save(config: PretrainConfig, run_dir: Path, runtime, engine, setup_start: float) -> dict:
    """Build, resume, fit, save; returns the summary. Its own function so that the run's parts die when it returns,
    before the engine leaves its process group."""
    engine.check(config, runtime, microbatch_size(config))  # the same on every rank, so all ranks stop
    refuse(engine_problem(config, engine, runtime))  # and what the engine refuses of the other components
    job = Pretraining.build(config, Path(engine.broadcast(str(run_dir))), runtime, engine)
    job.resume()
    with StopFlag() as stop:  # a stop signal after the last step waits for the final checkpoint: the run is whole
        summary = job.save(*job.fit(stop, setup_start))
    if stop.signal:  # not in train_summary.json: the run it describes is whole
        job.say(f"{stop.signal} came after the last step: the run finished and its checkpoint is whole", flush=True)
        summary["stopped_by"] = stop.signal
    return summary


def dryrun(config: PretrainConfig, runtime) -> dict:
    model = build_model(config.arch, config.data.vocab_size, SPECIAL_IDS, runtime)
    flops = flops_per_token(model, config)
    checked = " (and eval_after's evaluation; nothing is trained or evaluated)" if config.eval_after else ""
    print(f"dryrun: config valid{checked}; model has {count_parameters(model):,} parameters, "
          f"{flops / 1e6:,.1f} MFLOPs per token forward; device {runtime.device}")
    return {"dryrun": True, "parameters": count_parameters(model), "flops_per_token": flops, "checkpoint": None}


def prepare(config: PretrainConfig, engine) -> tuple[Path, dict]:
    """Rank 0 tokenizes and caches; the others then find the cache, quietly."""
    if engine.main:
        found = prepare_data(config.data)
        engine.barrier()
        return found
    engine.barrier()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return prepare_data(config.data)


def choose_microbatch(config: PretrainConfig, model, meta: dict, runtime, engine, say) -> int:
    """impl.microbatch_size, or the largest that fits (impl.microbatch_size=auto), agreed by all ranks."""
    microbatch = microbatch_size(config)
    if microbatch is not None:
        return microbatch
    stages = stage_factors(config.train.seq_schedule, meta["seq_length"])
    longest = sequence_length(meta["seq_length"], max(k for _, k in stages))
    per_rank = replace(config, train=replace(config.train, batch_size=config.train.batch_size // engine.world))
    microbatch = auto_microbatch(engine.unwrap(model), per_rank, meta["vocab_size"], longest, block_rows(stages),
                                 runtime, config.data.cache_dir)
    microbatch = engine.smallest(microbatch, runtime.device)  # the GPU with the least room decides
    engine.check(replace(config, impl=replace(config.impl, microbatch_size=microbatch)), runtime, microbatch)
    say(f"microbatch: {microbatch} sequences (impl.microbatch_size=auto)", flush=True)
    if runtime.device.type == "cuda":  # the probes' peaks are not the run's (train_summary's peak_memory_gib)
        torch.cuda.reset_peak_memory_stats(runtime.device)
    return microbatch


def pin_precision(config: PretrainConfig, runtime, found: Path | None, say):
    """A resumed run under impl.precision=auto trains on in the precision its checkpoint was written in, whatever
    auto would choose here (another machine, or a probe near its threshold): resume is bitwise within a precision."""
    if found is None or config.impl.precision != "auto":
        return runtime
    saved = saved_precision(found, runtime.device.type)
    if saved is None or saved == runtime.precision:
        return runtime
    pinned = impl_.resolve(replace(config.impl, precision=saved), config.arch,
                           documents=config.data.document_masking)
    pinned.device = runtime.device
    say(f"precision {saved}, as {found.name} was trained (impl.precision=auto would choose {runtime.precision} "
        "here): a resumed run keeps its precision", flush=True)
    return pinned


@dataclass
class Pretraining:
    """One pretraining run and every part it holds, from `build` to `save`: what each stage makes, the next one
    reads here (pretrain() reads the stages: build, resume, fit, save)."""

    config: PretrainConfig  # with train.init_from's tokenizer, where it names one
    run_dir: Path
    runtime: impl_.Runtime
    engine: engines.Engine
    say: Callable  # print on rank 0, quiet elsewhere
    found: Path | None  # the step folder train.resume found, or None
    folder: Path  # the prepared data and its meta
    meta: dict
    tokenizer: object
    run: Run  # the model, optimizer, grad scaler, objective and step model (cramming/run.py)
    averaging: object | None  # train.averaging's weight average (EMA, LAWA), or None
    checkpointer: Checkpointer
    state: TrainState = field(default_factory=TrainState)
    resumed_from: Path | None = None
    seconds: dict = field(default_factory=dict)  # setup and evaluation wall seconds, for the summary
    validation: PeriodicHeldout | None = None
    energy: EnergyMeter | None = None
    measure: Callable | None = None  # the held-out loss and accuracy of the current weights

    @classmethod
    def build(cls, config: PretrainConfig, run_dir: Path, runtime, engine) -> "Pretraining":
        """Everything before the first step: the step to resume (found and checked before any work, its
        precision kept), train.init_from's source, the prepared data, the model and its optimizer, the weight
        average, the checkpointer."""
        say = print if engine.main else quiet
        if engine.main:
            run_dir.mkdir(parents=True, exist_ok=True)
        runtime.device = engine.device(runtime.device)
        # AdamW's second moments decay into the denormal range, which x86 CPUs handle in slow microcode.
        torch.set_flush_denormal(True)
        # Before any work: train.resume's folder exists, is whole, loads as plain data and fits this run; auto's
        # sibling run folders are read (and any that cannot be, skipped and said so).
        found = engine.broadcast(find_resume(config.train.resume, run_dir, config) if engine.main else None)
        runtime = pin_precision(config, runtime, found, say)
        source = open_source(config.train.init_from, config.train.trust_remote_code) if config.train.init_from \
            else None
        if source is not None:  # the run reads its text with the source's tokenizer
            config = with_source_tokenizer(config, source, config.data.cache_dir)
        folder, meta = prepare(config, engine)
        tokenizer = load_tokenizer(folder)
        run = build_run(config, meta, runtime, engine, tokenizer, source, say)
        averaging = build_averaging(config.train, engine.unwrap(run.model))  # before the microbatch probe: EMA's memory
        checkpointer = Checkpointer(run_dir, config.train.checkpoint_every_minutes, config.train.keep_checkpoints,
                                    json.loads(json.dumps(asdict(config))), engine, averaging, runtime.precision)
        checkpointer.tokenizer = tokenizer if engine.main else None
        return cls(config, run_dir, runtime, engine, say, found, folder, meta, tokenizer, run, averaging, checkpointer)

    def resume(self) -> None:
        """The found step's weights, optimizer, average and trainer state (its metrics carried over), or a fresh
        TrainState."""
        if self.found is None:
            return
        run = self.run
        self.state = load_checkpoint(self.found, run.model, run.optimizer, run.scaler, self.engine, self.averaging)
        self.resumed_from = self.found
        if self.engine.main:
            carry_metrics(self.found, self.run_dir, self.state.step)
        self.say(f"resuming from {self.found}: step {self.state.step}, {self.state.elapsed / 60:.1f} min of the "
                 "budget spent", flush=True)

    def fit(self, stop, setup_start: float) -> tuple[dict, dict]:
        """The budget loop from where the state is, then the final validation: (its result, the final metrics).
        Before it, the microbatch, the data stream from the state's position and the loss before the first step."""
        config, runtime, engine, run = self.config, self.runtime, self.engine, self.run
        microbatch = choose_microbatch(config, run.model, self.meta, runtime, engine, self.say)
        batches = train_batches(self.folder, self.meta, config.data.ordering, config.seed, microbatch * engine.world,
                                config.impl.num_workers, pin_memory=runtime.device.type == "cuda",
                                start=self.state.sequences, world=engine.world,
                                block=block_rows(stage_factors(config.train.seq_schedule, self.meta["seq_length"])))
        self.seconds["setup"] = time.time() - setup_start
        self.measure = functools.partial(heldout_metrics, engine.unwrap(run.model), run.objective, self.folder,
                                         self.meta, config.train, microbatch, runtime.device,
                                         runtime.autocast())  # every rank, all rows (FSDP2)
        started = time.time()
        start = measure_untrained(config, self.state, self.measure, self.save_step, self.say,
                                  resumed=self.resumed_from is not None)
        self.seconds["eval"] = time.time() - started
        log = MetricsLog.for_run(self.run_dir, config) if engine.main else SilentLog()
        every = config.train.validate_every_minutes
        self.validation = PeriodicHeldout(every, self.measure, config.train.target_loss) if every else None
        self.energy = EnergyMeter.for_device(runtime.device, engine.local_rank)
        parts = Parts(model=run.step_model, optimizer=run.optimizer, scaler=run.scaler, engine=engine,
                      objective=run.objective, masks=PositionalMasks(config.seed, runtime.device), batches=batches,
                      checkpointer=self.checkpointer, log=log)
        hooks = [h for h in (self.energy, self.averaging, self.validation) if h is not None]
        trainer = Trainer(parts=parts, cfg=config.train, budget=Budget(config.budget * 3600, config.train.max_steps),
                          microbatch=microbatch, seq_length=self.meta["seq_length"], device=runtime.device,
                          autocast=runtime.autocast(), hooks=hooks)
        result, final, validating = fit(trainer, self.state, self.measure, log, self.validation, self.say, start,
                                        stop)
        self.seconds["eval"] += validating
        return result, final

    def save_step(self) -> None:
        """A step folder of the current weights (a non-finite policy's restore point)."""
        self.checkpointer.save(self.run.model, self.run.optimizer, self.run.scaler, self.state)

    def save(self, result: dict, final: dict) -> dict:
        """The weight average measured, train_summary.json, and the final checkpoint (and the averaged weights'
        beside it), written on rank 0 (every rank takes part in gathering the weights). Returns the summary."""
        engine, averaging = self.engine, self.averaging
        rebuild = functools.partial(load_whole, config=self.config, meta=self.meta, runtime=self.runtime)
        started = time.time()
        averaged = average_final(averaging, self.state.step, self.run.model, engine, self.measure, rebuild) \
            if averaging else None
        self.seconds["eval"] += time.time() - started
        summary = train_summary(self, result, final)
        summary["averaging"] = averaging_summary(averaging, averaged, final, self.run_dir,
                                                 self.config.sweep_objective, self.say)
        final_model = engine.whole_model(self.run.model, rebuild)
        if engine.main:
            if averaged:
                save_checkpoint(averaged[1], self.tokenizer, summary, self.run_dir, averaging.folder)
            save_final(final_model, self.tokenizer, summary, self.run_dir, self.runtime, engine)
        engine.barrier()
        return summary



def measure_untrained(config: PretrainConfig, state, measure, checkpoint, say, resumed: bool = False) -> str:
    """The held-out loss before the first step (a resumed run has it already); a non-finite policy that restores
    the last checkpoint gets one of the starting weights. Prints it, named by start_names; returns the short name
    for the final line."""
    carried = bool(state.untrained)  # a resumed run's, measured by its first launch
    if not carried:
        state.untrained = measure()
        if NONFINITE.trait(config.train.nonfinite, "checkpoint_first"):
            checkpoint()
    line, short = start_names(config, resumed, carried)
    say(line.format(loss=f"{state.untrained['val_loss']:.4f}"), flush=True)
    return short


def start_names(config: PretrainConfig, resumed: bool, carried: bool) -> tuple[str, str]:
    """What the loss before the first step is, as its own line and as the final line's short name: "untrained"
    only for a fresh run; with train.init_from, the loaded weights' loss; a resumed run carries over the value its
    first launch measured before step 1 (train_summary.json keeps it as untrained_val_loss in every case)."""
    if resumed and not carried:  # a checkpoint that kept no such value: measured on the resumed weights
        return "validation loss of the resumed weights {loss} (the checkpoint kept none from before step 1)", \
            "resumed weights"
    if config.train.init_from:
        again = " (measured before the run's first step, carried over by the resume)" if resumed else ""
        return f"validation loss of the init_from weights {{loss}}{again}", "init_from weights"
    if resumed:
        return ("validation loss before the run's first step {loss} (measured then, carried over by the resume)",
                "before the first step")
    return "untrained validation loss {loss}", "untrained"


def fit(trainer, state, measure, log, validation, say, start: str = "untrained", stop=None) -> tuple[dict, dict, float]:
    """The budget loop, then the final validation: its result, the final metrics and the seconds validating.
    start: what the loss before the first step is (start_names); stop: the StopFlag held over both."""
    try:
        result = {**trainer.fit(state, stop), "microbatch": trainer.microbatch}
        started = time.time()
        final = measure()
        seconds = time.time() - started + (validation.seconds if validation else 0.0)
        log.log({"step": result["steps"], **final})
    finally:
        log.close()
    if trainer.ended:
        say(f"target reached: {trainer.ended}", flush=True)
    say(f"validation loss {final['val_loss']:.4f} ({start} {state.untrained['val_loss']:.4f}), "
        f"accuracy {final['val_accuracy']:.3f}, {result['steps']} steps, {result['tokens']:,} tokens", flush=True)
    return result, final, seconds


def save_final(model, tokenizer, summary: dict, run_dir: Path, runtime, engine) -> None:
    path = save_checkpoint(model, tokenizer, summary, run_dir)
    summary["checkpoint"] = str(path)
    write_atomic(run_dir / "train_summary.json", json.dumps(summary, indent=2))
    if summary["mfu"] is not None:
        peak = runtime.peak_flops() * engine.world
        print(f"model FLOP utilisation {100 * summary['mfu']:.1f} % of {peak / 1e12:.0f} TFLOP/s", flush=True)
    print(f"checkpoint: {path}", flush=True)


def load_whole(weights: dict, config, meta, runtime):
    whole = build_model(config.arch, meta["vocab_size"], meta["special_ids"], runtime)
    whole.load_state_dict(weights)
    return whole


def carry_metrics(checkpoint: Path, run_dir: Path, step: int) -> None:
    """Resuming from another launch's folder: copy its metrics up to the checkpoint, so one log tells the run."""
    source = Path(checkpoint).parents[1] / "metrics.jsonl"
    target = Path(run_dir) / "metrics.jsonl"
    if leads_outside(source.parent, source):  # another run's folder is data: a link out of it is not read
        print(f"not carrying over {source}: a link leading outside its run folder", flush=True)
        source = target
    if source.resolve() == target.resolve() or not source.is_file():
        source = target  # same folder: drop what was logged after the checkpoint
    if not source.is_file():
        return
    kept = [line for line in whole_lines(source) if json.loads(line).get("step", 0) <= step]  # whole: each an object
    write_atomic(target, "".join(line + "\n" for line in kept))
