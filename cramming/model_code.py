"""Which code a model folder would run when it is loaded, and whether that code is ours (docs/security.md).

transformers imports Python files from a model folder when a JSON file it reads there has an `auto_map` naming
a module (config.json, tokenizer_config.json, a processor's config, or a versioned config that config.json's
`configuration_files` names), with the module's relative imports, under `trust_remote_code=True`. `foreign_code`
reads every such JSON file of the folder and follows the relative imports of the modules named, from the folder's
own files (read as text, never imported), and names the first file that is not ours.

Ours means a version of cramming/model/ that cramming has saved into checkpoints: this installation's files and
every earlier version recorded in model_code_shipped.json (scripts/shipped_model_code.py), so a checkpoint written
by an older cramming stays ours. Our folders are then loaded with this package's own classes (registered with
transformers' Auto classes, `trust_remote_code=False`), so nothing in the folder is imported, even if it changes
after this check. Any other code runs only when the user asks for it (eval.trust_remote_code,
train.trust_remote_code), and then transformers imports it from the folder. In-library models (BERT,
ModernBERT, ...) have no auto_map and run nothing from their folder.
"""

import ast
import functools
import hashlib
import json
import re
from pathlib import Path

from .errors import UserError
from .untrusted import JSON_LIMIT, check_size, leads_outside, read_json

PACKAGE = Path(__file__).resolve().parent
SHIPPED = PACKAGE / "model_code_shipped.json"
CODE_LIMIT = 4 << 20  # one model file: ours are tens of kilobytes
# The two forms transformers follows (dynamic_module_utils.get_relative_imports): `from .x import y`, `import .x`.
RELATIVE_IMPORT = re.compile(r"^\s*(?:from\s+\.(\S+)\s+import|import\s+\.(\S+)\s*$)", flags=re.MULTILINE)


@functools.cache
def ours() -> dict[str, bytes]:
    """Every model file a save of this installation writes, by name: the package's model/*.py, and the registry
    itself in place of model/registry.py's re-export (registry.copy_into)."""
    files = {path.name: path.read_bytes() for path in (PACKAGE / "model").glob("*.py")}
    files["registry.py"] = (PACKAGE / "registry.py").read_bytes()
    return files


def blob_id(data: bytes) -> str:
    """git's id of a file's bytes, as the hub lists it for every file of a repository."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@functools.cache
def shipped() -> dict[str, frozenset[str]]:
    """Blob ids of every version of each model file cramming has saved: the record, and this installation's own."""
    record = json.loads(SHIPPED.read_text()) if SHIPPED.is_file() else {}
    for name, data in ours().items():
        record[name] = [*record.get(name, []), blob_id(data)]
    return {name: frozenset(ids) for name, ids in record.items()}


def shipped_names() -> frozenset[str]:
    return frozenset(shipped())


def is_ours(name: str, data: bytes | None, listed_id: str | None = None) -> bool:
    """Whether `data` (or the file the hub lists with `listed_id`) is a version of our model file `name`. A
    checkpoint's variants.py is written for its config (model/pretrained.py): it is ours when it holds nothing but
    a docstring and relative imports (imports_only), as the files it imports are then checked in their turn."""
    if name == "variants.py" and data is not None and imports_only(data):
        return True
    return (listed_id or blob_id(data)) in shipped().get(name, ())


def imports_only(data: bytes) -> bool:
    """Whether a Python file does nothing but import names from modules beside it: a docstring, then only
    `from .module import name` statements (no aliases, no star, no package-relative dots beyond one)."""
    try:
        tree = ast.parse(data.decode("utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return False
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return all(isinstance(node, ast.ImportFrom) and node.level == 1 and node.module and "." not in node.module
               and all(alias.asname is None and alias.name.isidentifier() for alias in node.names)
               for node in body)


# The JSON files transformers reads an auto_map from when a model, its tokenizer or its processor is loaded.
CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                "video_preprocessor_config.json", "feature_extractor_config.json", "image_processor_config.json")


def config_files(folder: Path, bounds: Path | None = None) -> list[Path]:
    """The JSON files transformers may read an auto_map from: those of CONFIG_FILES the folder holds, its versioned
    configs (config.<version>.json), and whatever config.json's `configuration_files` names (which must lie inside
    `bounds`: the folder, or a hub snapshot's repository, whose files are links to its blobs)."""
    folder = Path(folder)
    bounds = Path(bounds or folder)
    found = sorted({*(folder / name for name in CONFIG_FILES), *folder.glob("config.*.json")})
    found = [p for p in found if p.is_file()]
    for path in list(found):
        named = _json(path).get("configuration_files")
        for name in named if isinstance(named, list) else []:
            extra = folder / str(name)
            if Path(str(name)).is_absolute() or leads_outside(bounds, extra):
                raise UserError(f"{path} (configuration_files): {str(name)!r} leads outside {folder}; a folder's "
                                "files must lie inside it, so it was not read")
            if extra.is_file() and extra not in found:
                found.append(extra)
    return found


def _json(path: Path) -> dict:
    """A JSON file's object, or {} when it is none (not ours to judge: loading it fails on its own terms)."""
    try:
        check_size(path, JSON_LIMIT, "JSON file of a model folder")
        value = read_json(path)
    except UserError as err:
        if "larger than" in str(err):
            raise
        return {}
    return value if isinstance(value, dict) else {}


def _references(auto_map) -> list[str]:
    """The "module.Class" strings of an auto_map: a dict of Auto class -> reference (a tokenizer's: a [slow, fast]
    pair, either None), or the older list form of a tokenizer's pair."""
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map] if isinstance(auto_map, list) else []
    refs = []
    for value in values:
        refs += [r for r in (value if isinstance(value, list | tuple) else [value]) if isinstance(r, str)]
    return refs


def named_modules(folder: Path, bounds: Path | None = None) -> list[str]:
    """The modules the folder's auto_maps name, as written ("modeling_crammed", or "other/repo--module" for code
    that transformers fetches from another repository)."""
    modules = set()
    for path in config_files(folder, bounds):
        modules |= {ref.rsplit(".", 1)[0] for ref in _references(_json(path).get("auto_map"))}
    return sorted(modules)


def tokenizer_modules(folder: Path) -> list[str]:
    """The modules a tokenizer loaded from this folder would name: its tokenizer_config.json's auto_map (either
    form), and config.json's AutoTokenizer entry."""
    folder = Path(folder)
    refs = _references(_json(folder / "tokenizer_config.json").get("auto_map")) \
        if (folder / "tokenizer_config.json").is_file() else []
    auto_map = _json(folder / "config.json").get("auto_map") if (folder / "config.json").is_file() else None
    if isinstance(auto_map, dict):
        refs += _references({"AutoTokenizer": auto_map.get("AutoTokenizer")})
    return sorted({ref.rsplit(".", 1)[0] for ref in refs})


def closure(folder: Path, modules: list[str], bounds: Path | None = None) -> tuple[list[str], str | None]:
    """(the files the modules are and import relatively, as transformers follows them; the first one named that
    the folder does not hold, or leads outside `bounds`, or None). Read as text from the folder, never imported."""
    bounds = Path(bounds or folder)
    seen, missing, todo = [], None, [f"{m}.py" for m in modules]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.append(name)
        path = Path(folder) / name
        if "/" in name or "--" in name or not path.is_file() or leads_outside(bounds, path):
            missing = missing or name
            continue
        check_size(path, CODE_LIMIT, "model code file")
        text = path.read_bytes().decode("utf-8", errors="replace")
        todo += [f"{(a or b).replace('.', '/')}.py" for a, b in RELATIVE_IMPORT.findall(text)]
    return seen, missing


def foreign_code(folder: Path, bounds: Path | None = None) -> str | None:
    """The first file the folder would run that is not ours (or a module it names but does not hold), or None when
    it runs none or only ours. `bounds`: where its files may lie (a hub snapshot's repository; else the folder)."""
    modules = named_modules(folder, bounds)
    if not modules:
        return None
    files, missing = closure(folder, modules, bounds)
    for name in files:
        if name == missing:
            return name
        if not is_ours(name, (Path(folder) / name).read_bytes()):
            return name
    return None
