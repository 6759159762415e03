"""Turn a text source into a cached, packed token stream: the one place data is prepared.

Two streaming passes over the source (memory does not grow with the corpus, except for the compact
table of 8-byte document hashes used for deduplication, see dedup.py): pass 1 trains the tokenizer on a capped sample, pass 2
deduplicates, tokenizes in batches, filters by compressibility, splits documents into train and
validation by a hash of their text (so no document is ever in both) and appends token ids to two flat
files. Each document ends in [SEP]; a training sequence is [CLS] + the next seq_length-1 stream tokens,
crossing document boundaries, with no padding.

The result lives in `<cache_dir>/<hash of the data config and input>/` and is built in a temporary
folder under a file lock, then renamed into place, so concurrent sweep jobs share one build.
"""

import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..atomic import locked
from ..errors import UserError
from ..outputs import writing
from .dedup import SeenHashes
from .packed import PackedTokens
from .share import use_prepared
from .sources import open_source
from .tokenizer import TOKENIZER_KINDS, load_pretrained_tokenizer, read_tokenizer, train_tokenizer

PIPELINE_VERSION = 1
BATCH_DOCS, BATCH_CHARS = 512, 1 << 19  # one tokenizer call: bounded in documents and in text


def cache_key(cfg, fingerprint) -> str:
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("cache_dir", "ordering", "prepared", "document_masking")}
    blob = json.dumps([PIPELINE_VERSION, settings, fingerprint], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prepare_data(cfg) -> tuple[Path, dict]:
    """Return the cache folder for this data config (building it if needed) and its metadata; with
    data.prepared, that folder (an exported dataset imported into the cache first, share.py)."""
    if cfg.prepared:
        folder, meta = use_prepared(cfg)
        size = len(load_tokenizer(folder))  # someone else's folder: its tokenizer must be its vocabulary
        if size != meta["vocab_size"]:
            raise UserError(f"data.prepared={cfg.prepared}: meta.json gives a vocabulary of {meta['vocab_size']:,}, "
                            f"its tokenizer has {size:,} tokens; not a prepared folder cramming wrote")
    else:
        cache_root = Path(os.path.expanduser(cfg.cache_dir)).resolve()
        source = open_source(cfg, cache_root)
        folder = cache_root / cache_key(cfg, source.fingerprint())
        if not (folder / "meta.json").exists():
            # a second job waits at the lock, then finds the finished cache; a full or read-only cache: one line
            with writing(cache_root, "the prepared data"), locked(folder):
                if not (folder / "meta.json").exists():
                    _build(cfg, source, folder)
        meta = json.loads((folder / "meta.json").read_text())
    print(f"data: {meta['train_sequences']:,} train / {meta['val_sequences']:,} validation sequences "
          f"of {cfg.seq_length} tokens from {folder}", flush=True)
    return folder, meta


def load_tokenizer(folder: Path):
    """A prepared folder's tokenizer (the cache's, or data.prepared's someone else made): files bounded in size,
    no code run."""
    return read_tokenizer(folder / "tokenizer", f"prepared data {folder}", fast=False)


# A document longer than this is tokenized in pieces of at most this many characters, cut at a space: the packed
# stream is the same but for the tokens at the cuts, and no single encoding grows with a file someone else wrote
# (a 200 MB line once made the tokenizer abort the process). Real documents (a book: about 500,000) stay whole.
PIECE_CHARS = 1_000_000


def pieces(doc: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    """`doc` in pieces of at most `limit` characters, each cut after the last space before the limit (or at the
    limit where there is none); a document within the limit is its only piece."""
    start = 0
    while len(doc) - start > limit:
        cut = doc.rfind(" ", start, start + limit)
        cut = cut + 1 if cut > start else start + limit
        yield doc[start:cut]
        start = cut
    yield doc[start:]


def _capped(docs: Iterable[str], max_chars: int | None) -> Iterator[str]:
    used = 0
    for doc in (piece for whole in docs for piece in pieces(whole)):
        if max_chars is not None and used >= max_chars:
            return
        used += len(doc)
        yield doc


def _progress(desc: str, docs: Iterable[str], source, cap: int | None) -> Iterator[str]:
    """A bar of characters read (k/M per second, never seconds per document), out of the source's size where
    it is known, capped. A file's size in bytes only estimates its documents' characters, so a source read to
    its end ends at 100 %. The bar opens at the first document: python-docs builds its corpus on the first read,
    with its own lines and bar, which an open bar would share a line with and count as reading time (an ETA of
    hundreds of hours); built, the corpus also knows its size."""
    docs = iter(docs)
    first = next(docs, None)
    total = source.size_hint()
    if total is not None and cap:
        total = min(total, cap)
    bar = tqdm(desc=desc, total=total, unit="char", unit_scale=True, mininterval=2)
    try:
        for doc in itertools.chain([] if first is None else [first], docs):
            bar.update(len(doc))
            yield doc
        bar.total = bar.n
        bar.refresh()
    finally:
        bar.close()


def _batches(docs: Iterator[str]) -> Iterator[list[str]]:
    """Group documents for batched encoding, capped in characters too: token encodings cost ~100 bytes per
    token while they live, so a batch of a few huge documents must not grow memory with the corpus."""
    batch, chars = [], 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc)
        if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _build(cfg, source, folder: Path) -> None:
    started = time.time()
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tokenizer = _get_tokenizer(cfg, source)
        tokenizer.save_pretrained(tmp / "tokenizer")
        stats = _tokenize_and_pack(cfg, source, tokenizer, tmp)
        meta = {
            "pipeline_version": PIPELINE_VERSION,
            "seq_length": cfg.seq_length,
            "vocab_size": len(tokenizer),
            "dtype": stats.pop("dtype"),
            "special_ids": {
                "pad": tokenizer.pad_token_id, "cls": tokenizer.cls_token_id,
                "sep": tokenizer.sep_token_id, "mask": tokenizer.mask_token_id,
            },
            "period_id": tokenizer.convert_tokens_to_ids("."),
            "source_fingerprint": source.fingerprint(),
            "seconds": round(time.time() - started, 2),
            **stats,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))  # written last: marks the build complete
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _get_tokenizer(cfg, source):
    kind = cfg.tokenizer.kind
    if kind not in TOKENIZER_KINDS:
        return load_pretrained_tokenizer(kind, cfg.seq_length)
    cap = min(cfg.tokenizer.train_max_chars, cfg.max_chars or cfg.tokenizer.train_max_chars)
    docs = _progress("training tokenizer", _capped(source.documents(), cap), source, cap)
    tokenizer = train_tokenizer(docs, kind, cfg.vocab_size, cfg.seq_length, cfg.lowercase, cfg.strip_accents,
                                cfg.ascii_only)
    if len(tokenizer) < 16:
        raise UserError("the corpus is empty: the tokenizer learned no vocabulary; check data.path / data.source")
    return tokenizer


def encoder(tokenizer):
    """The backend's batch encoder without special tokens. `encode_batch_fast` (tokenizers >= 0.21) gives the same
    ids without tracking character offsets, which we never read: about a quarter of the encoding time."""
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return lambda texts: encode(texts, add_special_tokens=False)


def _tokenize_and_pack(cfg, source, tokenizer, tmp: Path) -> dict:
    encode = encoder(tokenizer)
    dtype = np.uint16 if len(tokenizer) <= 2**16 else np.uint32
    sep = tokenizer.sep_token_id
    counts = {"documents_read": 0, "duplicates": 0, "filtered": 0, "train_documents": 0, "val_documents": 0}
    tokens = {"train": 0, "val": 0}
    seen = SeenHashes()
    files = {split: open(tmp / f"{split}.bin", "wb") for split in ("train", "val")}
    docs = _progress("tokenizing", _capped(source.documents(), cfg.max_chars), source, cfg.max_chars)
    try:
        for batch in _batches(docs):
            keep, digests = [], []
            for text in batch:
                digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest()
                if cfg.dedup and not seen.add(digest):
                    counts["duplicates"] += 1
                    continue
                keep.append(text)
                digests.append(digest)
            counts["documents_read"] += len(batch)
            pending = {"train": [], "val": []}  # this batch's ids per split, written in one call each
            for text, digest, enc in zip(keep, digests, encode(keep)):
                ids = enc.ids
                if not ids or (cfg.filter_threshold is not None and len(ids) / len(text) >= cfg.filter_threshold):
                    counts["filtered"] += 1
                    continue
                split = "val" if int.from_bytes(digest[:8], "little") / 2**64 < cfg.validation_fraction else "train"
                pending[split].extend(ids)
                pending[split].append(sep)
                tokens[split] += len(ids) + 1
                counts[f"{split}_documents"] += 1
            for split, ids in pending.items():
                np.array(ids, dtype=dtype).tofile(files[split])
            if cfg.max_tokens is not None and tokens["train"] + tokens["val"] >= cfg.max_tokens:
                break
    finally:
        docs.close()  # ends the bar
        for fh in files.values():
            fh.close()

    stats = _enough_data(cfg, counts, tokens, dtype)
    periods = PackedTokens(tmp / "train.bin", dtype, cfg.seq_length, tokenizer.cls_token_id).count_per_sequence(
        tokenizer.convert_tokens_to_ids(".")
    )
    np.save(tmp / "train_periods.npy", periods)
    return stats


def _enough_data(cfg, counts: dict, tokens: dict, dtype) -> dict:
    """The cache's statistics, or why the text left after dedup and filtering cannot make a run."""
    if counts["train_documents"] == 0:
        raise UserError(
            f"no training text left: {counts['documents_read']} documents read, {counts['duplicates']} duplicates, "
            f"{counts['filtered']} dropped by data.filter_threshold={cfg.filter_threshold}; "
            "check the data or raise/disable the filter (data.filter_threshold=null)"
        )
    stride = cfg.seq_length - 1
    stats = {
        **counts,
        "train_tokens": tokens["train"],
        "val_tokens": tokens["val"],
        "train_sequences": tokens["train"] // stride,
        "val_sequences": tokens["val"] // stride,
        "dtype": np.dtype(dtype).name,
    }
    if stats["train_sequences"] == 0 or stats["val_sequences"] == 0:
        raise UserError(
            f"too little data: {tokens['train']:,} train and {tokens['val']:,} validation tokens make "
            f"{stats['train_sequences']} / {stats['val_sequences']} sequences of {cfg.seq_length}; "
            "give more text, or raise data.validation_fraction"
        )
    return stats
