"""scripts/bench_original.py without the original code: it says how to give it and stops cleanly; bad sizes are
one error line."""

import subprocess
import sys

from conftest import REPO


def run(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "bench_original.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def test_without_the_original_it_says_how_to_give_it_and_exits_0():
    result = run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("skipped: give --original PATH") and "JonasGeiping/cramming" in result.stdout


def test_bad_input_is_one_error_line(tmp_path):
    for args, fragment in ((["--sizes", "4x256,6x384"], "--sizes 6x384"), (["--rounds", "0"], "must be positive"),
                           (["--original", str(tmp_path)], "no cramming/architectures/crammed_bert.py")):
        result = run(*args)
        assert result.returncode != 0 and result.stderr.strip().splitlines()[-1].startswith("error: "), result.stderr
        assert fragment in result.stderr
