"""The checkpoint eval.py evaluates, found and checked whole before any task is read (docs/security.md).

A checkpoint may come from anyone, so everything it says is checked before anything is built from it: it is a
model folder (not a step folder); its files lie inside it (links and index entries leading out are refused); its
weights were written whole; its code is ours, in-library, or allowed (find_checkpoint: model_code.py); its
tokenizer files are of a tokenizer's size; the sizes its config.json gives match its weights' tensors, and the
weights fit in memory; its tokenizer's ids fit the embedding table.
"""

from pathlib import Path

from transformers import AutoTokenizer

from ..checkpoints.model_folder import SUMMARY, check_sizes, check_weights, is_complete
from ..checkpoints.step_folder import MARKER as RESUME_MARKER
from ..errors import UserError
from ..hub import bounds, model_folder, refuse_foreign_code
from ..model_code import foreign_code
from ..run_folder import name_problem
from ..untrusted import check_tokenizer_files, leads_outside, link_outside, read_json
from .config import EvalRunConfig
from .exported import read_back
from .finetune import Checkpoint, load_config


def find_checkpoint(config: EvalRunConfig) -> Checkpoint:
    """checkpoint=<folder or hub id> (a hub model is downloaded, or found in the hub cache offline), or the newest
    complete checkpoint of run `name` (by finish time). Code that came with it and is not ours was refused here
    unless allowed; only then is it the code that loads (Checkpoint.remote_code)."""
    folder = newest_run_checkpoint(config) if not config.checkpoint else \
        model_folder("checkpoint", config.checkpoint, config.eval.trust_remote_code, "eval.trust_remote_code")
    return Checkpoint(folder, remote_code=config.eval.trust_remote_code and
                      foreign_code(folder, bounds(folder)) is not None)


def newest_run_checkpoint(config: EvalRunConfig) -> Path:
    if problem := name_problem(config.name):
        raise UserError(problem)
    runs = Path(config.runs_dir).expanduser()
    found = list(runs.glob(f"{config.name}/*/checkpoint")) + list(runs.glob(f"{config.name}/*/*/checkpoint"))
    candidates = [p for p in found if is_complete(p) and not leads_outside(runs, p)]  # a link out is no run of ours
    if not candidates:
        raise UserError(f"name={config.name!r}: no complete checkpoint under {runs}/{config.name}/ "
                        "(a run still training or stopped early has none); pass checkpoint=<folder>")
    newest = max(candidates, key=finished_at).resolve()
    if not config.eval.trust_remote_code:
        refuse_foreign_code("name", config.name, newest, "eval.trust_remote_code")
    return newest


def finished_at(checkpoint: Path) -> str:
    """When a run folder's checkpoint was finished, from its train_summary.json ("" when that is unreadable)."""
    try:
        summary = read_json(checkpoint / SUMMARY, what=SUMMARY)
    except (OSError, UserError):
        return ""
    found = summary.get("finished_at") if isinstance(summary, dict) else None
    return found if isinstance(found, str) else ""


def check_checkpoint(checkpoint: Checkpoint | Path):
    """A usable checkpoint: a model folder whose files lie inside it, with whole weights, a config whose sizes are
    its weights', and a tokenizer whose ids fit the model's embedding table. Returns (tokenizer, config)."""
    checkpoint = Checkpoint.of(checkpoint)
    path = checkpoint.path
    if (path / RESUME_MARKER).is_file() and (path / "state.pt").is_file():
        raise UserError(f"checkpoint {path} is a step folder (a resume point of a run), not a model folder; make "
                        f"it one with `python -m cramming.export {path}` and evaluate the folder that prints")
    if not (path / "config.json").is_file():
        raise UserError(f"checkpoint {path} has no config.json: not a model folder")
    if not any((path / f).is_file() for f in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")):
        raise UserError(f"checkpoint {path} has no weights (model.safetensors): incomplete or still being written")
    limit = bounds(path)
    if (link := link_outside(limit)) is not None:
        raise UserError(f"checkpoint {path}: {link} is a link leading outside it; a checkpoint's files must lie "
                        "inside it, so it was not read (replace the link by a copy of the file)")
    tensors = check_weights(path, limit)
    check_tokenizer_files(path)
    try:
        model_config = load_config(checkpoint)
        tokenizer = AutoTokenizer.from_pretrained(path, config=model_config, trust_remote_code=checkpoint.remote_code)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001  a folder's config and tokenizer fail to load in many types; each one line
        raise UserError(f"checkpoint {path} could not be loaded: {type(err).__name__}: "
                        f"{next((s for s in str(err).splitlines() if s.strip()), '')[:300]}") from None
    check_sizes(path, model_config, tensors, checkpoint.remote_code, "evaluate it on a machine with more memory",
                copies=4)
    if (back := read_back(checkpoint, checkpoint.saved_config())) is not None:  # an export of ours: as the original
        checkpoint.pinned, checkpoint.imported = back
        model_config = load_config(checkpoint)
    largest = max([*tokenizer.get_vocab().values(), len(tokenizer) - 1])
    if largest >= model_config.vocab_size:
        raise UserError(f"checkpoint {path}: the tokenizer gives token ids up to {largest:,} but the model has only "
                        f"{model_config.vocab_size:,} embeddings; the tokenizer does not belong to this model")
    if tokenizer.pad_token_id is None:
        raise UserError(f"checkpoint {path}: the tokenizer has no padding token")
    return tokenizer, model_config
