"""Default offline pretraining corpus: English prose from the Python installation's own docs.

Every machine that runs this project has a Python installation, and it ships real English:
the ``pydoc_data`` help topics and the docstrings of the standard library and of the installed
packages. Collected with ``ast`` (never imported), they give ``data=python-docs`` a corpus that
needs no download. Output is deterministic: topics by key, then files in sorted path order.
"""
from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import inspect
import itertools
import json
import multiprocessing
import os
import re
import sys
import sysconfig
import time
import warnings
from collections.abc import Iterator

from tqdm import tqdm

from ..atomic import atomic_open

MIN_CHARS = 80  # shorter paragraphs are mostly signatures, headings and fragments
MAX_FILE_BYTES = 2_000_000  # giant files are generated tables and data, not prose
MAX_WORKERS = 8
TOPICS = "pydoc_data.topics"
SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}
# A line ending in ":" introduces a code block, unless it is an admonition or a list item.
_NOT_CODE_INTRO = re.compile(r"(notes?|see also|warning|caution|important|tip|hint|attention|danger|"
                             r"(changed|new|added) in version|deprecated)\b|[-*+]\s|\d+[.)]\s", re.IGNORECASE)
_FIELD = re.compile(r":\w[^:`]*:(\s|$)|[\w.*]+(,\s*[\w.*]+)*\s+:(\s|$)")  # ":param x:", "x : int"
_ROLE = re.compile(r":[\w.:+-]+:`~?!?([^`]*?)`")  # :func:`~x.y` -> x.y
_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{0,2}")  # `text <url>`_ -> text
_TICKS = re.compile(r"``(.*?)``|`([^`]*)`_{0,2}")  # ``x``, `x` -> x
_EMPHASIS = re.compile(r"\*{1,2}([^*\s](?:[^*]*?[^*\s])?)\*{1,2}")  # *x*, **x** -> x
_LOWER_WORD = re.compile(r"(?<!\S)[a-z]+(?!\S)")
_SYMBOL = re.compile(r"[^\w\s]|_")  # counting with re is ~10x faster than a Python loop
_NOT_LETTER_OR_SPACE = re.compile(r"[^\w ]|[\d_]")
_SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Only these statements can contain a def or class; the rest of the tree is never visited.
_COMPOUND = (*_SCOPES, ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
             getattr(ast, "TryStar", ast.Try), ast.ExceptHandler, ast.Match, ast.match_case)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_symbol_line(stripped: str) -> bool:
    """Underlines (=====), table rows and borders, other lines made mostly of punctuation."""
    nonspace = len(stripped) - stripped.count(" ")
    return stripped[0] in "|+" or nonspace >= 3 and (nonspace - len(_SYMBOL.findall(stripped))) * 3 < nonspace


def _prose_lines(text: str) -> list[str]:
    """Drop doctests, code blocks, field and symbol lines; blank lines ("") stay as separators."""
    kept: list[str] = []
    in_doctest, block_indent = False, None  # block_indent: indentation of the line opening a code block
    for line in inspect.cleandoc(text).splitlines():
        stripped = line.strip()
        if not stripped:
            in_doctest = False
            kept.append("")
            continue
        if block_indent is not None and _indent(line) > block_indent:
            continue
        block_indent = None
        if in_doctest or stripped.startswith(">>>"):  # a doctest runs (with its output) to a blank line
            in_doctest = True
        elif _is_symbol_line(stripped):
            if kept and kept[-1]:  # an underline: the line above it was a heading
                kept[-1] = ""
        elif _indent(line) < 4 and not _FIELD.match(stripped):
            if stripped.endswith(":") and not _NOT_CODE_INTRO.match(stripped):
                block_indent = _indent(line)
                line = line.rstrip()[:-1] if stripped.endswith("::") else line  # "Example::" -> "Example:"
            if line.strip() != ":":
                kept.append(line)
    return kept


def _collapse_markup(text: str) -> str:
    text = _LINK.sub(r"\1", _ROLE.sub(r"\1", text))
    text = _TICKS.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return _EMPHASIS.sub(r"\1", text)


def _is_prose(paragraph: str, min_chars: int) -> bool:
    return (len(paragraph) >= min_chars
            and len(_NOT_LETTER_OR_SPACE.sub("", paragraph)) >= 0.6 * len(paragraph)  # letters or spaces
            and _LOWER_WORD.search(paragraph) is not None)


def clean_docstring(text: str, min_chars: int = MIN_CHARS) -> str:
    """The prose paragraphs of one docstring (each on one line), joined by blank lines; "" if none."""
    paragraphs, current = [], []
    for line in _prose_lines(text) + [""]:
        if line:
            current.append(line.strip())
        elif current:
            paragraph = " ".join(_collapse_markup(" ".join(current)).split())
            if _is_prose(paragraph, min_chars):
                paragraphs.append(paragraph)
            current = []
    return "\n\n".join(paragraphs)


def _docstrings(node: ast.AST) -> Iterator[str]:
    """Module, class and function docstrings in source order."""
    if isinstance(node, _SCOPES) and (doc := ast.get_docstring(node, clean=False)):
        yield doc
    for field in ("body", "handlers", "orelse", "finalbody", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, _COMPOUND):
                yield from _docstrings(child)


def _python_files(root: str) -> Iterator[str]:
    """*.py files under root in sorted full-path order, lazily (so a capped walk stops early)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    # Sorted as full paths sort: directory "a" sorts as "a/", i.e. after "a.py".
    for entry in sorted(entries, key=lambda e: e.name + "/" if e.is_dir(follow_symlinks=False) else e.name):
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in SKIP_DIRS and not entry.name.startswith("."):
                yield from _python_files(entry.path)
        elif entry.name.endswith(".py") and not entry.name.startswith("test_") and entry.is_file():
            yield entry.path


def _file_documents(path: str) -> list[str]:
    """Cleaned documents of one file; [] for files too big, undecodable or unparsable. Runs in workers."""
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return []
        with open(path, "rb") as f:
            source = f.read()
        if b'"""' not in source and b"'''" not in source:
            return []  # skips ~20 % of the files; measured: not one character of output lost
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a parse allocates up to ~1M tree objects; GC passes during it cost ~30 %
        try:
            with warnings.catch_warnings():  # invalid escape sequences etc. are not our business
                warnings.simplefilter("ignore")
                tree = ast.parse(source, filename=path)  # from bytes: honours PEP 263 coding cookies
        finally:
            if gc_was_enabled:
                gc.enable()
    except (OSError, SyntaxError, ValueError, UnicodeError, RecursionError, MemoryError):
        return []
    # "replace" turns lone surrogates (from "\ud800"-style escapes) into "?", so the output is valid UTF-8.
    documents = (clean_docstring(doc).encode("utf-8", "replace").decode() for doc in _docstrings(tree))
    return [doc for doc in documents if doc]


def default_roots() -> list[str]:
    """stdlib, then purelib and platlib (each once)."""
    roots: list[str] = []
    for key in ("stdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and os.path.realpath(path) not in map(os.path.realpath, roots):
            roots.append(path)
    return roots


def _pool():
    """Parsing is CPU-bound: fan files out to forked workers on Linux; elsewhere run in-process.

    Fork is what torch's DataLoader uses on Linux too; the workers only parse text and never touch
    CUDA. imap keeps the file order, so the output does not depend on the number of workers.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if sys.platform != "linux" or min(cores, MAX_WORKERS) < 2:
        return contextlib.nullcontext()
    return multiprocessing.get_context("fork").Pool(min(cores, MAX_WORKERS))


def _documents(roots: list[str] | None, max_files: int | None, stats: dict) -> Iterator[str]:
    """All documents, exact-deduplicated (the first one is kept), uncapped."""
    seen: set[bytes] = set()

    def unique(documents) -> Iterator[str]:
        for document in documents:
            if (digest := hashlib.blake2b(document.encode(), digest_size=16).digest()) not in seen:
                seen.add(digest)
                yield document

    if roots is None:
        from pydoc_data.topics import topics  # CPython's help texts (0.7 MB): only for this source

        yield from unique(doc for doc in (clean_docstring(topics[key]) for key in sorted(topics)) if doc)
    paths = itertools.chain.from_iterable(map(_python_files, default_roots() if roots is None else roots))
    paths = itertools.islice(paths, max_files)
    with _pool() as pool:  # leaving the block (cap reached, generator closed) terminates the workers
        for documents in pool.imap(_file_documents, paths, 8) if pool else map(_file_documents, paths):
            stats["files_read"] += 1
            yield from unique(documents)


def _capped(max_chars: int, max_files: int | None, roots: list[str] | None, stats: dict) -> Iterator[str]:
    characters = 0
    with contextlib.closing(_documents(roots, max_files, stats)) as documents:
        for document in documents if max_chars > 0 else ():
            yield document
            characters += len(document)
            if characters >= max_chars:
                return


def iter_documents(max_chars: int, max_files: int | None = None, roots: list[str] | None = None) -> Iterator[str]:
    """Yield cleaned prose documents until max_chars characters have been yielded (stop at the document that crosses it)."""
    return _capped(max_chars, max_files, roots, {"files_read": 0})


def build_corpus(path: str | os.PathLike, max_chars: int) -> dict:
    """Write the corpus as JSON Lines ({"text": ...} per line) to `path` atomically and return its stats.

    Atomic (temp file in the same folder, fsync, os.replace) so that a crashed or concurrent build
    never leaves a half-written corpus behind for a later run to trust.
    """
    start, stats, documents, characters = time.perf_counter(), {"files_read": 0}, 0, 0
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8") as f, \
            tqdm(desc="python-docs corpus", total=sum(1 for root in default_roots() for _ in _python_files(root)),
                 unit=" file", mininterval=2) as bar:  # the total: one quick walk (about a second)
        for document in _capped(max_chars, None, None, stats):
            f.write(json.dumps({"text": document}, ensure_ascii=False) + "\n")
            documents, characters = documents + 1, characters + len(document)
            bar.update(stats["files_read"] - bar.n)
    return {"documents": documents, "characters": characters, "files_read": stats["files_read"],
            "sources": [TOPICS, *default_roots()], "seconds": time.perf_counter() - start}
