"""Data pipeline: sources, tokenizer, packing, split, cache, ordering, and the error paths."""

import json
import multiprocessing
import os

import numpy as np
import pytest

from cramming.config import DataConfig, HubSource, TokenizerConfig
from cramming.data.loader import epoch_order, open_split, train_batches
from cramming.data.prepare import load_tokenizer, prepare_data
from cramming.data.tokenizer import SPECIAL_TOKENS, train_tokenizer
from cramming.errors import UserError

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches and "
         "pack my box with five dozen liquor jugs how vexingly quick daft zebras jump").split()


def make_corpus(folder, docs=300, seed=0, name="corpus.txt"):
    """Paragraph documents of pseudo-English, each unique (numbered), separated by blank lines."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(docs):
        sentences = [" ".join(rng.choice(WORDS, size=rng.integers(5, 15))) + "." for _ in range(rng.integers(2, 6))]
        texts.append(f"document {i} " + " ".join(sentences))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    return texts


def data_config(path, cache, **overrides) -> DataConfig:
    settings = dict(source="local-text", path=str(path), seq_length=32, vocab_size=300, validation_fraction=0.1,
                    cache_dir=str(cache), tokenizer=TokenizerConfig(kind="wordpiece"))
    return DataConfig(**{**settings, **overrides})


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_tokenizer_round_trip(kind):
    text = [" ".join(WORDS) + "."] * 20
    tok = train_tokenizer(text, kind, vocab_size=200, max_length=64)
    assert tok.convert_ids_to_tokens(list(range(5))) == SPECIAL_TOKENS
    sample = "The quick brown fox jumps over a lazy dog."
    ids = tok(sample)["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert decoded.replace(" ", "") == sample.lower().replace(" ", "")
    pair = tok("a dog", "a fox")["input_ids"]
    assert pair.count(tok.sep_token_id) == 2 and pair[0] == tok.cls_token_id


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_a_pair_marks_its_second_text_as_segment_one(kind):
    """BERT's pair encoding: [CLS] a [SEP] is segment 0 and b [SEP] segment 1 (token_type_ids), so a model or a
    Hugging Face pipeline that reads segments can tell the two texts apart; a single text is all segment 0."""
    tok = train_tokenizer([" ".join(WORDS) + "."] * 20, kind, vocab_size=200, max_length=64)
    pair = tok("a lazy dog", "a quick fox", return_token_type_ids=True)
    ids, types = pair["input_ids"], pair["token_type_ids"]
    first_sep = ids.index(tok.sep_token_id)
    assert ids[-1] == tok.sep_token_id and first_sep < len(ids) - 2
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert set(tok("a lazy dog", return_token_type_ids=True)["token_type_ids"]) == {0}


def test_packing_round_trip_and_no_leakage(tmp_path):
    texts = make_corpus(tmp_path / "src")
    folder, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "cache"))
    tok = load_tokenizer(folder)
    train, val = open_split(folder, meta, "train"), open_split(folder, meta, "val")
    assert len(train) == meta["train_sequences"] > 0 and len(val) == meta["val_sequences"] > 0
    row = train[0]
    assert row.shape == (32,) and row[0] == tok.cls_token_id
    # the streams decode back to the documents, each ending in [SEP], nothing lost or added
    sep = tok.sep_token_id
    decoded = {}
    for split in ("train", "val"):
        stream = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
        pieces = np.split(stream, np.flatnonzero(stream == sep) + 1)[:-1]
        decoded[split] = [tok.decode(p[:-1]) for p in pieces]
    assert len(decoded["train"]) + len(decoded["val"]) == len(texts)
    normalise = lambda s: s.lower().replace(" ", "")
    assert sorted(map(normalise, decoded["train"] + decoded["val"])) == sorted(map(normalise, texts))
    assert not set(decoded["train"]) & set(decoded["val"])  # no document in both splits
    assert 0.03 < len(decoded["val"]) / len(texts) < 0.2  # about validation_fraction=0.1


def test_packed_stream_is_the_plain_per_document_encoding(tmp_path):
    """The fast paths (encode_batch_fast, one write per batch and split, period counts read in blocks) give exactly
    the stream of plain per-document encodings, each closed by [SEP], and the counts of the rows read back."""
    import hashlib

    texts = make_corpus(tmp_path / "src")
    folder, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "cache"))
    tok = load_tokenizer(folder)
    streams = {"train": [], "val": []}
    for text in texts:
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        split = "val" if int.from_bytes(digest[:8], "little") / 2**64 < 0.1 else "train"
        streams[split] += tok.backend_tokenizer.encode(text, add_special_tokens=False).ids + [tok.sep_token_id]
    for split, ids in streams.items():
        assert np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"]).tolist() == ids
    train = open_split(folder, meta, "train")
    expected = [int((train[i][1:] == meta["period_id"]).sum()) for i in range(len(train))]
    assert np.load(folder / "train_periods.npy").tolist() == expected
    assert train.count_per_sequence(meta["period_id"], block=3).tolist() == expected  # blocks not dividing it


def test_dedup_filter_and_caps(tmp_path):
    texts = make_corpus(tmp_path / "src", docs=100)
    (tmp_path / "src" / "copy.txt").write_text("\n\n".join(texts[:40]), encoding="utf-8")
    _, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "c1"))
    assert meta["duplicates"] == 40 and meta["documents_read"] == 140
    _, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "c2", dedup=False))
    assert meta["duplicates"] == 0 and meta["train_documents"] + meta["val_documents"] == 140
    _, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "c3", max_tokens=800))
    assert 800 <= meta["train_tokens"] + meta["val_tokens"] < 800 + 512 * 60
    with pytest.raises(UserError, match="no training text left.*filter_threshold"):
        prepare_data(data_config(tmp_path / "src", tmp_path / "c4", filter_threshold=0.01))


def test_filter_drops_incompressible_documents(tmp_path):
    texts = make_corpus(tmp_path / "src", docs=200)
    rng = np.random.default_rng(1)
    junk = [" ".join("".join(rng.choice(list("qxzjvkw0123456789"), size=8)) for _ in range(25)) for _ in range(20)]
    (tmp_path / "src" / "junk.txt").write_text("\n\n".join(junk), encoding="utf-8")
    _, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "c", filter_threshold=0.3))
    assert meta["filtered"] >= 20
    assert meta["train_documents"] + meta["val_documents"] >= len(texts) - 5


def test_cache_is_reused_and_keyed_by_config(tmp_path):
    make_corpus(tmp_path / "src")
    cfg = data_config(tmp_path / "src", tmp_path / "cache")
    folder, _ = prepare_data(cfg)
    stamp = os.stat(folder / "meta.json").st_mtime_ns
    again, _ = prepare_data(cfg)
    assert again == folder and os.stat(folder / "meta.json").st_mtime_ns == stamp
    other, _ = prepare_data(data_config(tmp_path / "src", tmp_path / "cache", vocab_size=310))
    assert other != folder
    same_data_other_order, _ = prepare_data(data_config(tmp_path / "src", tmp_path / "cache", ordering="sentence-length"))
    assert same_data_other_order == folder  # ordering is applied at load time, not baked into the cache


def _build_in_process(args):
    path, cache = args
    folder, _ = prepare_data(data_config(path, cache))
    return str(folder), (folder / "train.bin").read_bytes()


def test_concurrent_builds_share_one_cache(tmp_path):
    make_corpus(tmp_path / "src", docs=400)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_build_in_process, [(tmp_path / "src", tmp_path / "cache")] * 2)
    assert results[0] == results[1]
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_sentence_length_ordering(tmp_path):
    make_corpus(tmp_path / "src")
    folder, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "cache"))
    periods = np.load(folder / "train_periods.npy")
    order = epoch_order(folder, meta["train_sequences"], "sentence-length", seed=0, epoch=0)
    assert sorted(order.tolist()) == list(range(meta["train_sequences"]))
    assert (np.diff(periods[order]) >= 0).all()
    random_order = epoch_order(folder, meta["train_sequences"], "random", seed=0, epoch=0)
    assert not (np.diff(periods[random_order]) >= 0).all()
    assert (epoch_order(folder, meta["train_sequences"], "random", 0, 1) != random_order).any()


def test_train_batches_cycle_epochs(tmp_path):
    make_corpus(tmp_path / "src", docs=60)
    folder, meta = prepare_data(data_config(tmp_path / "src", tmp_path / "cache"))
    n = meta["train_sequences"]
    batches = train_batches(folder, meta, "random", seed=0, microbatch_size=1, num_workers=0, pin_memory=False)
    rows = [tuple(next(batches)[0].tolist()) for _ in range(2 * n)]
    train = open_split(folder, meta, "train")
    assert sorted(rows[:n]) == sorted(tuple(train[i].tolist()) for i in range(n))  # epoch 1: each once
    assert sorted(rows[n:]) == sorted(rows[:n])  # epoch 2: each once again


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet", "json"])
def test_structured_files(tmp_path, suffix):
    import pandas as pd

    texts = make_corpus(tmp_path / "plain")
    frame = pd.DataFrame({"body": texts, "id": range(len(texts))})
    path = tmp_path / f"data.{suffix}"
    {"jsonl": lambda: frame.to_json(path, orient="records", lines=True),
     "json": lambda: frame.to_json(path, orient="records", lines=True),
     "csv": lambda: frame.to_csv(path, index=False),
     "parquet": lambda: frame.to_parquet(path)}[suffix]()
    _, meta = prepare_data(data_config(path, tmp_path / "cache", text_field="body"))
    assert meta["documents_read"] == len(texts)
    with pytest.raises(UserError, match="no field 'text'.*data.text_field"):
        prepare_data(data_config(path, tmp_path / "cache2", text_field="text"))


def test_error_paths(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match="no such file or folder"):
        prepare_data(data_config(tmp_path / "missing.txt", cache))
    with pytest.raises(UserError, match="matched no files"):
        prepare_data(data_config(tmp_path / "*.nothing", cache))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no data files"):
        prepare_data(data_config(tmp_path / "empty", cache))
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"abc\x00\x01\x02" * 100)
    with pytest.raises(UserError, match="blob.txt looks binary"):
        prepare_data(data_config(binary, cache))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 cr\u00e8me ".encode("latin-1") * 50)
    with pytest.raises(UserError, match="latin.txt is not valid utf-8 at byte 3 \\(line 1:"):
        prepare_data(data_config(latin, cache))
    small = tmp_path / "small.txt"
    small.write_text("just a few words here.\n\nand a second tiny paragraph.\n")
    with pytest.raises(UserError, match="too little data|no training text"):
        prepare_data(data_config(small, cache))
    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(b"%PDF-1.7\n\x00\x00binary")
    with pytest.raises(UserError, match="paper.pdf looks binary"):
        prepare_data(data_config(tmp_path / "*.pdf", cache))


def test_hub_offline_says_how_to_use_local_text(tmp_path):
    cfg = DataConfig(source="hub", hub=[HubSource(path="Salesforce/wikitext", name="wikitext-103-raw-v1")],
                     cache_dir=str(tmp_path))
    with pytest.raises(UserError, match="cannot be reached.*data=local-text"):
        prepare_data(cfg)


def test_an_unreachable_hub_is_one_line_in_seconds_without_the_offline_variables(tmp_path, monkeypatch):
    """The same probe as eval.py's (cramming/hub.py): one connection attempt, not the client's retries."""
    import time

    from cramming import hub

    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    hub._probe.cache_clear()
    cfg = DataConfig(source="hub", hub=[HubSource(path="Salesforce/wikitext", name="wikitext-103-raw-v1")],
                     cache_dir=str(tmp_path))
    started = time.perf_counter()
    with pytest.raises(UserError, match=r"cannot be reached \(cannot connect to 127.0.0.1:9.*data=local-text"):
        prepare_data(cfg)
    assert time.perf_counter() - started < 5.0
    hub._probe.cache_clear()


def test_sanity_source(tmp_path):
    folder, meta = prepare_data(DataConfig(source="sanity", vocab_size=256, seq_length=32, max_chars=100_000,
                                           validation_fraction=0.05, cache_dir=str(tmp_path)))
    assert meta["train_sequences"] > 100 and json.loads((folder / "meta.json").read_text())["vocab_size"] <= 256


RSS_SCRIPT = """
import resource, sys
from cramming.config import DataConfig, TokenizerConfig
from cramming.data.prepare import prepare_data
cfg = DataConfig(source="local-text", path=sys.argv[1], seq_length=128, vocab_size=2048, cache_dir=sys.argv[2],
                 tokenizer=TokenizerConfig(kind="wordpiece", train_max_chars=1_000_000))
prepare_data(cfg)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_peak_memory_does_not_grow_with_the_corpus(tmp_path):
    """Build caches from 6 MB and from 17 MB of distinct text: the peak RSS must not grow with the corpus.
    Keeping the extra 3 M tokens as Python ints would cost over 100 MB, their text ~12 MB; the allowance is
    for allocator arenas that keep warming up over the first MBs (measured: +0 to +26 MB between the two)."""
    import subprocess
    import sys

    from conftest import needs_shared

    books = sorted(needs_shared("gutenberg-nltk").glob("*.txt"))
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in books)
    variants = [text, text.replace("e", "E"), text.replace("a", "A")]  # distinct documents, same statistics
    peaks = []
    for name, parts in (("small", variants[:1]), ("large", variants)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text("\n\n".join(parts), encoding="utf-8")
        out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tmp_path / name), str(tmp_path / f"cache-{name}")],
                             capture_output=True, text=True, check=True)
        peaks.append(int(out.stdout.strip().splitlines()[-1]) / 1024)  # MiB
    assert peaks[1] - peaks[0] < 40, peaks


def test_seen_hashes_is_an_exact_set_across_growth():
    from cramming.data.dedup import SeenHashes

    rng = np.random.default_rng(0)
    digests = [rng.bytes(16) for _ in range(50_000)]
    seen = SeenHashes(capacity=16)
    assert all(seen.add(d) for d in digests)
    assert not any(seen.add(d) for d in digests[::7])
    assert seen.count == 50_000 and len(seen.table) >= 100_000


def test_dedup_memory_is_what_the_docs_say():
    """16 bytes per document just before the table doubles, 32 right after: dedup.py says so (docs/data.md's
    sentence is checked in test_help.py)."""
    from cramming.data import dedup

    rng = np.random.default_rng(1)
    seen, per_doc = dedup.SeenHashes(capacity=16), []
    for _ in range(20_000):
        size = len(seen.table)
        seen.add(rng.bytes(16))
        if len(seen.table) != size or (seen.count + 1) * 2 > size:  # it just doubled, or the next add doubles it
            per_doc.append(seen.table.nbytes / seen.count)
    assert min(per_doc) == 16 and 31.9 < max(per_doc) < 32
    assert "16 bytes per document just" in dedup.__doc__ and "32 right after" in dedup.__doc__


def test_python_docs_key_follows_what_is_installed_where_the_corpus_reads(tmp_path, monkeypatch):
    """The key reads the distributions in the corpus's own folders: a folder put on sys.path mid-run (importing
    setuptools adds its _vendor folder, between the jobs of a multirun) keeps it; a new distribution there
    changes it (its docstrings may join the corpus)."""
    import sys
    from types import SimpleNamespace

    from cramming.data import sources

    def dist_info(folder, name, version="1.0"):
        info = tmp_path / folder / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")

    def key():
        return sources.PythonDocs(SimpleNamespace(max_chars=1000), tmp_path).corpus.name

    dist_info("site", "first-pkg")
    monkeypatch.setattr(sources, "default_roots", lambda: [str(tmp_path / "site")])
    before = key()
    dist_info("vendored", "vendored-pkg")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "vendored"), *sys.path])
    assert key() == before
    dist_info("site", "brand-new-pkg")
    assert key() != before
