"""The final checkpoint: a Hugging Face model folder that loads without cramming installed.

Written to `checkpoint.tmp/` and renamed to `checkpoint/` only when complete, with train_summary.json
written last inside it, so a folder named `checkpoint` is always whole.
"""

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from ..card import write_card
from ..data.tokenizer import for_generation
from ..engines import Engine
from ..model import auto_map_of
from ..registry import copy_into

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
    copy_model_code(model.config.auto_map, tmp)
    if model.config.causal:  # prompts without a closing [SEP], decoded with their spaces
        tokenizer = for_generation(tokenizer)
    tokenizer.save_pretrained(tmp)
    write_card(tmp, summary)  # README.md: the model card the hub shows
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
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def copy_model_code(auto_map: dict, folder: Path) -> None:
    """The files of every module auto_map names, with their relative imports. save_pretrained copies only the saved
    class's module (modeling_crammed.py for an MLM), yet the folder also loads as the heads in heads.py."""
    from transformers.dynamic_module_utils import get_relative_import_files

    package = Path(__file__).resolve().parents[1] / "model"
    for module in sorted({name.split(".")[0] for name in auto_map.values()}):
        source = package / f"{module}.py"
        for path in [source, *get_relative_import_files(str(source))]:
            shutil.copyfile(path, folder / Path(path).name)
    copy_into(folder)  # the registry itself over the package's re-export of it: the folder needs no cramming


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / SUMMARY).is_file() and (checkpoint / "model.safetensors").is_file()
