"""Record the model code every commit of cramming would have saved into its checkpoints, so that a checkpoint written
by any earlier version still counts as ours (cramming/model_code.py: `shipped`) and loads without an opt-in.

    python scripts/shipped_model_code.py          # add this checkout's history and files to the record

A save writes cramming/model/*.py into the model folder, and cramming/registry.py as its registry.py (before that
file existed, model/registry.py was the registry itself). For each commit that touched those files, each file's
git blob id (what the hub lists, model_code.blob_id) is added under its name in cramming/model_code_shipped.json.
Entries are only ever added: a version once shipped stays ours. tests/test_loading_safety.py fails while this
installation's own model code is missing from the record, so run this after changing cramming/model/.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cramming.model_code import SHIPPED, blob_id, ours  # noqa: E402


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def versions_in_history() -> dict[str, set[str]]:
    """name -> blob ids of cramming/model/*.py and cramming/registry.py at every commit that changed them."""
    found: dict[str, set[str]] = {}
    for commit in git("log", "--format=%H", "--", "cramming/model", "cramming/registry.py").split():
        for line in git("ls-tree", commit, "cramming/model/", "cramming/registry.py").splitlines():
            _, kind, blob, path = line.split(maxsplit=3)
            name = Path(path).name
            if kind == "blob" and name.endswith(".py"):
                found.setdefault(name, set()).add(blob)
    return found


def main() -> None:
    record = {name: set(ids) for name, ids in json.loads(SHIPPED.read_text()).items()} if SHIPPED.is_file() else {}
    for name, ids in versions_in_history().items():
        record.setdefault(name, set()).update(ids)
    for name, data in ours().items():  # this checkout's files, committed or not
        record.setdefault(name, set()).add(blob_id(data))
    SHIPPED.write_text(json.dumps({name: sorted(ids) for name, ids in sorted(record.items())}, indent=1) + "\n")
    print(f"{SHIPPED}: {sum(len(ids) for ids in record.values())} versions of {len(record)} files")


if __name__ == "__main__":
    main()
