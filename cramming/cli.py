"""What the entry points share around Hydra: its composition errors as one `error:` line, and the help text.

Hydra composes the config before our task function runs, so an unknown group option, an unknown key or a bad
override never reaches `exit_on_user_error`; left alone, Hydra prints a multi-line message and exits 1. With
HYDRA_FULL_ERROR set, Hydra re-raises instead, and `run_entry` turns its exceptions into the project's contract
(one line, exit 2). A user who sets HYDRA_FULL_ERROR=1 gets Hydra's full traceback as before.
"""

import difflib
import os
import re
import sys
from pathlib import Path

from hydra._internal.utils import get_args_parser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import config  # noqa: F401  both commands' schema nodes, which conf/pretrain.yaml and conf/eval.yaml compose
from .errors import EXIT_USER_ERROR  # onto first: importing the schema modules stores them (cramming/schema.py)
from .eval import config as eval_config  # noqa: F401
from .outputs import fault_reason
from .renames import renamed_line, renamed_override
from .run_folder import undo_made
from .schema import CONF, group_options


def invocation(command: str) -> str:
    """How the user runs a command: `python pretrain.py` from a checkout, `cramming-pretrain` once installed."""
    return f"python {command}" if command.endswith(".py") else command


def config_of(command: str) -> str:
    """The primary config a command composes: pretrain.py and cramming-pretrain -> conf/pretrain.yaml."""
    return "eval" if command.removesuffix(".py").endswith("eval") else "pretrain"
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def groups_help(*names: str) -> str:
    """`${cramming_groups:arch,data}` in a help template: one line per group with its options."""
    width = max(len(g) for g in names)
    return "\n".join(f"  {g.ljust(width)}  {', '.join(group_options(g))}" for g in names)


def keys_help(command: str, *keys: str) -> str:
    """`${cramming_keys:pretrain,budget,seed}` in a help template: those keys' defaults and meanings, read from
    the schema like docs/options.md (cramming/options_doc.py)."""
    from .options_doc import help_lines  # heavy (every registry, torch): only when a help page asks

    return help_lines(command, *keys)


if not OmegaConf.has_resolver("cramming_groups"):
    OmegaConf.register_new_resolver("cramming_groups", groups_help)
    OmegaConf.register_new_resolver("cramming_keys", keys_help)




def _quoted(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(1) if match else None


def _unknown_key(cause, command: str) -> str:
    key = cause.full_key
    if line := renamed_line(key):  # an old key set in a config file rather than on the command line
        return line
    parent = cause.parent_node
    siblings = [str(k) for k in parent] if parent is not None else []
    close = difflib.get_close_matches(str(cause.key), siblings, n=3, cutoff=0.6)
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    hint = f"did you mean {' or '.join(prefix + c for c in close)}?" if close else \
        f"{invocation(command)} --help lists the main keys (--cfg job prints them all)"
    return f"{key}: no such config key; {hint}"


def composition_line(err: Exception, command: str) -> str:
    """Hydra's composition error -> the one line (without `error: `) that names the key or option."""
    message = str(err)
    first = message.splitlines()[0] if message else type(err).__name__
    cause = err.__cause__
    if isinstance(err, MissingConfigException) and err.options is not None and err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        choices = ", ".join(err.options)
        if not option:
            return f"{group}= needs an option; choose one of: {choices}"
        return f"{group}={option} is not an option of the config group {group}; choose one of: {choices}"
    if isinstance(err, OverrideParseException):
        reason = [line for line in err.message.splitlines() if not line.startswith(("Error parsing", "See "))]
        return f"cannot parse the override {err.override!r}: {'; '.join(reason)} (grammar: {GRAMMAR})"
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None) and "not in" in str(cause):
        return _unknown_key(cause, command)
    if "No match in the defaults list" in message and (key := _quoted(r"override '([^']+)'", message)):
        return f"{key} is not a config group of {command} (its groups: {', '.join(command_groups(command))})"
    if key := _quoted(r"An item is already at '([^']+)'", message):
        return f"+{key}: {key} already exists; drop the + to change it ({key}=...), or use ++{key}=..."
    if key := _quoted(r"Multiple values for (\S+?)\.", message):
        return f"+{key}: the config group {key} already has an option; drop the + ({key}=<option>)"
    if key := _quoted(r"Could not delete from config. '([^']+)' does not exist", message):
        return f"~{key}: there is no key {key} to delete"
    if key := _quoted(r"Ambiguous value for argument '([^']+)'", message):
        return (f"{key}: a comma makes a sweep; use [a,b] for a list, quote the value for a string, "
                "or add -m to sweep")
    detail = f" ({str(cause).splitlines()[0]})" if cause is not None and str(cause) else ""
    return first + detail


def command_groups(command: str) -> list[str]:
    """The config groups in a command's defaults list (conf/pretrain.yaml or conf/eval.yaml), Hydra's own left out."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / f"{config_of(command)}.yaml"))["defaults"]
    names = [next(iter(d)) for d in defaults if isinstance(d, dict)]
    return [name for name in names if not name.startswith(("override ", "hydra/"))]


def _inside_job(err: BaseException) -> bool:
    """Raised by the task function itself (Hydra's run_job is on the stack), not by composing its config."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "run_job" and "hydra" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


class _FlagError(Exception):
    """argparse refused one of Hydra's own flags (carried out of its exit so it becomes one line)."""


def flag_problem(argv: list[str]) -> str | None:
    """Hydra's own flags (--cfg, --multirun, ...) go through argparse, whose errors print a usage block: parse
    them first with the parser @hydra.main uses, and say what is wrong in one line."""
    parser = get_args_parser()

    def fail(message: str):
        raise _FlagError(message)

    parser.error = fail
    try:
        parser.parse_args(argv)
    except _FlagError as err:
        return str(err)
    return None


def run_entry(main, command: str) -> None:
    """Call a @hydra.main function; a composition error becomes one `error:` line and exit code 2."""
    if problem := flag_problem(sys.argv[1:]):
        print(f"error: {problem} ({invocation(command)} --help; Hydra's flags: --hydra-help)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    if line := renamed_override(sys.argv[1:]):  # an option moved into its component's section
        print(f"error: {line}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    if os.environ.get("HYDRA_FULL_ERROR"):  # the user asked for Hydra's own traceback
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises its errors instead of printing them
    try:
        main()
    except (HydraException, OmegaConfBaseException) as err:
        if _inside_job(err):
            raise
        print(f"error: {composition_line(err, command)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except (OSError, ValueError) as err:  # Hydra writing its bookkeeping (.hydra/, the log) into the run folder
        fault = next((e for e in (err, err.__cause__, err.__context__) if isinstance(e, OSError)), None)
        reason = fault_reason(fault, Path(fault.filename or ".").parent) if fault is not None else None
        if reason is None or _from_task(err):
            raise
        undo_made()
        print(f"error: cannot write {fault.filename}: {reason}; nothing of the run was started: free some space or "
              "give hydra.run.dir another folder", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def _from_task(err: BaseException) -> bool:
    """Raised by a command's own task function (cramming/commands.py), not by Hydra setting up its job."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("pretrain_main", "eval_main"):
            return True
        tb = tb.tb_next
    return False
