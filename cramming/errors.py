"""User-facing errors: one clear line, a non-zero exit, no traceback."""

import functools
import sys


class UserError(Exception):
    """Something the user can fix (config, data, paths). Printed as one line, never as a traceback."""


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

    return wrapper
