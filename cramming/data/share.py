"""Prepared data as a Hugging Face dataset, out and back in (`data.prepared`), the way upstream Cramming shares its
pre-tokenized corpora: prepare once (`data_only=true`, on a CPU machine), share the folder, train elsewhere.

A prepared cache folder (prepare.py) holds the token streams `train.bin` / `val.bin`, `meta.json` and the tokenizer.
Exported, each split becomes a dataset of rows `input_ids`, the sequences a run trains on ([CLS] + seq_length - 1
stream tokens, the stream's tail that fills no sequence left out), beside `tokenizer/` and `cramming_meta.json`:
`save_to_disk`'s layout (format arrow) or one parquet file per split (format parquet). Read back, the rows give
the same streams, so a run on the imported folder trains on the same sequences as on the original.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from ..atomic import locked
from ..errors import UserError, exit_on_user_error
from ..outputs import remove, temp_folder, writing
from ..untrusted import read_json, refuse_links_outside
from .packed import PackedTokens

SPLITS = {"train": "train", "val": "validation"}  # the cache's names -> the dataset's
META = "cramming_meta.json"
FORMATS = ("arrow", "parquet")


def export_prepared(folder: Path, out: Path, fmt: str = "arrow") -> Path:
    """Write the prepared folder `folder` as a dataset folder `out` (a new folder: nothing is overwritten)."""
    import datasets  # about 1 s to import: only when a prepared folder is shared

    folder, out = Path(folder), Path(out)
    meta = read_meta(folder)
    if out.exists() or out.is_symlink():
        raise UserError(f"{out} already exists; give a new folder to export into")
    if out.absolute().resolve().is_relative_to(folder.resolve()):
        raise UserError(f"{out} lies inside the prepared folder {folder}, which is read, never written; give a folder "
                        "outside it")
    if fmt not in FORMATS:
        raise UserError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    splits = {}
    for split, name in SPLITS.items():
        rows = PackedTokens(folder / f"{split}.bin", meta["dtype"], meta["seq_length"], meta["special_ids"]["cls"])
        stream = np.asarray(rows.stream[: len(rows) * rows.stride]).reshape(len(rows), rows.stride)
        ids = np.concatenate([np.full((len(rows), 1), rows.cls_id, dtype=stream.dtype), stream], axis=1)
        splits[name] = datasets.Dataset.from_dict({"input_ids": ids})
    with writing(out.absolute().parent, out.name):
        tmp = temp_folder(out.absolute().parent, out.name)  # a folder of this process's own, removed on failure
        try:
            if fmt == "arrow":
                datasets.DatasetDict(splits).save_to_disk(str(tmp))
            else:
                for name, dataset in splits.items():
                    dataset.to_parquet(str(tmp / f"{name}.parquet"))
            shutil.copytree(folder / "tokenizer", tmp / "tokenizer")
            (tmp / META).write_text(json.dumps(meta, indent=2))  # written last: marks the export complete
            os.rename(tmp, out)
        except BaseException:
            remove(tmp)
            raise
    return out


def is_prepared(folder: Path) -> bool:
    return (Path(folder) / "meta.json").is_file() and (Path(folder) / "train.bin").is_file()


def is_exported(folder: Path) -> bool:
    return (Path(folder) / META).is_file()


def import_prepared(path: Path, cache_root: Path) -> Path:
    """The prepared cache folder for an exported dataset folder, built once under `cache_root` (keyed by the
    export's files and sizes) and found again by later runs."""
    path = Path(path)
    refuse_links_outside(path, "a run")
    meta = read_json(path / META, what="exported dataset meta")
    if problem := meta_problem(meta):
        raise UserError(f"{path / META}: {problem}; not a dataset folder cramming exported")
    files = sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*") if p.is_file())
    folder = Path(cache_root) / f"imported-{hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]}"
    if (folder / "meta.json").exists():
        return folder
    with locked(folder), writing(cache_root, "the imported data"):
        if not (folder / "meta.json").exists():
            _unpack(path, meta, folder)
    return folder


def _unpack(path: Path, meta: dict, folder: Path) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        splits = _read_splits(path)
        for split, name in SPLITS.items():
            rows = np.asarray(splits[name]["input_ids"])
            if rows.ndim != 2 or rows.shape[1] != meta["seq_length"]:
                raise UserError(f"{path}: the {name} split's rows are not sequences of {meta['seq_length']} tokens "
                                f"(shape {rows.shape}); it is not an export of a prepared cache")
            rows[:, 1:].astype(meta["dtype"]).tofile(tmp / f"{split}.bin")
        periods = PackedTokens(tmp / "train.bin", meta["dtype"], meta["seq_length"], meta["special_ids"]["cls"])
        np.save(tmp / "train_periods.npy", periods.count_per_sequence(meta["period_id"]))
        shutil.copytree(path / "tokenizer", tmp / "tokenizer")
        (tmp / "meta.json").write_text(json.dumps({**meta, "imported_from": str(path.resolve())}, indent=2))
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_splits(path: Path) -> dict:
    """The exported splits, read by datasets; a folder that is not one (a broken parquet or arrow file, a state
    file nested past the recursion limit, ...) is one line naming it."""
    try:
        return _load_splits(path)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001  datasets and pyarrow fail in many types on a broken folder
        cause = err.__cause__ or err
        raise UserError(f"data.prepared={path}: could not be read as an exported dataset ({type(cause).__name__}: "
                        f"{next((s for s in str(cause).splitlines() if s.strip()), '')[:200]})") from None


def _load_splits(path: Path) -> dict:
    import datasets  # about 1 s to import: only when a run reads a shared dataset folder

    if (path / "dataset_dict.json").is_file():
        return datasets.load_from_disk(str(path)).with_format("numpy")
    files = {name: str(path / f"{name}.parquet") for name in SPLITS.values()}
    missing = [f for f in files.values() if not Path(f).is_file()]
    if missing:
        raise UserError(f"{path} holds neither save_to_disk's dataset_dict.json nor {', '.join(missing)}")
    return datasets.load_dataset("parquet", data_files=files).with_format("numpy")


DTYPES = ("uint16", "uint32")  # what prepare.py writes the token streams in


def read_meta(folder: Path) -> dict:
    """A prepared folder's meta.json, checked as data someone else may have written: the folder's files inside it,
    the fields a run reads of the kinds prepare.py writes, and every token id of its streams within the
    vocabulary (an id past the embedding table would fail deep inside the first step)."""
    folder = Path(folder)
    if not is_prepared(folder):
        raise UserError(f"{folder} is not a prepared data folder (no meta.json and train.bin); "
                        "prepare one with `python pretrain.py data_only=true ...`")
    refuse_links_outside(folder, "a run")
    meta = read_json(folder / "meta.json", what="prepared data meta.json")
    problem = meta_problem(meta)
    if problem:
        raise UserError(f"{folder / 'meta.json'}: {problem}; not a prepared folder cramming wrote")
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in ("train", "val"):
        path = folder / f"{split}.bin"
        size = path.stat().st_size if path.is_file() else 0
        if size % itemsize:
            raise UserError(f"{path}: {size:,} bytes, not a whole number of {meta['dtype']} tokens; the file was cut "
                            "short or is not a token stream")
        held = size // itemsize // (meta["seq_length"] - 1)
        if held != meta[f"{split}_sequences"]:
            raise UserError(f"{folder / 'meta.json'}: says {meta[f'{split}_sequences']:,} {split} sequences, but "
                            f"{path.name} holds {held:,} of {meta['seq_length']} tokens; not a prepared folder "
                            "cramming wrote (or one changed since)")
        largest = largest_id(path, meta["dtype"])
        if largest is not None and largest >= meta["vocab_size"]:
            raise UserError(f"{folder / f'{split}.bin'} holds token id {largest:,}, past the vocabulary of "
                            f"{meta['vocab_size']:,} that meta.json gives; the folder's tokens and tokenizer do not "
                            "belong together")
    periods = folder / "train_periods.npy"
    if periods.is_file():
        try:
            counts = np.load(periods, allow_pickle=False, mmap_mode="r")
        except (ValueError, OSError) as err:
            raise UserError(f"{periods}: not a NumPy array of counts ({err}); not a prepared folder cramming wrote") \
                from None
        if counts.shape != (meta["train_sequences"],) or counts.dtype.kind not in "iu":
            raise UserError(f"{periods}: holds {counts.dtype} of shape {counts.shape}, not one count per training "
                            f"sequence ({meta['train_sequences']:,}); not a prepared folder cramming wrote")
    return meta


def meta_problem(meta) -> str | None:
    """What makes a meta.json not one prepare.py writes, or None."""
    if not isinstance(meta, dict):
        return "it is not a JSON object"
    whole = {k: meta.get(k) for k in ("seq_length", "vocab_size", "train_sequences", "val_sequences")}
    bad = next((k for k, v in whole.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0), None)
    if bad is not None:
        return f"{bad} is {whole[bad]!r}, not a whole number"
    if meta["seq_length"] < 2 or meta["vocab_size"] < 1:
        return f"seq_length {meta['seq_length']} and vocab_size {meta['vocab_size']} make no sequences"
    if meta.get("dtype") not in DTYPES:
        return f"dtype is {meta.get('dtype')!r}, not one of {', '.join(DTYPES)}"
    special = meta.get("special_ids")
    if not isinstance(special, dict) or not all(isinstance(v, int) and 0 <= v < meta["vocab_size"]
                                                for v in special.values()):
        return "special_ids is not a table of token ids within its vocabulary"
    return None


def largest_id(path: Path, dtype: str, block: int = 1 << 24) -> int | None:
    """The largest token id of a token stream, read in blocks (None for an empty one)."""
    if not path.is_file():
        return None
    largest = None
    with open(path, "rb") as fh:
        while (chunk := np.fromfile(fh, dtype=dtype, count=block)).size:
            largest = max(largest or 0, int(chunk.max()))
    return largest


def prepared_problem(prepared: str | None) -> str | None:
    """data.prepared names a prepared folder or an export of one (config.validate asks before any work)."""
    if prepared is None:
        return None
    path = Path(os.path.expanduser(prepared))
    if is_prepared(path) or is_exported(path):
        return None
    what = "does not exist" if not path.exists() else f"holds neither meta.json and train.bin nor {META}"
    return (f"data.prepared={prepared!r} is invalid: {path} {what}; give a folder that `python pretrain.py "
            "data_only=true` printed, or one `python -m cramming.data.share` exported")


def use_prepared(cfg) -> tuple[Path, dict]:
    """data.prepared: a prepared cache folder as it is, or an exported dataset folder imported into the cache."""
    path = Path(os.path.expanduser(cfg.prepared))
    if is_exported(path):
        path = import_prepared(path, Path(os.path.expanduser(cfg.cache_dir)).resolve())
    meta = read_meta(path)
    if meta["seq_length"] != cfg.seq_length:
        raise UserError(f"data.seq_length={cfg.seq_length} is invalid: data.prepared={cfg.prepared} holds sequences "
                        f"of {meta['seq_length']} tokens; set data.seq_length={meta['seq_length']}")
    return path.resolve(), meta


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cramming.data.share", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a prepared data folder (data_only=true prints it)")
    parser.add_argument("out", type=Path, help="the dataset folder to write (new)")
    parser.add_argument("--format", choices=FORMATS, default="arrow", help="save_to_disk's arrow files, or parquet")
    args = parser.parse_args(argv)
    print(f"exported: {export_prepared(args.folder, args.out, args.format).resolve()}")


if __name__ == "__main__":
    main(sys.argv[1:])
