"""Raw text sources by name (`data.source`). Each gives documents and a fingerprint for the cache key."""

import hashlib
import importlib.metadata
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

from ..config import DataConfig
from ..registry import Registry, invalid
from . import hub, local_text
from .python_docs import build_corpus, default_roots

SOURCES = Registry("data source")
SOURCES.serves(DataConfig, "source")


def installed_in(roots: list[str]) -> list[str]:
    """name==version of the distributions installed in the folders the corpus reads. Not sys.path: importing
    setuptools puts its _vendor folder there mid-run, which would give the next job of a multirun another key."""
    return sorted({f"{d.metadata['Name']}=={d.version}".lower() for d in importlib.metadata.distributions(path=roots)})


@SOURCES.register("python-docs")
class PythonDocs:
    """The embedded default: prose documentation shipped with this Python installation (see python_docs.py)."""

    def __init__(self, cfg, cache_dir: Path):
        self.cap = cfg.max_chars or 20_000_000
        # The text depends on the Python version and on which packages are installed: key the corpus by both.
        installed = installed_in(default_roots())
        env = hashlib.sha256(json.dumps([sys.version, installed]).encode()).hexdigest()[:12]
        self.corpus = cache_dir / f"python-docs-{env}-{self.cap}.jsonl"

    def fingerprint(self):
        return ["python-docs", str(self.corpus)]

    def size_hint(self) -> int | None:
        """Characters in the corpus once it is built (a progress bar's total)."""
        if not self.corpus.exists():
            return None
        with open(self.corpus, encoding="utf-8") as fh:
            return sum(len(json.loads(line)["text"]) for line in fh)

    def documents(self) -> Iterator[str]:
        if not self.corpus.exists():
            print(f"building the python-docs corpus (up to {self.cap:,} characters) ...", flush=True)
            stats = build_corpus(self.corpus, max_chars=self.cap)
            print(f"python-docs corpus: {stats['documents']:,} documents, {stats['characters']:,} characters, "
                  f"{stats['seconds']:.1f} s", flush=True)
        with open(self.corpus, encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)["text"]


@SOURCES.register("local-text")
class LocalText:
    """Your own files: plain text, JSON lines or a JSON array (data.path, data.text_field; data/local_text.py)."""

    @staticmethod
    def problem(config) -> str | None:
        if not config.data.path:
            return invalid("data.path", config.data.path, "data=local-text needs data.path=<file, folder or glob>")
        return None

    def __init__(self, cfg, cache_dir: Path):
        self.files = local_text.resolve_files(cfg.path)
        self.text_field, self.encoding, self.encoding_errors = cfg.text_field, cfg.encoding, cfg.encoding_errors

    def fingerprint(self):
        return ["local-text", self.text_field, local_text.fingerprint(self.files)]  # encoding: in the settings

    def size_hint(self) -> int:
        """The files' bytes: about their characters (exact for ASCII), a progress bar's total."""
        return sum(f.stat().st_size for f in self.files)

    def documents(self) -> Iterator[str]:
        return local_text.iter_documents(self.files, self.text_field, self.encoding, self.encoding_errors)


@SOURCES.register("hub")
class Hub:
    """A Hugging Face hub dataset's text field, streamed (data.hub: its path, name, split and field)."""

    @staticmethod
    def problem(config) -> str | None:
        hub = config.data.hub
        if not (hub and all(h.path for h in hub)):
            return invalid("data.hub", hub, "name at least one hub dataset path")
        return None

    def __init__(self, cfg, cache_dir: Path):
        self.sources = cfg.hub

    def fingerprint(self):
        return ["hub", [[s.path, s.name, s.split, s.text_field] for s in self.sources]]

    def size_hint(self) -> None:
        return None  # streamed: unknown until read

    def documents(self) -> Iterator[str]:
        return hub.iter_documents(self.sources)


@SOURCES.register("sanity")
class Sanity:
    """Random words from a small made-up lexicon: no meaning, only for smoke tests of the machinery."""

    def __init__(self, cfg, cache_dir: Path):
        self.cap = cfg.max_chars or 2_000_000

    def fingerprint(self):
        return ["sanity", self.cap]

    def size_hint(self) -> int:
        return self.cap

    def documents(self) -> Iterator[str]:
        rng = random.Random(0)
        letters = "abcdefghijklmnopqrstuvwxyz"
        lexicon = ["".join(rng.choices(letters, k=rng.randint(2, 8))) for _ in range(2000)]
        produced = 0
        while produced < self.cap:
            doc = " ".join(rng.choices(lexicon, k=rng.randint(50, 300))) + "."
            produced += len(doc)
            yield doc


def open_source(cfg, cache_dir: Path):
    os.makedirs(cache_dir, exist_ok=True)
    return SOURCES.get_or_explain(cfg.source)(cfg, cache_dir)
