"""The final checkpoint: a Hugging Face model folder that loads without cramming installed.

Written to `checkpoint.tmp/` and renamed to `checkpoint/` only when complete, with train_summary.json
written last inside it, so a folder named `checkpoint` is always whole.
"""

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from transformers.utils import logging as hf_logging

from ..card import write_card
from ..data.tokenizer import for_generation
from ..engines import Engine
from ..errors import UserError
from ..model import auto_map_of

SUMMARY = "train_summary.json"
# The Triton kernels live in the cramming package, not in the model folder that checkpoints carry; a checkpoint
# names the PyTorch paths, which compute the same function everywhere. The fused loss travels, but returns no
# logits in training, which Hugging Face users expect: checkpoints name the plain loss.
PORTABLE_KERNELS = {"attention_impl": "sdpa", "rotary_impl": "torch", "loss_impl": "plain"}
RUN_ONLY = ("triton", "fused")


def save_checkpoint(model, tokenizer, summary: dict, run_dir: Path, name: str = "checkpoint") -> Path:
    """`name`: the folder, `checkpoint` for the last weights, `final-<kind>` for averaged ones (averaging.py)."""
    final = run_dir / name
    tmp = run_dir / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model = Engine.unwrap(model)
    model.config.auto_map = auto_map_of(model)  # the Auto classes this objective's checkpoint serves
    in_use = {key: getattr(model.config, key) for key in PORTABLE_KERNELS}
    try:
        for key, portable in PORTABLE_KERNELS.items():
            if in_use[key] in RUN_ONLY:
                setattr(model.config, key, portable)
        with no_shard_bar():
            model.save_pretrained(tmp, safe_serialization=True)
    finally:
        for key, value in in_use.items():
            setattr(model.config, key, value)
    if model.config.causal:  # prompts without a closing [SEP], decoded with their spaces
        tokenizer = for_generation(tokenizer)
    tokenizer.save_pretrained(tmp)
    write_card(tmp, summary, type(model))  # README.md: the model card the hub shows
    with open(tmp / SUMMARY, "w") as fh:
        json.dump(summary, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final.resolve()


@contextmanager
def no_shard_bar():
    """transformers draws a "Writing model shards" bar in every save_pretrained: for our one small shard, a bar of
    noise after every run. Off for our saves only; a user's setting is as it was after."""
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / SUMMARY).is_file() and (checkpoint / "model.safetensors").is_file()


# ---------------------------------------------------------------- written whole
# A checkpoint's weights must have been written whole, checked before any work: a file cut short by a killed write
# otherwise passes every other check and fails minutes later deep inside safetensors.


def check_safetensors(path: Path) -> None:
    """A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's byte range,
    then the data: the file must be exactly as long as the header's largest end offset says."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little") if size >= 8 else None
        if length is None or length > size - 8:
            raise UserError(f"{path}: cut short ({size:,} bytes, not even its header); the write was interrupted, "
                            "use a complete checkpoint")
        try:
            header = json.loads(fh.read(length))
            ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise UserError(f"{path}: not a safetensors file (its header is not a tensor table)") from None
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        problem = "cut short" if size < expected else "longer than its header says"
        raise UserError(f"{path}: {problem} ({size:,} bytes, its header describes {expected:,}); the write was "
                        "interrupted, use a complete checkpoint")


def check_weights(folder: Path) -> None:
    """Every safetensors file of the checkpoint (one, or the shards of an index) whole; the completion marker
    present where the writer uses one (pretraining's checkpoint.tmp/ folder gets train_summary.json last)."""
    if folder.name.endswith(".tmp") and not (folder / SUMMARY).is_file():
        raise UserError(f"checkpoint {folder} is an unfinished write (no {SUMMARY}, which pretraining writes last); "
                        "use the run's checkpoint/ folder")
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        try:
            files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (ValueError, TypeError, KeyError, AttributeError):
            raise UserError(f"{index}: not a safetensors index (no weight_map)") from None
    else:
        return  # pytorch_model.bin: a pickle, loaded by torch as it is
    for path in files:
        if not path.is_file():
            raise UserError(f"{path}: missing (named in {index.name}); the checkpoint is incomplete")
        check_safetensors(path)
