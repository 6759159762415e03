"""The README stays a front door and the docs stay navigable: a short README, no link to a missing file, the
README's error example is the line the code prints, and its test command is the one CI runs."""

import re
from pathlib import Path

import pytest
from conftest import REPO
from hydra import compose, initialize_config_dir

from cramming.errors import UserError
from cramming.validation import load_config

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


def paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]


def test_where_the_last_line_is_called_checkpoint_eval_after_is_said_too():
    """With eval_after=true the evaluation runs after the checkpoint line, so the last line is eval.py's `results:`
    (tests/test_sweep.py observes it): every page or help text that calls `checkpoint:` the last line says so."""
    texts = {p.relative_to(REPO): p.read_text(encoding="utf-8")
             for p in [*PAGES, *sorted((REPO / "conf" / "hydra" / "help").glob("*.yaml"))]}
    claims = [(name, para) for name, text in texts.items() for para in paragraphs(text)
              if re.search(r"last line", para) and "`checkpoint:" in para]
    assert len(claims) >= 3, claims  # README, docs/pretraining.md, pretrain.py --help
    for name, para in claims:
        assert "eval_after=true" in para and "`results: <" in para, (name, para)


def test_no_page_names_a_path_only_our_own_machines_have():
    """`../shared/...` is where our development machines keep data; a user's clone has nothing there."""
    files = [*PAGES, *sorted((REPO / "conf" / "hydra" / "help").glob("*.yaml")),
             *(REPO / "scripts" / name for name in ("gpu_checks.sh", "gpu_checks.py", "fetch_wheels.py"))]
    named = [str(p.relative_to(REPO)) for p in files if "../shared" in p.read_text(encoding="utf-8")]
    assert not named, named


def test_the_optuna_example_draws_what_the_docs_say():
    """Hydra's Optuna sweeper turns `range(a,b)` into Optuna's integers from a to b with b included (its _impl.py),
    unlike Hydra's own range: the example's sentence lists what it really draws."""
    impl = pytest.importorskip("hydra_plugins.hydra_optuna_sweeper._impl")
    import optuna
    from hydra.core.override_parser.overrides_parser import OverridesParser

    page = " ".join((REPO / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    override = re.search(r"'(arch\.num_layers=range\(\d+,\d+\))'", page).group(1)
    said = re.search(r"Here `" + re.escape(override.split("=")[1]) + r"` draws ([\d, or]+) layers", page)
    assert said, override
    parser = OverridesParser.create()
    distribution = impl.create_optuna_distribution_from_override(parser.parse_override(override))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = {study.ask({"n": distribution}).params["n"] for _ in range(200)}
    assert sorted(drawn) == [int(n) for n in re.findall(r"\d+", said.group(1))]
    # the basic sweeper's range, which the table contrasts with it, stops before its end
    assert list(parser.parse_override("n=range(2,5)").sweep_string_iterator()) == ["2", "3", "4"]
