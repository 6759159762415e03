"""An intermediate checkpoint as a Hugging Face model folder, so training dynamics can be studied without this
package: `python -m cramming.export <run>/checkpoints/step-<n> [<out>]` writes what a run's `checkpoint/` holds
(the weights, config.json with its auto_map, the model code, the tokenizer and a model card) to `<out>`, by
default `<run>/exported/step-<n>/`. Step folders are resume points: their config.json is the run's config, read by
train.resume, so they stay as they are and the export is a folder of its own. `<out>` must be new, empty or an
earlier export (a model folder cramming wrote); anything else is refused and left as it is (docs/security.md).
`python -m cramming.export --onnx <model or step folder> [<out.onnx>]` writes an ONNX graph instead (export_onnx.py)."""

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .checkpoints.model_folder import save_checkpoint
from .checkpoints.step_folder import MARKER
from .data.tokenizer import read_tokenizer
from .errors import UserError, exit_on_user_error
from .export_families import export_as, fits_lines
from .export_onnx import TOLERANCE, export_onnx
from .families import FAMILIES
from .families import TOLERANCE as FAMILIES_TOLERANCE
from .impl import Runtime
from .model.arch import ArchConfig
from .run import build_model, count_parameters
from .train.checkpointing import read_step
from .untrusted import plain_data


def output_problem(step: Path, out: Path) -> str | None:
    """Where an export may not go: the current folder (or one holding it), or inside the step folder it reads."""
    out = out.absolute()
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        return f"{out} is the current folder or holds it; give a new folder to export into"
    if out.resolve().is_relative_to(step.resolve()):
        return f"{out} lies inside the step folder {step}, which is read, never written; give a folder outside it"
    return None


def saved_arch(config: dict, where: Path) -> ArchConfig:
    """The step's model options as plain data onto the schema: never an interpolation resolved from the environment,
    and an option this cramming does not know (a newer one wrote the step) is one line."""
    plain_data(config.get("arch"), f"{where} config arch")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ArchConfig), config["arch"]))
    except (KeyError, TypeError, ValueError, OmegaConfBaseException) as err:
        key = getattr(err, "full_key", None) or (str(err).splitlines() or [""])[0][:200]
        raise UserError(f"{where}: its model options are not ones this cramming reads ({key}); a newer cramming "
                        "may have written it: export it with that version") from None


def export_step(step: Path, out: Path | None = None) -> Path:
    """Write the step folder `step` as a model folder (default <run>/exported/<step name>); returns it."""
    step = Path(step)
    out = Path(out) if out is not None else step.parent.parent / "exported" / step.name
    if problem := output_problem(step, out):
        raise UserError(problem)
    model, tokenizer, summary = step_model(step)
    return save_checkpoint(model, tokenizer, summary, out.absolute().parent, out.absolute().name)


def step_model(step: Path):
    """(the model a step folder holds, its tokenizer, the train summary of a checkpoint at that step)."""
    saved, config = read_step(step)
    arch = saved_arch(config, step / "state.pt")
    tokenizer = read_tokenizer(step / "tokenizer", f"step folder {step}")
    special = {"pad": tokenizer.pad_token_id, "cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
               "mask": tokenizer.mask_token_id}
    model = build_model(arch, len(tokenizer), special, Runtime(torch.device("cpu"), "fp32", False))
    try:
        model.load_state_dict(saved["model"])
    except (RuntimeError, TypeError, AttributeError) as err:
        detail = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line or "Missing" in line
                       or "Unexpected" in line), (str(err).splitlines() or [""])[0])
        raise UserError(f"{step / 'state.pt'}: its weights do not fit the model its config describes "
                        f"({detail[:300]}); not a step folder cramming wrote") from None
    state = saved["state"]
    summary = {"name": config["name"], "budget_hours": config["budget"], "config": config,
               "data": {"vocab_size": len(tokenizer)}, "parameters": count_parameters(model),
               "tokens": state["tokens"], "steps": state["step"], "intermediate_step": state["step"],
               "elapsed_seconds": state["elapsed"], "val_loss": None,
               "untrained_val_loss": state["untrained"].get("val_loss", float("nan")),
               "init_from": config["train"].get("init_from"), "exported_from": str(step.resolve())}
    return model, tokenizer, summary


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
    parser.add_argument("--as", dest="family", choices=list(FAMILIES), help="write transformers' own architecture "
                        "(no remote code): " + ", ".join(f"{name} ({f.model_class})" for name, f in FAMILIES.items()))
    parser.add_argument("--families", action="store_true", help="say which families the checkpoint fits, or the "
                        "first option each cannot represent, and write nothing")
    args = parser.parse_args(argv)
    if sum([args.onnx, args.family is not None, args.families]) > 1:
        raise UserError("--onnx, --as and --families each ask for a different output: give one of them")
    if args.families:
        print("\n".join(fits_lines(args.folder, step_model)))
        return
    if args.family is not None:
        if args.out is not None and (problem := output_problem(args.folder, args.out)):
            raise UserError(problem)
        path, difference = export_as(args.folder, args.out, args.family, step_model)
        print(f"checked: {FAMILIES[args.family].model_class}'s logits within {difference:.1e} of ours (at most "
              f"{FAMILIES_TOLERANCE:g}) on a padded batch")
        print(f"exported: {path}")
        return
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
