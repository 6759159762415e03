"""data.encoding / data.encoding_errors, and error messages that give the file's own position."""

import json

import pytest
from test_data import data_config, make_corpus

from cramming.config import DataConfig, HubSource
from cramming.data.local_text import iter_documents
from cramming.data.prepare import cache_key, prepare_data
from cramming.data.sources import open_source
from cramming.errors import UserError

FILLER = "plain ascii words on a line\n" * 1000  # 28,000 bytes: the bad byte lies far past an 8 KiB read chunk


def latin1_file(folder):
    """A paragraph corpus in latin-1: ASCII filler, then one line with e-acute (0xE9, never valid UTF-8 here)."""
    path = folder / "latin.txt"
    path.write_bytes((FILLER + "un caf\u00e9 noir\n").encode("latin-1"))
    return path, len(FILLER.encode()) + len("un caf"), FILLER.count("\n") + 1


def docs(path, field="text", **encoding):
    return list(iter_documents([path], field, **encoding))


def test_strict_utf8_names_the_file_byte_offset_and_line(tmp_path):
    path, offset, line = latin1_file(tmp_path)
    with pytest.raises(UserError) as err:
        docs(path)
    message = str(err.value)
    assert str(path) in message and f"at byte {offset:,} (line {line:,}:" in message, message
    assert "data.encoding" in message


def test_offset_counts_a_character_split_across_scan_chunks(tmp_path):
    """The scan reads 1 MiB at a time; a two-byte character across that boundary must not shift the offset."""
    head = b"a" * ((1 << 20) - 1) + "\u00e9".encode()  # its second byte opens the second chunk
    path = tmp_path / "split.txt"
    path.write_bytes(head + b"\nok\n" + b"bad \xff here\n")
    with pytest.raises(UserError, match=f"at byte {len(head) + 8:,} \\(line 3:"):
        docs(path)


def test_encoding_options_change_the_text(tmp_path):
    path, _, _ = latin1_file(tmp_path)
    assert docs(path, encoding="latin-1")[0].endswith("un caf\u00e9 noir")
    assert docs(path, errors="replace")[0].endswith("un caf\ufffd noir")
    assert docs(path, errors="ignore")[0].endswith("un caf noir")


@pytest.mark.parametrize("suffix", ["jsonl", "json", "csv"])
def test_structured_readers_take_the_encoding(tmp_path, suffix):
    body = "une cr\u00e8me br\u00fbl\u00e9e"
    rows = [{"text": f"row {i} plain"} for i in range(3)] + [{"text": body}]
    path = tmp_path / f"rows.{suffix}"
    if suffix == "csv":
        text = "text\n" + "".join(f"{r['text']}\n" for r in rows)
    elif suffix == "json":
        text = json.dumps(rows, ensure_ascii=False, indent=1)
    else:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_bytes(text.encode("latin-1"))
    assert docs(path, encoding="latin-1")[-1] == body
    assert docs(path, encoding="utf-8", errors="replace")[-1] == "une cr\ufffdme br\ufffdl\ufffde"
    bad = text.index("\u00e8")  # latin-1 is one byte per character: the character index is the byte offset
    with pytest.raises(UserError, match=f"{path.name} is not valid utf-8 at byte {bad:,} \\(line {text.count(chr(10), 0, bad) + 1}:"):
        docs(path)


@pytest.mark.parametrize("suffix", ["jsonl", "json", "csv"])
def test_structured_rows_without_text_are_no_documents(tmp_path, suffix):
    """A row whose text is empty, blank (spaces, tabs, newlines) or null is skipped, as a blank paragraph of a text
    file is: it would only add an empty document (its separator alone) to the token stream."""
    texts = ["first words", "   ", "", "\t \n ", "last words"]
    path = tmp_path / f"rows.{suffix}"
    if suffix == "csv":
        path.write_text("text,id\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(texts)))
    elif suffix == "json":
        path.write_text(json.dumps([{"text": t} for t in texts] + [{"text": None}]))
    else:
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in [*texts, None]))
    assert docs(path) == ["first words", "last words"]


def test_parquet_ignores_the_encoding(tmp_path):
    """Parquet strings are UTF-8 by definition: data.encoding does not apply (and must not break them)."""
    import pandas as pd

    path = tmp_path / "rows.parquet"
    pd.DataFrame({"text": ["caf\u00e9 au lait"]}).to_parquet(path)
    assert docs(path, encoding="latin-1") == ["caf\u00e9 au lait"]


def test_encoding_is_part_of_the_cache_key(tmp_path):
    path, _, _ = latin1_file(tmp_path)
    keys = set()
    for encoding, errors in (("utf-8", "strict"), ("latin-1", "strict"), ("utf-8", "replace"), ("utf-8", "ignore")):
        cfg = data_config(path, tmp_path / "cache", encoding=encoding, encoding_errors=errors)
        keys.add(cache_key(cfg, open_source(cfg, tmp_path / "cache").fingerprint()))
    assert len(keys) == 4


def test_a_latin1_corpus_trains_with_its_encoding(tmp_path):
    texts = make_corpus(tmp_path / "src")
    path = tmp_path / "src" / "corpus.txt"
    path.write_bytes(("\n\n".join(f"{t} caf\u00e9" for t in texts) + "\n").encode("latin-1"))
    with pytest.raises(UserError, match="corpus.txt is not valid utf-8"):
        prepare_data(data_config(path, tmp_path / "cache"))
    _, meta = prepare_data(data_config(path, tmp_path / "cache", encoding="latin-1", ascii_only=False,
                                       strip_accents=False))
    assert meta["documents_read"] == len(texts)


def test_a_broken_jsonl_line_is_named_by_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n{"text": three}\n')
    with pytest.raises(UserError, match="rows.jsonl line 4 is not valid JSON"):
        docs(path)


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_field_that_is_not_text_says_so(tmp_path, suffix):
    path = tmp_path / f"rows.{suffix}"
    if suffix == "jsonl":
        path.write_text('{"text": "fine"}\n{"text": 7}\n')
        with pytest.raises(UserError, match="line 2: the field 'text' holds int, not text"):
            docs(path)
    else:
        path.write_text("body\nhello\n")
        with pytest.raises(UserError, match="no field 'text'.*fields: body"):
            docs(path)


def test_hub_field_that_is_not_text_is_not_called_offline(tmp_path, monkeypatch):
    """A reachable dataset whose text_field holds numbers: say so, not "cannot be reached"."""
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr("cramming.data.hub.offline_reason", lambda: None)  # as if the hub were reachable
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: iter([{"label": 1, "text": "ok"}] * 3))
    cfg = DataConfig(source="hub", hub=[HubSource(path="some/numbers", text_field="label")], cache_dir=str(tmp_path))
    with pytest.raises(UserError) as err:
        list(open_source(cfg, tmp_path).documents())
    assert "'label' holds int values, not text" in str(err.value) and "cannot be reached" not in str(err.value)


def test_a_utf16_file_is_text_under_its_encoding(tmp_path):
    """UTF-16 is full of NUL bytes: binary under utf-8, plain text once data.encoding says what it is."""
    path = tmp_path / "wide.txt"
    path.write_text("premier paragraphe, caf\u00e9\n\nsecond paragraphe\n", encoding="utf-16")
    with pytest.raises(UserError, match="wide.txt looks binary"):
        docs(path)
    assert docs(path, encoding="utf-16") == ["premier paragraphe, caf\u00e9", "second paragraphe"]
