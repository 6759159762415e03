"""The one-line error contract for what Hydra itself rejects, before our task function runs: one `error:` line
naming the key or option (with the valid choices where there are some), exit code 2, no traceback."""

import os
import subprocess
import sys

import hydra
import pytest
from conftest import REPO, one_line_error, run_pretrain

from cramming.cli import CONF, run_entry


def compose_through_entry(monkeypatch, capsys, config_name: str, *overrides: str):
    """Run Hydra's real @hydra.main through run_entry in-process (seconds, not a subprocess per case)."""

    @hydra.main(version_base="1.3", config_path=str(CONF), config_name=config_name)
    def task(cfg):
        raise AssertionError("the task must not run when composition fails")

    monkeypatch.setattr(sys, "argv", [f"{config_name}.py", *overrides])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        run_entry(task, f"{config_name}.py")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert stop.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "HYDRA_FULL_ERROR" not in os.environ  # not left behind for what runs next
    return lines[0]


ARCHS = ", ".join(sorted(p.stem for p in (REPO / "conf" / "arch").glob("*.yaml")))  # the options Hydra lists
EVAL_PRESETS = ", ".join(sorted(p.stem for p in (REPO / "conf" / "eval").glob("*.yaml")))  # eval.py's


@pytest.mark.parametrize("config,override,fragments", [
    ("pretrain", "arch=crammed-bert-huge", ["arch=crammed-bert-huge", f"choose one of: {ARCHS}"]),
    ("pretrain", "arch=", ["arch= needs an option", ARCHS]),
    ("pretrain", "train=gpu", ["train=gpu", "budget-o4, cpu-smoke"]),
    ("pretrain", "budgett=2", ["budgett: no such config key", "did you mean budget?"]),
    ("pretrain", "colour=red", ["colour: no such config key", "pretrain.py --help"]),
    ("pretrain", "data.cach_dir=/tmp/x", ["data.cach_dir: no such config key", "did you mean data.cache_dir?"]),
    ("pretrain", "data.tokenizer.knd=bpe", ["data.tokenizer.knd", "did you mean data.tokenizer.kind?"]),
    ("pretrain", "+budget=3", ["+budget", "drop the +"]),
    ("pretrain", "+impl=cpu", ["+impl", "impl=<option>"]),
    ("pretrain", "budget=[1", ["budget=[1", "cannot parse"]),
    ("pretrain", "train.lr", ["'train.lr'", "missing EQUAL"]),
    ("pretrain", "impl=cpu,gpu", ["impl=cpu,gpu", "-m"]),
    ("pretrain", "~nokey", ["~nokey", "no key nokey"]),
    ("pretrain", "eval=glue", ["eval is not a config group of pretrain.py", "arch, data, train, impl"]),
    ("pretrain", "--cfg=jobb", ["--cfg", "invalid choice: 'jobb'", "choose from 'job', 'hydra', 'all'"]),
    ("eval", "--multirunn", ["unrecognized arguments: --multirunn"]),
    ("eval", "eval=xnli", ["eval=xnli", f"choose one of: {EVAL_PRESETS}"]),
    ("eval", "arch=gpt-tiny", ["arch is not a config group of eval.py", "eval, impl"]),
    ("eval", "eval.taskz=[rte]", ["eval.taskz", "did you mean eval.tasks"]),
])
def test_composition_errors_are_one_line(monkeypatch, capsys, config, override, fragments):
    line = compose_through_entry(monkeypatch, capsys, config, override)
    for fragment in fragments:
        assert fragment in line, line


def test_full_error_still_gives_hydras_traceback(monkeypatch):
    """HYDRA_FULL_ERROR=1 is the user's way to see everything; run_entry must not swallow it."""
    from hydra.errors import MissingConfigException

    @hydra.main(version_base="1.3", config_path=str(CONF), config_name="pretrain")
    def task(cfg):
        raise AssertionError("unreachable")

    monkeypatch.setattr(sys, "argv", ["pretrain.py", "arch=nope"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(MissingConfigException):
        run_entry(task, "pretrain.py")


def test_a_bug_in_the_task_keeps_its_traceback(monkeypatch, tmp_path):
    """Only composition errors become a line: an OmegaConf error raised by our own code is a bug to show."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError

    @hydra.main(version_base="1.3", config_path=str(CONF), config_name="pretrain")
    def task(cfg):
        OmegaConf.set_struct(cfg, True)
        return cfg.no_such_attribute

    monkeypatch.setattr(sys, "argv", ["pretrain.py", "hydra.output_subdir=null", f"hydra.run.dir={tmp_path}"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(ConfigAttributeError):
        run_entry(task, "pretrain.py")


def test_entry_points_keep_the_contract(tmp_path):
    """The real commands, end to end: pretrain.py and eval.py. The in-process runner the other command-line tests
    use for refusals (conftest.run_command) says exactly what the command says, with its exit code."""
    for n, (refused, fragment) in enumerate([("arch=crammed-bert-huge", "gpt-tiny"),  # Hydra's refusal, then ours
                                             ("train.lr=-1", "train.lr=-1.0 is invalid: must be > 0")]):
        real = run_pretrain(refused, run_dir=tmp_path / f"real{n}")
        one_line_error(real, refused, fragment)
        here = run_pretrain(refused, run_dir=tmp_path / f"here{n}", in_process=True)
        errors = [[line for line in r.stderr.splitlines() if line.startswith("error: ")] for r in (real, here)]
        assert here.returncode == real.returncode and errors[0] == errors[1], errors
        assert not (tmp_path / f"real{n}").exists() and not (tmp_path / f"here{n}").exists()
    result = subprocess.run([sys.executable, "eval.py", "eval=xnli", "checkpoint=x"], cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=120)
    one_line_error(result, "eval=xnli", EVAL_PRESETS)
    result = subprocess.run([sys.executable, "eval.py", "eval.seeds=???", "checkpoint=x"], cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=120)
    one_line_error(result, "eval.seeds=??? leaves the value missing")


@pytest.mark.parametrize("script", ["pretrain.py", "eval.py"])
def test_outside_the_venv_says_how_to_set_up(script):
    """`python -S` skips site-packages, as a Python without the project's packages would."""
    result = subprocess.run([sys.executable, "-S", script, "--help"], cwd=REPO, capture_output=True, text=True,
                            check=False, timeout=60)
    one_line_error(result, "is not installed", "scripts/setup.sh", "source .venv/bin/activate")
