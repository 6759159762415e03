"""The Hugging Face config of a crammed model: the architecture's options (arch.py, one definition) plus what
only a built model needs (vocabulary, special tokens, kernels, the classifier's dropout)."""

import dataclasses

from transformers import PretrainedConfig

from .arch import ArchConfig
from .renamed import causal_before

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
        loss_impl: str = "plain",  # fused | plain: how training computes the head's loss (model/fused_loss.py)
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
        `causal` trait (pretraining.build_model), and config.json keeps it, so a saved config answers without the
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
