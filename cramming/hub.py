"""A Hugging Face hub model id -> a local folder, for the options that take a folder or a hub id
(train.init_from, eval.py's checkpoint). Offline, a model already in the hub cache is used as it is; one that is
not is one line saying the hub is unreachable, decided before any request (the hub client otherwise retries for
about 40 s, logging every retry)."""

import re
from pathlib import Path

from .errors import UserError

# What a model folder needs: its config, weights and tokenizer (not other frameworks' weights, nor ONNX exports).
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.py", "*.md"]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def model_folder(key: str, value: str) -> Path:
    """`value` as a local folder, else as a hub model id (downloaded, or found in the hub cache)."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists() or not REPO_ID.match(value) or value.endswith((".", "-")) or "--" in value or ".." in value:
        raise UserError(f"{key}={value!r}: no such folder (nor a Hugging Face hub model id); give a model folder "
                        "or an id such as bert-base-uncased")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    from .eval.tasks import offline_reason

    reason = offline_reason()
    try:
        return Path(snapshot_download(value, allow_patterns=MODEL_FILES, local_files_only=reason is not None))
    except LocalEntryNotFoundError:
        raise UserError(f"{key}={value!r}: not a local folder, and the Hugging Face hub is unreachable ({reason or 'no connection'}) "
                        "and the model is not in its cache; download it while online, or give a folder") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise UserError(f"{key}={value!r}: no such folder, and no such model on the Hugging Face hub (or it is "
                        "private or gated: log in with `hf auth login`)") from None
    except (OSError, ValueError) as err:  # the hub's HTTP errors are OSErrors too
        raise UserError(f"{key}={value!r}: not a local folder, and fetching it from the Hugging Face hub failed "
                        f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})") from None
