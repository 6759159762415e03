"""transformers' own common model tests pass against our classes (scripts/hf_common_tests.py fetches them with the
installed version's source distribution from PyPI; skipped, saying so, where PyPI cannot be reached)."""

import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_transformers_common_model_tests_pass_for_the_mlm_and_the_causal_model(cache_dir):
    pytest.importorskip("parameterized", reason="transformers' tests import parameterized (the dev extras have it)")
    env = {**os.environ, "CRAMMING_CACHE": os.environ.get("CRAMMING_HF_TESTS_CACHE", str(cache_dir))}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "hf_common_tests.py"), "-W",
                           "ignore::DeprecationWarning"], capture_output=True, text=True, timeout=1800, env=env,
                          check=False)
    if done.returncode == 2 and "could not fetch" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary
