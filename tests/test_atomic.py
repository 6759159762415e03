"""The shared write helper: a file is replaced whole or not at all, and a failed write leaves no temporary behind."""

import os

import pytest

from cramming.atomic import atomic_open, locked, write_atomic


def test_a_failed_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "sub" / "results.json"
    write_atomic(path, '{"complete": true}')
    assert path.read_text() == '{"complete": true}' and oct(path.stat().st_mode & 0o777) == "0o644"
    with pytest.raises(RuntimeError), atomic_open(path, "w") as fh:
        fh.write('{"compl')  # a crash halfway through the new content
        raise RuntimeError("killed")
    assert path.read_text() == '{"complete": true}'
    assert os.listdir(path.parent) == ["results.json"]


def test_the_lock_is_a_file_beside_the_target(tmp_path):
    with locked(tmp_path / "manifest.json") as lock:
        assert lock.is_locked and (tmp_path / "manifest.json.lock").exists()
