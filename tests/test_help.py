"""`--help` of each entry point: its own purpose, its own config groups with their options, its main keys."""

import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cramming.cli import CONF, group_options
from conftest import REPO

OWN = {"pretrain.py": ["arch", "data", "train", "impl"], "eval.py": ["eval", "impl"]}
MISSING = object()


@pytest.fixture(scope="module", params=sorted(OWN))
def help_of(request):
    result = subprocess.run([sys.executable, request.param, "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return request.param, result.stdout


def listed_groups(text: str) -> dict[str, list[str]]:
    section = text.split("== Config groups (group=option) ==")[1].split("==")[0]
    return {line.split()[0]: line.split(None, 1)[1].split(", ") for line in section.strip().splitlines()}


def test_each_command_lists_its_own_groups_with_their_options(help_of):
    command, text = help_of
    assert text.startswith(f"{command}: ") and "powered by Hydra" not in text
    groups = listed_groups(text)
    assert list(groups) == OWN[command]  # and nothing of the other command's
    for group, options in groups.items():
        assert options == group_options(group)


def test_pretrain_help_does_not_list_eval_groups_and_vice_versa(help_of):
    command, text = help_of
    other = [g for g in OWN["eval.py" if command == "pretrain.py" else "pretrain.py"] if g not in OWN[command]]
    for group in other:
        assert not re.search(rf"^\s+{group}\s", text, re.MULTILINE), (group, text)
        assert ", ".join(group_options(group)) not in text


def test_every_key_in_the_help_is_a_real_key(help_of):
    """The key lines must name keys that exist: a renamed key makes this fail rather than the help lie."""
    command, text = help_of
    section = text.split("== Most used keys (key=value) ==")[1]
    keys = re.findall(r"^  (\w[\w.]*)=", section, re.MULTILINE)
    assert len(keys) >= 8
    if command == "pretrain.py":
        from cramming.config import PretrainConfig

        cfg = OmegaConf.structured(PretrainConfig)
    else:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="eval", overrides=["eval=custom"])  # custom holds glue's keys and its own
    for key in keys:
        assert OmegaConf.select(cfg, key, default=MISSING) is not MISSING, key
