"""The README stays a front door and the docs stay navigable: a short README, no link to a missing file, the
README's error example is the line the code prints, and its test command is the one CI runs."""

import re
from pathlib import Path

import pytest
from conftest import REPO
from hydra import compose, initialize_config_dir

from cramming.config import load_config
from cramming.errors import UserError

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAX_README_LINES = 220


def relative_links(page: Path) -> list[str]:
    """Markdown link targets that are files of this repository (no scheme, no bare #anchor)."""
    targets = [target for target in LINK.findall(page.read_text(encoding="utf-8"))
               if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]
    return [target.split("#")[0] for target in targets]


def test_readme_is_a_front_door_not_a_manual():
    """The manual lives in docs/; the README says what it is, how to start and where to read on."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_a_file(page):
    missing = [target for target in relative_links(page) if not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_the_readme_links_every_docs_page():
    """Where to read on: each page of the manual is reachable from the front door."""
    linked = {(README.parent / target).resolve() for target in relative_links(README)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, unlinked


def test_the_readme_error_example_is_what_the_code_says():
    """The README shows one error line as the contract; it must be the line a user actually gets."""
    shown = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("error: ")]
    assert len(shown) == 1, shown
    override = re.search(r"`python pretrain\.py ([^`]+)` prints", README.read_text(encoding="utf-8")).group(1)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="pretrain", overrides=override.split())
    with pytest.raises(UserError) as err:
        load_config(cfg)
    assert shown[0] == f"error: {err.value}"


def test_ci_runs_the_readme_test_command():
    """The README's command 2 is what `.ci/run` runs, so CI checks what a user is told to run."""
    block = re.search(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands[1] == "bash scripts/test.sh"
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]
