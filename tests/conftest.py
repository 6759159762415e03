import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CRAMMING_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"


def needs_shared(sub: str = "") -> Path:
    """The shared real-data folder, or skip the test saying why."""
    path = SHARED_DATA / sub
    if not path.exists():
        pytest.skip(f"real data not found at {path} (set CRAMMING_SHARED to the folder holding data/)")
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One data cache for the whole session, as sweeps share one."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _cache_env(cache_dir, monkeypatch):
    monkeypatch.setenv("CRAMMING_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def run_pretrain(*overrides: str, run_dir: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python pretrain.py` as a user would, from the repository root."""
    args = [sys.executable, str(REPO / "pretrain.py"), *overrides]
    if run_dir is not None:
        args.append(f"hydra.run.dir={run_dir}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
