"""Fine-tune a checkpoint on GLUE (or your own task): `python eval.py checkpoint=<folder>` or `name=<run>`
(installed: `cramming-eval ...`). The command itself is cramming/commands.py."""

import sys

try:
    from cramming.commands import eval_command
except ModuleNotFoundError as missing:  # not the project's environment: say how to get it, in one line
    print(f"error: {missing.name} is not installed for {sys.executable}; run `bash scripts/setup.sh`, then "
          "`source .venv/bin/activate`", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    eval_command("eval.py")
