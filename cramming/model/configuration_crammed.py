"""The Hugging Face config of a crammed model: the architecture's options (arch.py, one definition) plus what
only a built model needs (vocabulary, special tokens, kernels, the classifier's dropout)."""

import dataclasses
import re

from transformers import PretrainedConfig

from .arch import ArchConfig

ARCH_DEFAULTS = ArchConfig()
# Options grouped in a section of their own (`arch.attention.window`), restored from config.json's nested dicts.
SECTIONS = {f.name: type(getattr(ARCH_DEFAULTS, f.name)) for f in dataclasses.fields(ArchConfig)
            if dataclasses.is_dataclass(getattr(ARCH_DEFAULTS, f.name))}


class CrammedConfig(PretrainedConfig):
    model_type = "crammed"
    # Names generic Hugging Face code (pipelines, Trainer, PEFT) looks for.
    attribute_map = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
                     "intermediate_size": "ffn_size", "max_position_embeddings": "max_seq_length"}

    def __init__(
        self,
        vocab_size: int = 32768,
        classifier_dropout: float = 0.1,
        attention_impl: str = "sdpa",  # kernels are a runtime choice: checkpoints are saved with sdpa/torch
        rotary_impl: str = "torch",
        loss_impl: str = "plain",  # fused | plain: how training computes the head's loss (model/losses.py)
        pad_token_id: int = 0,
        cls_token_id: int = 2,
        sep_token_id: int = 3,
        mask_token_id: int = 4,
        causal: bool | None = None,
        **kwargs,
    ):
        """Every ArchConfig field is a keyword here with the same default; sections (attention, linear_args) take
        a dict or their dataclass, and their flat names (attention_window=) as older checkpoints saved them.
        causal: attention sees only the past. Whoever builds the config from a run says it, from the objective's
        `causal` trait (run.build_model), and config.json keeps it, so a saved config answers without the
        objectives (cramming/train/). None: a config that does not say, saved before it was stored or built by
        hand, reads as the objectives of that time did (renamed.causal_before)."""
        self.vocab_size = vocab_size
        for field in dataclasses.fields(ArchConfig):
            setattr(self, field.name, arch_value(field.name, kwargs))
        self.causal = causal_before(self.objective) if causal is None else bool(causal)
        self.classifier_dropout = classifier_dropout
        self.attention_impl = attention_impl
        self.rotary_impl = rotary_impl
        self.loss_impl = loss_impl
        self.cls_token_id = cls_token_id
        self.mask_token_id = mask_token_id
        kwargs.pop("tie_word_embeddings", None)  # derived from tie_embeddings; present when loading a saved config
        super().__init__(pad_token_id=pad_token_id, sep_token_id=sep_token_id,
                         tie_word_embeddings=self.tie_embeddings, **kwargs)

    def to_dict(self) -> dict:
        """config.json holds the sections as nested dicts."""
        out = super().to_dict()
        for name in SECTIONS:
            if dataclasses.is_dataclass(out.get(name)):
                out[name] = dataclasses.asdict(out[name])
        return out


def arch_value(name: str, kwargs: dict):
    """The value of one architecture option from the keywords (popped), else its ArchConfig default."""
    default = getattr(ARCH_DEFAULTS, name)
    if name in SECTIONS:
        section = SECTIONS[name]
        given = kwargs.pop(name, None)
        given = dataclasses.asdict(given) if dataclasses.is_dataclass(given) else dict(given or {})
        for part in dataclasses.fields(section):  # attention_window=8: the flat spelling
            if f"{name}_{part.name}" in kwargs:
                given[part.name] = kwargs.pop(f"{name}_{part.name}")
        if "transformers_version" in kwargs:  # read from a config.json: a key it lacks was saved before it existed
            given = {**getattr(section, "SAVED_BEFORE", {}), **given}
        defaults = section()
        return section(**{key: as_declared(getattr(defaults, key), value) for key, value in given.items()})
    return as_declared(default, kwargs.pop(name, default))


def as_declared(default, value):
    """A list option given one name (layout="gmlp") or a tuple becomes a list, as the schema declares it."""
    if isinstance(default, list):
        return [value] if isinstance(value, str) else list(value)
    return value


CrammedConfig.register_for_auto_class()


# ---------------------------------------------------------------- what checkpoints saved before hold
# What checkpoints saved before a change hold, read as the model reads it now: tensor names of renamed modules, and
# the causal flag configs did not yet carry.
# Read by from_pretrained (transformers' key_mapping), by load_state_dict (a pre-hook: resume, a state dict) and by
# train.init_from and train.averaging, so every old checkpoint still loads. Only the standard library: Hugging Face
# copies this folder flat next to the weights.


# {old: new} patterns of transformers' key_mapping: a regex and a literal (reversed when a model loaded from old
# names is saved in its original format).
OLD_KEYS = {"rpe.": "score_bias."}  # issue 27: CrammedModel.rpe -> score_bias


def current_key(key: str) -> str:
    """The name a tensor saved as `key` has in the model now."""
    for old, new in OLD_KEYS.items():
        key = re.sub(rf"(^|\.){re.escape(old)}", rf"\g<1>{new}", key)
    return key


def current_keys(state_dict, prefix, *args) -> None:
    """load_state_dict's pre-hook: an old checkpoint's names renamed in place (resume, init_from, a state dict)."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = prefix + current_key(key[len(prefix):])
        if new != key:
            state_dict[new] = state_dict.pop(key)


# The sequence and multiple-choice heads' pooler and output layer, one `classifier` module since issue 36
# (modeling_crammed.ClassificationHead): regexes of transformers' key_mapping, anchored at the head's own names.
HEAD_KEYS = {r"^pooler\.": "classifier.dense.", r"^classifier\.(weight|bias)$": r"classifier.out_proj.\1"}


def current_head_keys(state_dict, prefix, *args) -> None:
    """load_state_dict's pre-hook of those heads: a state dict saved before issue 36 read under the new names."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = key[len(prefix):]
        for old, replacement in HEAD_KEYS.items():
            new = re.sub(old, replacement, new)
        if prefix + new != key:
            state_dict[prefix + new] = state_dict.pop(key)


# The objectives whose attention was causal when config.json did not yet say `causal` (issue 27): a config without
# the key reads as these did. New objectives declare the `causal` trait instead (cramming/train/objectives.py), and
# the configs built for them say so.
CAUSAL_BEFORE = ("clm",)


def causal_before(objective: str) -> bool:
    """Whether a config that does not say `causal` attends causally: what its objective meant before configs said."""
    return objective in CAUSAL_BEFORE
