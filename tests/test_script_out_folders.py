"""The record and preset-comparison scripts write into --out, removing and rewriting their own stages' folders
there: an --out that holds files of someone else's (no state.json of theirs) is refused and left as it is."""

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import compare_presets
import record


@pytest.mark.parametrize("script", [record, compare_presets], ids=["record", "compare_presets"])
def test_an_out_folder_of_someone_elses_is_refused_and_left_as_it_is(script, tmp_path):
    out = tmp_path / "mine"
    (out / "runs" / "crammed-bert-tiny").mkdir(parents=True)
    (out / "runs" / "crammed-bert-tiny" / "notes.txt").write_text("mine")
    (tmp_path / "shared" / "glue").mkdir(parents=True)
    with pytest.raises(SystemExit, match="holds files and is not a .* folder"):
        script.main(["--out", str(out), "--shared", str(tmp_path / "shared"), "--smoke"])
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "runs", "runs/crammed-bert-tiny", "runs/crammed-bert-tiny/notes.txt"]
