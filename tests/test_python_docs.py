"""Tests for the embedded python-docs corpus (cramming/data/python_docs.py): small hand-written roots."""
import json
import os
import textwrap

import pytest

from cramming.data import python_docs
from cramming.data.python_docs import build_corpus, clean_docstring, iter_documents

PROSE = "This sentence is long enough to count as prose, because it has well over eighty characters in it."


def write(root, relpath, source):
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        path.write_bytes(source)
    else:
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def docs(root, **kwargs):
    return list(iter_documents(max_chars=kwargs.pop("max_chars", 10**9), roots=[str(root)], **kwargs))


def test_module_class_function_docstrings_in_source_order(tmp_path):
    write(tmp_path, "mod.py", f'''
        """Module: {PROSE}"""
        import os

        class Thing:
            """Class: {PROSE}"""

            def method(self):
                """Method: {PROSE}"""
                return 1

        if os.name:
            async def coroutine():
                """Async function: {PROSE}"""

                def inner():
                    """Nested function: {PROSE}"""

        x = "Not a docstring: {PROSE}"
    ''')
    found = docs(tmp_path)
    assert [d.split(":")[0] for d in found] == ["Module", "Class", "Method", "Async function", "Nested function"]
    assert all(d.endswith(PROSE) for d in found)


def test_doctests_code_blocks_and_markup_are_dropped():
    doc = f"""Summary line: {PROSE}

    Parameters
    ----------
    a : array_like
        Indented parameter description that is long enough to be prose but is indented four spaces.

    >>> compute(1, 2)
    3
    an output line right after the doctest that is long enough to be prose, but belongs to the doctest

    Use it like this::

      x = compute(1, 2)  # a literal block that is long enough to be prose but it is code so it goes

    See :func:`~pkg.compute` and ``other_thing`` for details; {PROSE}
    """
    cleaned = clean_docstring(doc)
    paragraphs = cleaned.split("\n\n")
    assert paragraphs == [f"Summary line: {PROSE}", f"See pkg.compute and other_thing for details; {PROSE}"]
    for gone in (">>>", "doctest", "literal block", "----", "Indented parameter", "::"):
        assert gone not in cleaned


def test_tiny_fragments_and_non_prose_are_dropped(tmp_path):
    write(tmp_path, "small.py", '''
        def f():
            """Return the thing."""

        def g():
            """
            ==================================================================================
            0x1F 0x2E 0x3D 0x4C 0x5B 0x6A 0x79 0x88 0x97 0xA6 0xB5 0xC4 0xD3 0xE2 0xF1 0x00 0x0F
            """
    ''')
    assert docs(tmp_path) == []
    assert clean_docstring("Short.\n\n" + PROSE) == PROSE


def test_duplicates_are_removed_keeping_the_first(tmp_path):
    write(tmp_path, "a.py", f'"""{PROSE}"""\ndef f():\n    """{PROSE}"""\n')
    write(tmp_path, "b.py", f'"""{PROSE}"""\n\ndef g():\n    """Different: {PROSE}"""\n')
    assert docs(tmp_path) == [PROSE, f"Different: {PROSE}"]


def test_order_is_deterministic_sorted_paths_and_skips_tests_and_caches(tmp_path):
    for rel in ["b.py", "a.py", "a/z.py", "a/b/c.py", "a0.py"]:
        write(tmp_path, rel, f'"""File {rel}: {PROSE}"""\n')
    for rel in ["tests/t.py", "test/t.py", "pkg/idle_test/t.py", "__pycache__/m.py", "x/test_m.py", "notes.txt"]:
        write(tmp_path, rel, f'"""Skipped {rel}: {PROSE}"""\n')
    first, second = docs(tmp_path), docs(tmp_path)
    assert first == second
    # Sorted as full path strings: "a.py" < "a/b/c.py" < "a/z.py" < "a0.py" < "b.py".
    assert [d.split(":")[0] for d in first] == ["File a.py", "File a/b/c.py", "File a/z.py", "File a0.py", "File b.py"]


def test_output_does_not_depend_on_worker_processes(tmp_path, monkeypatch):
    for i in range(40):
        write(tmp_path, f"pkg{i % 3}/m{i:02d}.py", f'"""Document {i}: {PROSE}"""\ndef f():\n    """Again {i}: {PROSE}"""\n')
    pooled = docs(tmp_path)
    monkeypatch.setattr(python_docs, "MAX_WORKERS", 1)
    assert docs(tmp_path) == pooled and len(pooled) == 80


def test_max_chars_and_max_files_cap(tmp_path):
    for i in range(5):
        write(tmp_path, f"m{i}.py", f'"""Document {i}: {PROSE}"""\n')
    everything = docs(tmp_path)
    assert len(everything) == 5
    size = len(everything[0])
    assert docs(tmp_path, max_chars=1) == everything[:1]  # stops at the document that crosses the cap
    assert docs(tmp_path, max_chars=size) == everything[:1]
    assert docs(tmp_path, max_chars=size + 1) == everything[:2]
    assert docs(tmp_path, max_chars=0) == []
    assert docs(tmp_path, max_files=3) == everything[:3]


def test_undecodable_unparsable_and_huge_files_are_skipped(tmp_path):
    write(tmp_path, "a_syntax.py", f'"""{PROSE}"""\ndef broken(:\n')
    write(tmp_path, "b_py2.py", f'"""Python 2: {PROSE}"""\nprint "hello"\n')
    write(tmp_path, "c_bytes.py", b'"""Bad bytes \xff\xfe: ' + PROSE.encode() + b'"""\n')
    write(tmp_path, "d_huge.py", f'"""Huge: {PROSE}"""\n' + "x = 1\n" * 400_000)
    write(tmp_path, "e_latin1.py", b"# -*- coding: latin-1 -*-\n\"\"\"Caf\xe9 latin-1: " + PROSE.encode() + b'"""\n')
    write(tmp_path, "f_good.py", f'"""Good: {PROSE}"""\n')
    assert os.path.getsize(tmp_path / "d_huge.py") > python_docs.MAX_FILE_BYTES
    assert docs(tmp_path) == [f"Café latin-1: {PROSE}", f"Good: {PROSE}"]


def test_build_corpus_writes_jsonl_atomically(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for i in range(3):
        write(root, f"m{i}.py", f'"""Document {i}: {PROSE}"""\n')
    write(root, "bad.py", "def (\n")
    monkeypatch.setattr(python_docs, "default_roots", lambda: [str(root)])
    out = tmp_path / "out" / "corpus.jsonl"
    stats = build_corpus(out, max_chars=10**9)
    texts = [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert texts[-3:] == [f"Document {i}: {PROSE}" for i in range(3)]  # after the pydoc topics
    assert texts == list(iter_documents(max_chars=10**9))
    assert stats["documents"] == len(texts) and stats["characters"] == sum(map(len, texts))
    assert stats["files_read"] == 4 and stats["sources"] == ["pydoc_data.topics", str(root)]
    assert stats["seconds"] >= 0
    assert os.listdir(out.parent) == ["corpus.jsonl"]

    # A build that fails halfway leaves the previous corpus untouched and no temp file behind.
    def exploding(*args):
        yield "partial document"
        raise RuntimeError("boom")

    monkeypatch.setattr(python_docs, "_capped", exploding)
    before = out.read_bytes()
    with pytest.raises(RuntimeError):
        build_corpus(out, max_chars=10**9)
    assert out.read_bytes() == before and os.listdir(out.parent) == ["corpus.jsonl"]


def test_real_environment_yields_english_prose():
    documents = list(iter_documents(max_chars=200_000))
    total = sum(map(len, documents))
    assert 200_000 <= total < 200_000 + max(map(len, documents)) + 1
    assert len(documents) == len(set(documents))
    assert sum(" the " in d for d in documents) >= 0.7 * len(documents)
    assert all(">>>" not in d for d in documents)
    assert list(iter_documents(max_chars=200_000)) == documents
