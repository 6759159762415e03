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


EXIT_USER_ERROR = 2


def exit_on_user_error(fn):
    """Wrap an entry point so that a UserError becomes `error: ...` on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        except RunStopped as stop:
            print(f"stopped: {stop}", file=sys.stderr, flush=True)
            sys.exit(stop.exit_code)

    return wrapper
