"""python -m cramming.push <checkpoint folder> <repo id> [--private]: share a checkpoint on the Hugging Face hub,
its model card (README.md) included. Uploads with huggingface_hub (log in first: `hf auth login`, or HF_TOKEN)."""

import argparse
import sys
from pathlib import Path

import huggingface_hub
from huggingface_hub.errors import HfHubHTTPError

from .card import CARD
from .checkpoints.model_folder import is_complete
from .errors import UserError, exit_on_user_error
from .untrusted import refuse_links_outside


def check_folder(folder: Path) -> Path:
    """Only a whole checkpoint with its card goes up: a half-written one would be a broken model on the hub."""
    if not folder.is_dir():
        raise UserError(f"checkpoint {str(folder)!r}: no such folder")
    if folder.name.endswith(".tmp") or not is_complete(folder):
        raise UserError(f"checkpoint {folder} is not a complete checkpoint (model.safetensors and train_summary.json); "
                        "push a run's checkpoint/ folder (a checkpoints/step-<n> folder is for resuming)")
    if not (folder / CARD).is_file():
        raise UserError(f"checkpoint {folder} has no {CARD} model card (written before cards existed); re-save it or "
                        "add one")
    refuse_links_outside(folder, "push uploads")  # a link would upload whatever it points to
    return folder.resolve()


def push(folder: Path, repo_id: str, private: bool = False) -> str:
    """Create the model repository (if needed) and upload the folder; returns the repository's URL."""
    folder = check_folder(Path(folder).expanduser())
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UserError(f"repo id {repo_id!r} is invalid: give <user or organisation>/<model name>")
    api = huggingface_hub.HfApi()
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                          commit_message=f"Upload {folder.parent.name}/{folder.name} with cramming")
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise UserError(f"pushing to {repo_id!r} failed: {(str(err).splitlines() or [''])[0][:200]} "
                        "(log in with `hf auth login` or set HF_TOKEN; online only)") from None
    return str(url)


@exit_on_user_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cramming.push", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a run's checkpoint/ folder (or final-ema/, final-lawa/)")
    parser.add_argument("repo_id", help="<user or organisation>/<model name> on the Hugging Face hub")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    args = parser.parse_args(argv)
    print(f"pushed: {push(args.checkpoint, args.repo_id, args.private)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
