"""The final checkpoint: a Hugging Face model folder that loads without cramming installed.

Written to `checkpoint.tmp/` and renamed to `checkpoint/` only when complete, with train_summary.json
written last inside it, so a folder named `checkpoint` is always whole.
"""

import json
import os
import shutil
from pathlib import Path

from ..model import AUTO_MAP

SUMMARY = "train_summary.json"


def save_checkpoint(model, tokenizer, summary: dict, run_dir: Path) -> Path:
    final = run_dir / "checkpoint"
    tmp = run_dir / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    model.config.auto_map = dict(AUTO_MAP)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    with open(tmp / SUMMARY, "w") as fh:
        json.dump(summary, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final.resolve()


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / SUMMARY).is_file() and (checkpoint / "model.safetensors").is_file()
