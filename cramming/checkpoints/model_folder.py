"""The final checkpoint: a Hugging Face model folder that loads without cramming installed.

Written to a new `checkpoint.<random>.tmp/` beside it and renamed to `checkpoint/` only when complete, with
train_summary.json written last inside it, so a folder named `checkpoint` is always whole. An existing folder of
that name is replaced only when a save of ours wrote it (`ours`): an export into a folder holding anything else is
refused (cramming/outputs.py).
"""

import dataclasses
import json
import math
import os
import pickle
import re
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from transformers import AutoModel
from transformers.utils import logging as hf_logging

from ..card import CARD, EVALUATIONS, write_card
from ..data.tokenizer import for_generation
from ..engines import Engine
from ..errors import UserError
from ..model import CrammedModel, auto_map_of
from ..model.arch import ArchConfig
from ..model_code import shipped_names
from ..outputs import claim_folder, remove, replace_folder, temp_folder, writing
from ..rules import declared_registries, declared_rules, rule_problem
from ..untrusted import check_memory, leads_outside, plain_data, read_json, size_text
from .pickled import strided_view

SUMMARY = "train_summary.json"
# The Triton kernels live in the cramming package, not in the model folder that checkpoints carry; a checkpoint
# names the PyTorch paths, which compute the same function everywhere. The fused loss travels, but returns no
# logits in training, which Hugging Face users expect: checkpoints name the plain loss.
PORTABLE_KERNELS = {"attention_impl": "sdpa", "rotary_impl": "torch", "loss_impl": "plain"}
RUN_ONLY = ("triton", "fused")


# What a save writes into a model folder besides the model code, and what eval.py (the card's scores) and the ONNX
# export add to one: an existing folder holding only these (and train_summary.json) is ours to replace.
SAVED = {"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "chat_template.jinja", CARD, SUMMARY,
         EVALUATIONS, "model.onnx", "model.onnx.data"}
SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def saved_by_us(entry: Path) -> bool:
    """Whether a model folder's entry is one a save of ours writes (a plain file of those names)."""
    name = entry.name
    return (entry.is_file() and not entry.is_symlink()
            and (name in SAVED or name in shipped_names() or SHARD.fullmatch(name) is not None))


def claim_model_folder(path: Path) -> None:
    """Refuse to save into `path` when it exists and holds anything a save of ours did not write (a folder of
    ours has the train_summary.json a save writes last: a run's summary with its config)."""
    claim_folder(path, saved_by_us, "a model folder")
    if Path(path).is_dir() and any(Path(path).iterdir()) and not is_our_summary(Path(path) / SUMMARY):
        raise UserError(f"{path} already holds files and is not a model folder cramming wrote (no {SUMMARY} of a "
                        "run); it was left as it is: give a new (or empty) folder to write a model folder into")


def is_our_summary(path: Path) -> bool:
    """A train_summary.json as a save of ours writes it: a run's name, steps and config with its arch."""
    try:
        summary = read_json(path, what=SUMMARY) if path.is_file() and not path.is_symlink() else None
    except UserError:
        return False
    return (isinstance(summary, dict) and {"name", "steps", "config"} <= set(summary)
            and isinstance(summary["config"], dict) and isinstance(summary["config"].get("arch"), dict))


def save_checkpoint(model, tokenizer, summary: dict, run_dir: Path, name: str = "checkpoint") -> Path:
    """`name`: the folder, `checkpoint` for the last weights, `final-<kind>` for averaged ones (averaging.py)."""
    final = Path(run_dir) / name
    claim_model_folder(final)
    with writing(final.parent, f"the model folder {final.name}"):
        tmp = temp_folder(final.parent, final.name)
        try:
            write_model_folder(model, tokenizer, summary, tmp)
            replace_folder(tmp, final)
        except BaseException:
            remove(tmp)
            raise
    return final.resolve()


def write_model_folder(model, tokenizer, summary: dict, tmp: Path) -> None:
    """Everything a model folder holds, train_summary.json last, into the new folder `tmp`."""
    model = Engine.unwrap(model)
    model.config.auto_map = auto_map_of(model)  # the Auto classes this objective's checkpoint serves
    if model.config.causal:  # prompts without a closing [SEP], decoded with their spaces
        tokenizer = for_generation(tokenizer)
        name_generation_tokens(model, tokenizer)
    in_use = {key: getattr(model.config, key) for key in PORTABLE_KERNELS}
    try:
        for key, portable in PORTABLE_KERNELS.items():
            if in_use[key] in RUN_ONLY:
                setattr(model.config, key, portable)
        with no_shard_bar():
            model.save_pretrained(tmp, safe_serialization=True)
    finally:
        for key, value in in_use.items():
            setattr(model.config, key, value)
    tokenizer.save_pretrained(tmp)
    write_card(tmp, summary, type(model))  # README.md: the model card the hub shows
    with open(tmp / SUMMARY, "w") as fh:
        json.dump(summary, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def name_generation_tokens(model, tokenizer) -> None:
    """A causal checkpoint's config and generation config name the bos and eos ids of the tokenizer it ships, as
    transformers' causal LMs do: the Trainer otherwise rewrites both, with a warning, when given that tokenizer."""
    for name in ("bos_token_id", "eos_token_id"):
        setattr(model.config, name, getattr(tokenizer, name))
        if getattr(model, "generation_config", None) is not None:  # a head that generates
            setattr(model.generation_config, name, getattr(tokenizer, name))


@contextmanager
def no_shard_bar():
    """transformers draws a "Writing model shards" bar in every save_pretrained: for our one small shard, a bar of
    noise after every run. Off for our saves only; a user's setting is as it was after."""
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / SUMMARY).is_file() and (checkpoint / "model.safetensors").is_file()


# ---------------------------------------------------------------- written whole
# A checkpoint's weights must have been written whole, checked before any work: a file cut short by a killed write
# otherwise passes every other check and fails minutes later deep inside safetensors.


# A tensor's shape and the bytes it takes, as a safetensors header describes it (nothing of the data read).
TensorTable = dict[str, tuple[tuple[int, ...], int]]
HEADER_LIMIT = 100 << 20  # safetensors' own bound on a header


def check_safetensors(path: Path) -> TensorTable:
    """A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
    and byte range, then the data: the file must be exactly as long as the header's largest end offset says, and
    each tensor's range as long as its shape. Returns the tensors' shapes and sizes."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little") if size >= 8 else None
        if length is None or length > size - 8:
            raise UserError(f"{path}: cut short ({size:,} bytes, not even its header); the write was interrupted, "
                            "use a complete checkpoint")
        if length > HEADER_LIMIT:
            raise UserError(f"{path}: its header says it is {length:,} bytes long, more than safetensors allows "
                            f"({HEADER_LIMIT:,}); not a safetensors file")
        try:
            header = json.loads(fh.read(length))
            table = {key: (tuple(int(n) for n in entry["shape"]), int(entry["data_offsets"][1]) -
                           int(entry["data_offsets"][0]), entry["dtype"])
                     for key, entry in header.items() if key != "__metadata__"}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise UserError(f"{path}: not a safetensors file (its header is not a tensor table)") from None
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        problem = "cut short" if size < expected else "longer than its header says"
        raise UserError(f"{path}: {problem} ({size:,} bytes, its header describes {expected:,}); the write was "
                        "interrupted, use a complete checkpoint")
    for key, (shape, nbytes, dtype) in table.items():
        if math.prod(shape) * DTYPE_BYTES.get(dtype, 0) != nbytes or any(n < 0 for n in shape):
            raise UserError(f"{path}: tensor {key!r} of shape {list(shape)} ({dtype}) does not fill its {nbytes:,} "
                            "bytes; not a file safetensors wrote")
    spans = sorted((int(e["data_offsets"][0]), int(e["data_offsets"][1])) for k, e in header.items()
                   if k != "__metadata__")
    if any(start != end_before for (start, _), (_, end_before) in zip(spans[1:], spans)) or (spans and spans[0][0]):
        raise UserError(f"{path}: its tensors' byte ranges overlap or leave gaps; not a file safetensors wrote")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise UserError(f"{path}: its __metadata__ is not a table of strings; not a file safetensors wrote")
    return {key: (shape, nbytes) for key, (shape, nbytes, _) in table.items()}


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def check_weights(folder: Path, bounds: Path | None = None) -> TensorTable:
    """Every safetensors file of the checkpoint (one, or the shards of an index, each inside `bounds`: the folder,
    or a hub snapshot's repository) whole; the completion marker present where the writer uses one (pretraining's
    temporary folder gets train_summary.json last). Returns every tensor's shape and size ({} for
    pytorch_model.bin, a pickle that only torch reads)."""
    bounds = bounds or folder
    if folder.name.endswith(".tmp") and not (folder / SUMMARY).is_file():
        raise UserError(f"checkpoint {folder} is an unfinished write (no {SUMMARY}, which pretraining writes last); "
                        "use the run's checkpoint/ folder")
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        try:
            names = sorted(set(read_json(index, what="safetensors index")["weight_map"].values()))
        except (TypeError, KeyError, AttributeError):
            raise UserError(f"{index}: not a safetensors index (no weight_map)") from None
        files = [folder / str(name) for name in names]  # an absolute name replaces the folder: refused below
    elif (folder / "pytorch_model.bin").is_file():
        return pickled_table(folder / "pytorch_model.bin")
    else:
        return {}
    tables = {}
    for path in files:
        if leads_outside(bounds, path):
            raise UserError(f"{index}: its weight_map names {str(path)!r}, which leads outside "
                            f"{bounds} (to {path.resolve()}); a checkpoint's files must lie inside it, so it was "
                            "not read")
        if not path.is_file():
            raise UserError(f"{path}: missing (named in {index.name}); the checkpoint is incomplete")
        tables |= check_safetensors(path)
    return tables


def pickled_table(path: Path) -> TensorTable:
    """A pytorch_model.bin's tensors' shapes and sizes, read as transformers would (weights_only: tensors and plain
    data) but memory-mapped, so nothing of the data is read; a tensor reaching past the bytes stored (a view that
    would grow on the first copy) is refused. A file in torch's legacy format cannot be mapped: {} (its size is
    then all that is checked)."""
    try:
        asks = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        weights = None if asks else torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        asks = ["something weights_only refuses"]
    except (RuntimeError, EOFError, ValueError, OSError):
        return {}
    if asks:
        raise UserError(f"{path}: holds more than tensors and plain data (it asks for {', '.join(asks[:3])}); it was "
                        "not loaded, as unpickling it could run code")
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise UserError(f"{path}: not a table of tensors; not a weights file")
    if (found := strided_view(weights, path.name)) is not None:
        where, numel, stored = found
        raise UserError(f"{path}: {where} is a view of {numel:,} elements over {stored:,} stored bytes; not a "
                        "weights file a save writes")
    return {name: (tuple(t.shape), t.numel() * t.element_size()) for name, t in weights.items()}


def check_crammed_config(path: Path, config) -> None:
    """A crammed checkpoint's config.json, as data someone else may have written: every architecture option of its
    declared type and within its declared rules (cramming/model/arch.py, as a run's config is checked), its
    special token ids within its vocabulary, never an interpolation; and its kernels the portable ones, whatever it
    names (a checkpoint is saved with sdpa/torch/plain: a Triton kernel it named would fail off a GPU)."""
    where = f"checkpoint {path}: config.json"
    arch = {f.name: getattr(config, f.name) for f in dataclasses.fields(ArchConfig)}
    arch = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in arch.items()}
    plain_data(arch, where)
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ArchConfig), arch))
    except OmegaConfBaseException as err:
        raise UserError(f"{where}: {getattr(err, 'full_key', '') or ''} is not of its declared type "
                        f"({(str(err).splitlines() or [''])[0][:150]}); not a config cramming wrote") from None
    for key, value, rule in declared_rules(typed):
        if problem := rule_problem(key, value, rule):
            raise UserError(f"{where}: {problem}")
    # arch.objective says how the model was trained (train/objectives.py, a layer above): no part of what loads it
    for key, value, registry, extra in declared_registries(typed, leave_out=("objective",)):
        names = value if isinstance(value, list) else [value]
        if bad := next((n for n in names if n not in registry and n not in extra), None):
            raise UserError(f"{where}: {key}={bad!r} is no option this cramming has")
    if not 0 <= typed.value_embeddings <= typed.num_layers // 2:  # tables for the first and last k layers
        raise UserError(f"{where}: value_embeddings={typed.value_embeddings} is invalid: must be in "
                        f"[0, num_layers / 2 = {typed.num_layers // 2}]")
    vocab = getattr(config, "vocab_size", None)
    ids = {k: getattr(config, f"{k}_token_id", None) for k in ("pad", "cls", "sep", "mask")}
    if not isinstance(vocab, int) or vocab < 1 or any(not isinstance(i, int) or not 0 <= i < vocab
                                                      for i in ids.values() if i is not None):
        raise UserError(f"{where}: vocab_size {vocab!r} and the special token ids {ids} do not fit together")
    for key, portable in PORTABLE_KERNELS.items():
        setattr(config, key, portable)


NEW_HEAD_ROOM = 16 << 20  # parameters a fine-tuning head may add to the weights' (a classifier has far fewer)


LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers?|h|blocks?)\.(\d+)\.")  # encoder.layers.3., layer.3., h.3. ...


def stored_layers(tensors: TensorTable) -> int | None:
    """How many layers the weights hold (the largest block index in their names, plus one), or None."""
    found = [int(m.group(1)) for name in tensors if (m := LAYER_INDEX.search(name))]
    return max(found) + 1 if found else None


def check_sizes(path: Path, model_config, tensors: TensorTable, remote_code: bool, fix: str, copies: int = 1) -> None:
    """The model config.json describes, built without memory (on the meta device), against the weights: more layers
    than the weights hold, a tensor of another shape, or a model far larger than its weights, means the config does
    not belong to them (and would have the machine allocate what the config says). The weights, and the model
    `copies` times over (4 to fine-tune: weights, gradients, Adam's two moments), must fit in memory (`fix`: what
    to do when they do not). `remote_code`: the folder's own model code was allowed to build it."""
    stored = sum(nbytes for _, nbytes in tensors.values()) or sum(
        p.stat().st_size for p in path.glob("pytorch_model*.bin"))
    check_memory(stored, f"checkpoint {path}: its weights ({size_text(stored)} in its weight files)", fix)
    layers, held_layers = getattr(model_config, "num_hidden_layers", None), stored_layers(tensors)
    if isinstance(layers, int) and held_layers is not None and layers > held_layers:
        raise UserError(f"checkpoint {path}: config.json describes {layers:,} layers but its weights hold "
                        f"{held_layers:,}; the config does not belong to these weights")
    try:
        with torch.device("meta"):
            model = (CrammedModel(model_config) if model_config.model_type == "crammed" and not remote_code else
                     AutoModel.from_config(model_config, trust_remote_code=remote_code))
    except Exception as err:  # noqa: BLE001  a model's constructor may fail in any type on values it never checks
        raise UserError(f"checkpoint {path}: config.json describes no model this code builds "
                        f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})") from None
    prefix = getattr(model, "base_model_prefix", "")
    for name, param in model.named_parameters():
        found = tensors.get(name) or tensors.get(f"{prefix}.{name}")
        if found is not None and tuple(param.shape) != found[0]:
            raise UserError(f"checkpoint {path}: config.json does not match its weights: {name} is "
                            f"{list(param.shape)} by the config but {list(found[0])} in the weights; the config "
                            "does not belong to these weights")
    wanted = sum(p.numel() for p in model.parameters())
    held = sum(math.prod(shape) for shape, _ in tensors.values())
    if tensors and wanted > 1.25 * held + NEW_HEAD_ROOM:
        raise UserError(f"checkpoint {path}: config.json describes a model of {wanted:,} parameters but its weights "
                        f"hold {held:,}; the config does not belong to these weights")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    check_memory(copies * weights + buffers, f"checkpoint {path}: the model its config.json describes "
                 f"({size_text(weights)} of weights, {size_text(buffers)} of tables{', x4 to fine-tune' if copies == 4 else ''})",
                 fix)
