"""train.init_from: a new run (new optimizer, budget clock and schedule) from the weights of another model:
one of our `checkpoint/` folders, an intermediate `checkpoints/step-<n>/`, or a Hugging Face `BertForMaskedLM`
(folder or hub id; mapped by from_bert.py onto arch=bert-base's layout).

The run reads its text with the source's tokenizer, never a new one: the source's vocabulary is what its
embeddings index. The tokenizer is copied to `<data.cache_dir>/tokenizers/<hash of its files>/` and named by
data.tokenizer.kind, so runs from the same source share one tokenized cache. A tensor the run's model has no place
for, or of another shape, and then a layout option no shape shows (post- or pre-norm, heads, ...), is one line.
"""

import hashlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from safetensors.torch import load_file
from transformers import logging as hf_logging

from ..checkpoints.model_folder import check_sizes, check_weights
from ..checkpoints.step_folder import MARKER
from ..data.tokenizer import TOKENIZER_KINDS, load_pretrained_tokenizer, read_tokenizer
from ..errors import UserError
from ..hub import bounds, model_folder
from ..model.configuration_crammed import current_key
from ..registry import invalid
from ..untrusted import check_memory, check_tokenizer_files, link_outside, read_json
from .checkpointing import read_step
from .from_bert import bert_layout, bert_weights

KEY = "train.init_from"
MORE_MEMORY = "start from it on a machine with more memory"
# Arch options our own checkpoints must share with the run beyond their tensors' shapes.
LAYOUT = ("norm_position", "position", "ffn", "activation", "norm", "num_heads", "objective", "layout",
          "head_transform", "embedding_norm", "final_norm", "bias", "tie_embeddings", "qk_norm", "parametrization",
          "logit_softcap", "value_embeddings", "unet_skips")


@dataclass
class Source:
    kind: str  # checkpoint, step or bert
    folder: Path
    weights: dict  # our tensor name -> tensor
    origin: dict  # our tensor name -> its name in the source
    layout: dict  # the arch options the run must share with it
    tokenizer: object  # the source's tokenizer (the run reads its text with it)


def open_source(value: str, allow_code: bool = False) -> Source:
    """The folder or hub id of train.init_from, read: weights in our names, layout, tokenizer. A folder whose model
    code is not ours is refused unless `allow_code` (train.trust_remote_code): its weights may not mean what our
    model reads them as, and any other tool that loads it would run that code. Its code is never run here."""
    folder = model_folder(KEY, value, allow_code, "train.trust_remote_code")
    if (folder / MARKER).is_file() and (folder / "state.pt").is_file():
        return _step(folder, value)
    if not (folder / "config.json").is_file():
        raise UserError(invalid(KEY, value, "not a model folder (no config.json): give a run's checkpoint/, a "
                                "checkpoints/step-<n>/ folder, or a Hugging Face BertForMaskedLM"))
    saved = read_json(folder / "config.json", what="config.json")
    model_type = saved.get("model_type") if isinstance(saved, dict) else None
    if model_type == "crammed":
        return _checkpoint(folder, value)
    if model_type == "bert":
        return _bert(folder, value)
    raise UserError(invalid(KEY, value, f"its model_type is {model_type!r}; init_from reads our checkpoints "
                            "(crammed) and BERT (BertForMaskedLM)"))


def _checkpoint(folder: Path, value: str) -> Source:
    if not (folder / "model.safetensors").is_file():
        raise UserError(invalid(KEY, value, "has no model.safetensors: an incomplete checkpoint"))
    tensors = _checked(folder)
    check_memory(sum(nbytes for _, nbytes in tensors.values()), f"{KEY}={value}: its weights", MORE_MEMORY)
    weights = load_file(folder / "model.safetensors")
    saved = read_json(folder / "config.json", what="config.json")
    tokenizer = read_tokenizer(folder, f"{KEY}={value}")
    return Source("checkpoint", folder, *_renamed(weights), _ours(saved), tokenizer)


def _checked(folder: Path) -> dict:
    """A model folder's files inside it (a hub snapshot's inside its repository), its tokenizer files of a
    tokenizer's size and its weights whole: their tensors' shapes and sizes."""
    limit = bounds(folder)
    if (link := link_outside(limit)) is not None:
        raise UserError(f"{KEY}={folder}: {link} is a link leading outside it; a model folder's files must lie "
                        "inside it, so it was not read")
    check_tokenizer_files(folder)
    return check_weights(folder, limit)


def _step(folder: Path, value: str) -> Source:
    saved, config = read_step(folder)
    arch = config.get("arch") if isinstance(config.get("arch"), dict) else {}
    tokenizer = read_tokenizer(folder / "tokenizer", f"{KEY}={value}")
    return Source("step", folder, *_renamed(saved["model"]), _ours(arch), tokenizer)


def _renamed(weights: dict) -> tuple[dict, dict]:
    """Our saved tensors under their current names (a checkpoint saved before a rename: OLD_KEYS), and each
    one's saved name, for the messages."""
    current = {current_key(k): k for k in weights}
    return {new: weights[old] for new, old in current.items()}, current


def _ours(arch: dict) -> dict:
    return {key: arch.get(key) for key in LAYOUT if key in arch}


def _bert(folder: Path, value: str) -> Source:
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM  # BERT's model code (50 ms): only for BERT

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # unused pooler weights of a BertForPreTraining checkpoint: expected
    try:
        tensors = _checked(folder)
        check_sizes(folder, BertConfig.from_pretrained(folder), tensors, False, MORE_MEMORY)
        bert = BertForMaskedLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001  a folder fails to load as BERT in many types; each is one line
        raise UserError(invalid(KEY, value, f"could not be loaded as a BertForMaskedLM ({type(err).__name__}: "
                                f"{next((s for s in str(err).splitlines() if s.strip()), '')[:200]})")) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if getattr(bert.config, "position_embedding_type", "absolute") != "absolute":
        raise UserError(invalid(KEY, value, f"uses {bert.config.position_embedding_type} positions; only BERT's "
                                "learned absolute positions map onto arch.position=learned"))
    weights, origin = bert_weights(bert.state_dict())
    return Source("bert", folder, weights, origin, bert_layout(bert.config), tokenizer)


def with_source_tokenizer(config, source: Source, cache_dir: str):
    """The run config reading its text with the source's tokenizer (data.tokenizer.kind = its saved copy). A
    tokenizer the user named must be the source's vocabulary."""
    kind = config.data.tokenizer.kind
    if kind not in TOKENIZER_KINDS:
        if load_pretrained_tokenizer(kind, config.data.seq_length).get_vocab() != source.tokenizer.get_vocab():
            raise UserError(invalid("data.tokenizer.kind", kind, f"is not the vocabulary of {KEY}={source.folder}; "
                                    "leave data.tokenizer.kind at its default to use the source's tokenizer"))
        return config
    folder = saved_tokenizer(source.tokenizer, Path(os.path.expanduser(cache_dir)).resolve())
    data = replace(config.data, tokenizer=replace(config.data.tokenizer, kind=str(folder)))
    return replace(config, data=data)


def saved_tokenizer(tokenizer, cache_root: Path) -> Path:
    """The tokenizer saved under cache_root/tokenizers/<hash of its files>: one path per vocabulary."""
    tmp = cache_root / "tokenizers" / f"tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    digest = hashlib.sha256()
    for path in sorted(tmp.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    final = tmp.with_name(digest.hexdigest()[:16])
    if final.is_dir():
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, final)
    return final


def load_source(model, source: Source, value: str, arch) -> None:
    """The source's weights into the run's freshly built model: every tensor must have a place of its shape,
    every tensor of the model a value (the decoder tied to the token embeddings excepted), then the layout options
    no shape shows must agree. The first misfit is the one line."""
    own = model.state_dict()
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if model.config.tie_embeddings else set()
    for name, tensor in source.weights.items():
        theirs = source.origin.get(name, name)
        if name not in own:
            raise UserError(invalid(KEY, value, f"its tensor {theirs} has no place in this run's model (arch "
                                    f"differs from the source's{_hint(source)})"))
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise UserError(invalid(KEY, value, f"its tensor {theirs} is {tuple(tensor.shape)}, this run's {name} "
                                    f"is {tuple(own[name].shape)}; set the arch sizes to the source's{_hint(source)}"))
    missing = [name for name in own if name not in source.weights and name not in tied]
    if missing:
        raise UserError(invalid(KEY, value, f"has no tensor for this run's {missing[0]} (arch differs from the "
                                f"source's{_hint(source)})"))
    for key, wanted in source.layout.items():
        have = getattr(arch, key)
        if have != wanted and not (isinstance(wanted, float) and abs(have - wanted) <= 1e-6 * abs(wanted)):
            raise UserError(invalid(KEY, value, f"the source has arch.{key}={wanted!r}, this run {have!r}; set "
                                    f"arch.{key}={wanted}{_hint(source)}"))
    model.load_state_dict({name: tensor for name, tensor in source.weights.items()}, strict=False)
    if tied:
        model.tie_weights()


def _hint(source: Source) -> str:
    return "; a BERT source needs arch=bert-base with its sizes" if source.kind == "bert" else ""
