"""$CRAMMING_PLUGINS: files (or modules) of your own components, imported before a config is read, so that a new
position scheme, attention pattern, optimizer, objective, benchmark or engine is one file that registers itself
and no file of the package changes (docs/architecture.md: Adding things; tests/test_one_file.py)."""

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .errors import UserError

VARIABLE = "CRAMMING_PLUGINS"


def module_name(entry: str) -> str:
    """The name an entry is imported under: a file's own (cramming_plugin_<stem>), a module's dotted name."""
    return f"cramming_plugin_{Path(entry).stem}" if entry.endswith(".py") else entry


def import_plugins() -> None:
    """Each entry of $CRAMMING_PLUGINS (separated by os.pathsep: a .py file or an importable module), once per
    process: importing it registers its components. One that cannot be imported is one line naming it."""
    for entry in filter(None, os.environ.get(VARIABLE, "").split(os.pathsep)):
        name = module_name(entry)
        if name in sys.modules:
            continue
        try:
            if entry.endswith(".py"):
                spec = importlib.util.spec_from_file_location(name, Path(entry).expanduser())
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(entry)
        except (ImportError, FileNotFoundError) as err:
            sys.modules.pop(name, None)
            raise UserError(f"{VARIABLE}={entry!r} cannot be imported ({err}); give a .py file or an importable "
                            "module, separated by ':'") from None
