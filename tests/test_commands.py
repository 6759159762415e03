"""The installed console commands (pyproject's [project.scripts]): cramming-pretrain and cramming-eval run the same
Hydra apps as pretrain.py and eval.py, on the configs shipped inside the package, from any directory, writing
under the current one."""

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import one_line_error

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_the_package_list_has_every_package_and_the_configs():
    """pyproject lists the packages by hand (conf/ is mapped in as cramming.conf): a new subpackage missing from
    the list would be left out of an installed wheel."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "cramming").rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | {"cramming.conf"}
    assert setuptools["package-dir"] == {"cramming.conf": "conf"}


def test_the_configs_are_found_through_the_package():
    from importlib import resources

    from cramming.cli import CONF, command_groups, config_of

    assert (Path(str(resources.files("cramming.conf"))) / "pretrain.yaml").is_file() and (CONF / "eval.yaml").is_file()
    assert [config_of(c) for c in ("pretrain.py", "cramming-pretrain", "eval.py", "cramming-eval")] == \
        ["pretrain", "pretrain", "eval", "eval"]
    assert command_groups("cramming-eval") == command_groups("eval.py")


@pytest.mark.slow
def test_the_commands_run_from_another_directory(tmp_path):
    for name in ("cramming-pretrain", "cramming-eval"):
        helped = subprocess.run([str(BIN / name), "--help"], cwd=tmp_path, capture_output=True, text=True,
                                timeout=120, check=False)
        assert helped.returncode == 0 and f"{name} ..." in helped.stdout, helped.stderr[-2000:]
    bad = subprocess.run([str(BIN / "cramming-pretrain"), "colour=red"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
    one_line_error(bad, "colour: no such config key", "cramming-pretrain --help")
    run = subprocess.run([str(BIN / "cramming-pretrain"), "arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke",
                          "data=sanity", "train.max_steps=2", "name=elsewhere"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    checkpoint = Path(run.stdout.strip().splitlines()[-1].removeprefix("checkpoint: "))
    assert checkpoint.is_relative_to(tmp_path / "outputs" / "elsewhere") and (checkpoint / "config.json").is_file()
