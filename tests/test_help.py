"""`--help` of each entry point: its own purpose, its own config groups with their options, its main keys."""

import re

import pytest
from conftest import REPO, run_command
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cramming.cli import CONF, group_options

OWN = {"pretrain.py": ["arch", "data", "train", "impl"], "eval.py": ["eval", "impl"]}
MISSING = object()


@pytest.fixture(scope="module", params=sorted(OWN))
def help_of(request):
    result = run_command(request.param, ["--help"])  # the entry's own code, in this process (test_commands
    assert result.returncode == 0, result.stderr[-2000:]  # runs the installed commands' --help in subprocesses)
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
    section = text.split("== Most used keys")[1]
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


def test_each_help_says_what_its_key_lines_cannot(help_of):
    """eval.py: eval.data_dir defaults to $GLUE_DIR (conf/eval/glue.yaml), which the schema's key line cannot show,
    and every other preset reads a variable of its own. pretrain.py: with eval_after=true the last line printed is
    the evaluation's `results:`, not `checkpoint:`."""
    command, text = help_of
    said = " ".join(text.split())
    if command == "pretrain.py":
        assert "the last line printed is `checkpoint: <folder>`; with eval_after=true it is the evaluation's " \
               "`results: <results.json>`" in said
        return
    variables = sorted({m for path in (CONF / "eval").glob("*.yaml")
                        for m in re.findall(r"\$\{oc\.env:(\w+),", path.read_text())})
    assert "GLUE_DIR" in variables and len(variables) >= 6
    assert "eval.data_dir, else $GLUE_DIR (a glue_data/ folder" in said and "hub (nyu-mll/glue)" in said
    for variable in variables:
        assert f"${variable}" in said, variable


def test_documented_commands_run_inside_the_activated_venv():
    """One way to run things: set up, `source .venv/bin/activate`, then plain `python` in every command shown."""
    readme = (REPO / "README.md").read_text()
    assert "`source .venv/bin/activate`" in readme
    pages = [readme] + [(REPO / "docs" / name).read_text() for name in ("pretraining.md", "evaluation.md")]
    blocks = [block for page in pages for block in re.findall(r"```bash\n(.*?)```", page, re.DOTALL)]
    commands = [line for block in blocks for line in block.splitlines() if "pretrain.py" in line or "eval.py" in line]
    assert commands and all(line.startswith("python ") for line in commands), commands
    assert "train=cpu-smoke" in next(line for line in commands if "data=local-text" in line)


def test_data_docs_say_what_dedup_keeps():
    """dedup.py keys on 8 bytes of the 16-byte digest, at 16-32 bytes of memory per document."""
    page = " ".join((REPO / "docs" / "data.md").read_text().split())
    assert "16-byte hashes" not in page
    assert "8-byte keys of each document's 16-byte BLAKE2b digest, 16-32 bytes of memory per document" in page
