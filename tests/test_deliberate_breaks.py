"""scripts/deliberate_breaks.py's list stays well-formed: 18 breaks, each old text found exactly once in its file as
the checkout holds it, each edit still Python, each named test file present. Nothing is run."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("deliberate_breaks", REPO / "scripts" / "deliberate_breaks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = load_tool()


def test_there_are_eighteen_breaks_in_distinct_places():
    assert len(TOOL.BREAKS) == 18
    assert len({(b.file, b.old) for b in TOOL.BREAKS}) == 18


@pytest.mark.parametrize("number", range(1, len(TOOL.BREAKS) + 1))
def test_each_break_applies_once_and_names_existing_tests(number):
    brk = TOOL.BREAKS[number - 1]
    text = (REPO / brk.file).read_text(encoding="utf-8")
    assert text.count(brk.old) == 1, f"break {number}: the old text of {brk.file} must occur exactly once"
    assert brk.new != brk.old and brk.why.strip() and "\n" not in brk.why
    compile(text.replace(brk.old, brk.new), brk.file, "exec")  # still Python: the break is a bug, not a crash
    assert brk.tests
    for test in brk.tests:
        path = REPO / TOOL.file_of_test(test)
        assert path.is_file() and path.name.startswith("test_"), f"break {number}: no test file {path}"
