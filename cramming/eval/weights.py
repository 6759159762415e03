"""Checks that a checkpoint's weights were written whole, before any work: a file cut short by a killed write
otherwise passes every other check and fails minutes later deep inside safetensors."""

import json
from pathlib import Path

from ..errors import UserError
from ..train.checkpoint import SUMMARY


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
