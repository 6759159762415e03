"""Which code a model folder runs when it is loaded, and whether that code is ours.

A folder whose config.json (or tokenizer_config.json) has an `auto_map` makes transformers import the Python files
it names, with their relative imports, under `trust_remote_code=True`. We load our own checkpoints that way, so
their code is allowed when it is byte for byte the code a save of this cramming writes (`ours()`): the files of
cramming/model/, with cramming/registry.py as registry.py. Any other code runs only when the user asks for it
(eval.trust_remote_code, train.trust_remote_code), as transformers itself asks. In-library models (BERT,
ModernBERT, ...) have no auto_map and run nothing from their folder.
"""

import functools
import hashlib
import json
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# The JSON files transformers reads an auto_map from when a model or its tokenizer is loaded.
CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


@functools.cache
def ours() -> dict[str, bytes]:
    """Every model file a save writes, by name: the package's model/*.py, and the registry itself in place of
    model/registry.py's re-export (registry.copy_into)."""
    files = {path.name: path.read_bytes() for path in (PACKAGE / "model").glob("*.py")}
    files["registry.py"] = (PACKAGE / "registry.py").read_bytes()
    return files


def blob_id(data: bytes) -> str:
    """git's id of a file's bytes, as the hub lists it for every file of a repository."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def named_modules(folder: Path) -> list[str]:
    """The modules the folder's auto_maps name, as written ("modeling_crammed", or "other/repo--module" for code
    that transformers fetches from another repository)."""
    modules = set()
    for name in CONFIG_FILES:
        path = Path(folder) / name
        try:
            auto_map = json.loads(path.read_text(encoding="utf-8")).get("auto_map") if path.is_file() else None
        except (OSError, ValueError, AttributeError):
            continue  # not ours to judge: loading it fails on its own terms, and runs nothing
        for value in (auto_map or {}).values():
            for reference in value if isinstance(value, list | tuple) else [value]:
                if isinstance(reference, str):  # a tokenizer's pair may hold None for its slow class
                    modules.add(reference.rsplit(".", 1)[0])
    return sorted(modules)


def our_closure(modules: list[str]) -> list[str] | None:
    """The files our own modules of these names import (relative imports, as transformers follows them), or None
    when a module is not one of ours."""
    from transformers.dynamic_module_utils import get_relative_import_files  # ~1 s: only for a folder naming code

    if not all(f"{module}.py" in ours() for module in modules):
        return None
    files = set()
    for module in modules:
        source = PACKAGE / "model" / f"{module}.py"
        files |= {f"{module}.py", *(Path(p).name for p in get_relative_import_files(str(source)))}
    return sorted(files)


def foreign_code(folder: Path) -> str | None:
    """The first file the folder would run that is not ours (or the reason it cannot be ours), or None when it runs
    none or only ours."""
    modules = named_modules(folder)
    if not modules:
        return None
    closure = our_closure(modules)
    if closure is None:
        return f"{next(m for m in modules if f'{m}.py' not in ours())}.py"
    for name in closure:
        path = Path(folder) / name
        if not path.is_file() or path.read_bytes() != ours()[name]:
            return name
    return None
