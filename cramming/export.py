"""An intermediate checkpoint as a Hugging Face model folder, so training dynamics can be studied without this
package: `python -m cramming.export <run>/checkpoints/step-<n> [<out>]` writes what a run's `checkpoint/` holds
(the weights, config.json with its auto_map, the model code, the tokenizer and a model card) to `<out>`, by
default `<run>/exported/step-<n>/`. Step folders are resume points: their config.json is the run's config, read by
train.resume, so they stay as they are and the export is a folder of its own.
`python -m cramming.export --onnx <model or step folder> [<out.onnx>]` writes an ONNX graph instead (export_onnx.py)."""

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerFast

from .errors import UserError, exit_on_user_error
from .export_onnx import TOLERANCE, export_onnx
from .impl import Runtime
from .model.arch import ArchConfig
from .renames import moved
from .run import build_model, count_parameters
from .train.checkpoint import save_checkpoint
from .train.resume import MARKER
from .train.state import load_saved


def export_step(step: Path, out: Path | None = None) -> Path:
    """Write the step folder `step` as a model folder (default <run>/exported/<step name>); returns it."""
    step = Path(step)
    if not (step / MARKER).is_file() or not (step / "state.pt").is_file():
        raise UserError(f"{step} is not a complete step folder (no {MARKER} and state.pt): give one of a run's "
                        "checkpoints/step-<n>/ folders")
    if not (step / "tokenizer").is_dir():
        raise UserError(f"{step} carries no tokenizer (written before step folders held one); the run's "
                        "checkpoint/ folder loads as it is")
    saved = load_saved(step / "state.pt")
    if "model" not in saved:
        raise UserError(f"{step} holds its weights in an engine's shards (FSDP2, DeepSpeed); resume the run "
                        "with one process (train.resume) and export a step it writes")
    config = moved(saved["config"])
    arch = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ArchConfig), config["arch"]))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(step / "tokenizer")
    special = {"pad": tokenizer.pad_token_id, "cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
               "mask": tokenizer.mask_token_id}
    model = build_model(arch, len(tokenizer), special, Runtime(torch.device("cpu"), "fp32", False))
    model.load_state_dict(saved["model"])
    state = saved["state"]
    summary = {"name": config["name"], "budget_hours": config["budget"], "config": config,
               "data": {"vocab_size": len(tokenizer)}, "parameters": count_parameters(model),
               "tokens": state["tokens"], "steps": state["step"], "intermediate_step": state["step"],
               "elapsed_seconds": state["elapsed"], "val_loss": None,
               "untrained_val_loss": state["untrained"].get("val_loss", float("nan")),
               "init_from": config["train"].get("init_from"), "exported_from": str(step.resolve())}
    out = Path(out) if out is not None else step.parent.parent / "exported" / step.name
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(model, tokenizer, summary, out.parent, out.name)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad arguments are one line and exit code 2, not argparse's usage block."""
        raise UserError(f"{message} (python -m cramming.export --help)")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python -m cramming.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a run's checkpoints/step-<n> folder (or, with --onnx, a model "
                        "folder: a run's checkpoint/ or an exported step)")
    parser.add_argument("out", type=Path, nargs="?", help="what to write: the model folder (default "
                        "<run>/exported/step-<n>), or with --onnx the .onnx file (default <model folder>/model.onnx)")
    parser.add_argument("--onnx", action="store_true", help="write an ONNX graph (torch.onnx's dynamo exporter, "
                        "dynamic batch and sequence, the attention mask an input), checked with onnxruntime")
    parser.add_argument("--trust-remote-code", action="store_true", help="--onnx: a folder whose model code is not "
                        "this cramming's own is exported with that code (it runs)")
    args = parser.parse_args(argv)
    if not args.onnx:
        print(f"exported: {export_step(args.folder, args.out)}")
        return
    folder = args.folder
    if (folder / MARKER).is_file():  # a step folder: its model folder first
        folder = export_step(folder)
        print(f"exported: {folder}")
    path, difference = export_onnx(folder, args.out, args.trust_remote_code)
    print("checked: onnxruntime not installed (pip install onnxruntime)" if difference is None else
          f"checked: onnxruntime's logits within {difference:.1e} of PyTorch's (at most {TOLERANCE:g}) on a padded "
          "batch of other shapes")
    print(f"onnx: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
