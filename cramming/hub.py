"""The Hugging Face hub, as the options that take a folder or a hub id see it (train.init_from, eval.py's
checkpoint, data sources and tasks on the hub).

Whether the hub can be asked is decided before the first request (`offline_reason`): offline, the hub client
retries each request for about 40 s, logging every retry. A model id becomes a local folder (`model_folder`); its
model code is fetched and allowed only when it is ours or the user allows it (model_code.py).
"""

import functools
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

from .errors import UserError
from .model_code import closure, foreign_code, is_ours, named_modules, shipped_names

# What a model folder needs: its config, weights and tokenizer (not other frameworks' weights, nor ONNX exports).
# Code (*.py) only when it will be allowed to run.
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.md"]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
PROBE_SECONDS = 3.0


def offline_flag() -> str | None:
    """The first of the Hugging Face offline variables that is set true, or None."""
    return next((v for v in OFFLINE_VARIABLES if os.environ.get(v, "").upper() in TRUE_VALUES), None)


def offline_reason() -> str | None:
    """Why the hub cannot be asked, or None."""
    flag = offline_flag()
    return f"{flag}=1 is set" if flag else _probe(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))


@functools.cache
def _probe(endpoint: str) -> str | None:
    """One connection attempt per run, a few seconds at most: why the endpoint cannot be reached, or None."""
    url = urlsplit(endpoint)
    host, port = url.hostname or endpoint, url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except OSError as err:
        return f"cannot connect to {host}:{port} ({err.strerror or type(err).__name__})"
    return None


class HubUnreachable(UserError):
    """The hub could not serve a task's data: the same is then true of every other task in this run."""

    def __init__(self, task: str, reason: str):
        self.reason = reason  # without the task's name, so a run with many tasks can say it once
        super().__init__(f"{task}: {reason}")


def hub_dataset(task: str, dataset: str, config: str | None = None, *, fix: str, **kwargs):
    """The one way a task reads the hub: datasets.load_dataset(dataset, config, **kwargs), offline from the datasets
    cache, else HubUnreachable naming `fix` (what to pass instead). Datasets 4+ runs no loading scripts; a script
    dataset is read from the hub's parquet conversion of it."""
    reason, cached = offline_reason(), in_datasets_cache(dataset, config)
    if reason and not (cached and offline_flag()):  # offline mode reads the cache; else nothing could answer
        hint = ", or set HF_HUB_OFFLINE=1 to use its cached copy" if cached else ""
        raise HubUnreachable(task, f"the hub dataset {dataset!r} is unreachable ({reason})"
                             f"{'' if cached else ' and not in the datasets cache'}; pass {fix}{hint}")
    try:
        from datasets import load_dataset  # about 1 s to import: only when something is read from the hub

        try:
            return load_dataset(dataset, config, **kwargs)
        except RuntimeError as err:
            if "scripts are no longer supported" not in str(err):
                raise
            return load_dataset(dataset, config, revision="refs/convert/parquet", **kwargs)
    except Exception as err:  # noqa: BLE001  datasets fails in many types; each means the same here
        detail = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
        raise HubUnreachable(task, f"the hub dataset {dataset!r} is unreachable ({detail}); offline, pass {fix}"
                             ) from None


def in_datasets_cache(dataset: str, config: str | None) -> bool:
    """Whether the datasets cache holds this dataset (its `config`, or any when None): what load_dataset reads
    offline."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    cache = Path(os.environ.get("HF_DATASETS_CACHE", os.path.join(home, "datasets"))).expanduser()
    return any(p.is_dir() for p in (cache / dataset.replace("/", "___")).glob(f"{config or '*'}/*/*"))


def model_folder(key: str, value: str, allow_code: bool = False, allow_key: str = "eval.trust_remote_code") -> Path:
    """`value` as a local folder, else as a hub model id (downloaded, or found in the hub cache). Code that came
    with it and is not ours is refused, unless `allow_code` (the option `allow_key`)."""
    path = Path(value).expanduser()
    if path.is_dir():
        folder = path.resolve()
    elif path.exists() or not REPO_ID.match(value) or value.endswith((".", "-")) or "--" in value or ".." in value:
        raise UserError(f"{key}={value!r}: no such folder (nor a Hugging Face hub model id); give a model folder "
                        "or an id such as bert-base-uncased")
    else:
        folder = _from_hub(key, value, allow_code, allow_key)
    if not allow_code:
        refuse_foreign_code(key, value, folder, allow_key)
    return folder


def refuse_foreign_code(key: str, value, folder: Path, allow_key: str) -> None:
    """One line, before anything is imported, when loading `folder` would run code that is not ours."""
    name = foreign_code(folder, bounds(folder))
    if name is None:
        return
    where = folder / name
    what = (f"loading it would run {where}, model code that is not this cramming's own" if where.is_file() else
            f"its config names model code ({name}) that is not this cramming's own, nor in {folder}")
    raise UserError(f"{key}={value!r}: {what}; if you trust where it came from, allow it with {allow_key}=true")


def _from_hub(key: str, value: str, allow_code: bool, allow_key: str) -> Path:
    """The snapshot folder of a hub model: config, weights and tokenizer, and its code when that is allowed."""
    reason = offline_reason()
    folder = _download(key, value, MODEL_FILES, reason)
    modules = named_modules(folder, bounds(folder))
    if not modules:
        return folder
    if allow_code:
        _download(key, value, ["*.py"], reason)
    elif all(f"{module}.py" in shipped_names() for module in modules):
        # Our modules' files as this repository holds them: each file fetched names the next by its relative imports
        # (read as text), and each is fetched only when the hub lists a version of ours under its name.
        tried = set()
        while more := [name for name in closure(folder, modules, bounds(folder))[0] if name not in tried]:
            _fetch_ours(key, value, more, allow_key, reason)
            tried |= set(more)
    return folder


def _fetch_ours(key: str, value: str, files: list[str], allow_key: str, reason: str | None) -> None:
    """Download these code files of a hub model when the hub lists a version of ours under each name (variants.py
    aside: a checkpoint's own is checked by its content once fetched, model_code.is_ours). Offline: from the hub
    cache, if they are there."""
    listed = [name for name in files if name != "variants.py"]
    if reason is None and not _ours_on_hub(key, value, listed):
        raise UserError(f"{key}={value!r}: its model code on the hub is not this cramming's own; if you trust "
                        f"where it came from, allow it with {allow_key}=true")
    try:
        _download(key, value, files, reason)
    except UserError:
        pass  # refuse_foreign_code names the file that is missing


def _ours_on_hub(key: str, value: str, files: list[str]) -> bool:
    """Whether the hub holds a version of our code under each of these names (model_code.shipped), from the ids it
    lists for each file: nothing fetched."""
    try:
        info = huggingface_hub.HfApi().model_info(value, files_metadata=True)
        listed = {f.rfilename: f.blob_id for f in info.siblings or []}
    except (OSError, ValueError) as err:
        raise UserError(f"{key}={value!r}: listing its files on the Hugging Face hub failed "
                        f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})") from None
    return all(name in listed and is_ours(name, None, listed[name]) for name in files)


def hub_cache() -> Path:
    """The folder huggingface_hub keeps its downloads in (HF_HUB_CACHE, HF_HOME, ...): never written by us."""
    return Path(huggingface_hub.constants.HF_HUB_CACHE).expanduser().resolve()


def in_hub_cache(folder: Path) -> bool:
    return Path(folder).absolute().is_relative_to(hub_cache()) or Path(folder).resolve().is_relative_to(hub_cache())


def bounds(folder: Path) -> Path:
    """The folder a model folder's files must lie in: the folder itself, or for a hub snapshot (whose files are links
    to the repository's blobs) the repository's folder in the hub cache."""
    folder = Path(folder).resolve()
    if in_hub_cache(folder):
        for parent in [folder, *folder.parents]:
            if parent.name.startswith(("models--", "datasets--")) and parent.parent == hub_cache():
                return parent
    return folder


def _download(key: str, value: str, patterns: list[str], reason: str | None) -> Path:
    try:
        return Path(huggingface_hub.snapshot_download(value, allow_patterns=patterns,
                                                      local_files_only=reason is not None))
    except LocalEntryNotFoundError:
        raise UserError(f"{key}={value!r}: not a local folder, and the Hugging Face hub is unreachable "
                        f"({reason or 'no connection'}) and the model is not in its cache; download it while "
                        "online, or give a folder") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise UserError(f"{key}={value!r}: no such folder, and no such model on the Hugging Face hub (or it is "
                        "private or gated: log in with `hf auth login`)") from None
    except (OSError, ValueError) as err:  # the hub's HTTP errors are OSErrors too
        raise UserError(f"{key}={value!r}: not a local folder, and fetching it from the Hugging Face hub failed "
                        f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})") from None
