"""What the evaluation's readers share: every file checked before any is parsed, and the one JSONL reader (blank
lines skipped, a line that is not a JSON object named by file and line in the wording each task family passes)."""

import pytest

from cramming.errors import UserError
from cramming.eval.files import json_objects, require_files


def test_objects_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('\ufeff{"a": 1}\n\n   \n{"b": 2}\n', encoding="utf-8")  # a BOM, as Windows editors write
    assert list(json_objects(path)) == [(1, {"a": 1}), (4, {"b": 2})]


@pytest.mark.parametrize("line, problem", [("[1, 2]", "expected a JSON object, got list"),
                                           ("7", "expected a JSON object, got int"),
                                           ('{"a": ', "not valid JSON (Expecting value)")])
@pytest.mark.parametrize("place, named", [(None, "{path} line 2"), ("{path}:{number}", "{path}:2")])
def test_a_bad_line_is_one_error_naming_it(tmp_path, line, problem, place, named):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n' + line + "\n")
    reading = json_objects(path) if place is None else json_objects(path, place=place)
    with pytest.raises(UserError) as err:
        list(reading)
    assert str(err.value) == f"{named.format(path=path)}: {problem}"


def test_the_first_missing_file_is_named_before_any_is_read(tmp_path):
    present, missing, later = tmp_path / "train.tsv", tmp_path / "dev.tsv", tmp_path / "test.tsv"
    present.write_text("x")
    missing.mkdir()  # a folder where the file should be is no file either
    require_files("rte", [present, present], "hold the original glue_data/ files")  # all there: nothing said
    with pytest.raises(UserError) as err:
        require_files("rte", [present, missing, later], "hold the original glue_data/ files")
    assert str(err.value) == f"rte: missing {missing}; eval.data_dir must hold the original glue_data/ files"
