"""What the evaluation's readers share: every file checked before any is parsed, and the one JSONL reader (blank
lines skipped, a line that is not a JSON object named by file and line in the wording each task family passes)."""

import pytest

from cramming.card import without_paths
from cramming.errors import UserError
from cramming.eval.custom import load_custom_task
from cramming.eval.files import files_source, json_objects, require_files


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


def test_a_tasks_files_are_named_by_their_folder_which_the_card_keeps(tmp_path):
    """The model card keeps a path's last part: a task's data must be named by its folder, not as train.csv."""
    (tmp_path / "reviews").mkdir()
    (tmp_path / "reviews" / "train.csv").write_text("text,label\na,0\nb,1\n")
    (tmp_path / "reviews" / "dev.csv").write_text("text,label\nc,0\n")
    task = load_custom_task(str(tmp_path / "reviews" / "train.csv"), str(tmp_path / "reviews" / "dev.csv"),
                            ["text"], "label")
    assert without_paths(task.source) == "reviews (train=train.csv, dev=dev.csv)"
    apart = files_source(tmp_path / "a" / "train.csv", tmp_path / "b" / "dev.csv")
    assert without_paths(apart) == "train=a (train.csv), dev=b (dev.csv)"
