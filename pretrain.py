"""Pretrain on a wall-clock budget: `python pretrain.py arch=crammed-bert data=python-docs budget=24`
(installed: `cramming-pretrain ...`). The command itself is cramming/commands.py."""

import sys

try:
    from cramming.commands import pretrain_command
except ModuleNotFoundError as missing:  # not the project's environment: say how to get it, in one line
    print(f"error: {missing.name} is not installed for {sys.executable}; run `bash scripts/setup.sh`, then "
          "`source .venv/bin/activate`", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    pretrain_command("pretrain.py")
