"""User-facing errors and deliberate stops: one clear line, a non-zero exit, no traceback."""

import functools
import sys


class UserError(Exception):
    """Something the user can fix (config, data, paths). Printed as one line, never as a traceback."""


class RunStopped(Exception):
    """The run stopped on purpose (a stop signal, or train.nonfinite gave up): one line and a documented code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def check(ok: bool, key: str, value, requirement: str) -> None:
    """Stop, in one line worded as registry.invalid words it, unless `ok`."""
    if not ok:
        raise UserError(f"{key}={value!r} is invalid: {requirement}")


def check_choice(key: str, value, choices) -> None:
    if value not in choices:
        raise UserError(f"{key}={value!r} is not a valid option; choose one of: {', '.join(sorted(choices))}")


def refuse(problem: str | None) -> None:
    """Stop on what a check or a registered component refuses (its `problem`, a line or None)."""
    if problem:
        raise UserError(problem)


EXIT_UNEXPECTED = 1  # what Python itself exits with on an uncaught exception
EXIT_USER_ERROR = 2


def failure_line(err: BaseException) -> tuple[str, int]:
    """The one line and the exit code a failure gets: `error: ...` and 2 for a UserError, `stopped: ...` and its
    own code for a RunStopped, `error: <type>: ...` and 1 for anything unexpected (a sweep job reports those
    in one line too, its traceback going to the job's log)."""
    if isinstance(err, UserError):
        return f"error: {err}", EXIT_USER_ERROR
    if isinstance(err, RunStopped):
        return f"stopped: {err}", err.exit_code
    return f"error: {type(err).__name__}: {err}", EXIT_UNEXPECTED


def exit_on_user_error(fn):
    """Wrap an entry point so that a UserError becomes `error: ...` on stderr and exit code 2 (a RunStopped:
    `stopped: ...` and its code). Anything else keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UserError, RunStopped) as err:
            line, code = failure_line(err)
            print(line, file=sys.stderr, flush=True)
            sys.exit(code)

    return wrapper
