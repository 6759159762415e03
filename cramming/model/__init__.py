"""The crammed model family, Hugging Face compatible."""

from .configuration_crammed import CrammedConfig
from .modeling_crammed import CrammedForCausalLM, CrammedForMaskedLM, CrammedForSequenceClassification, CrammedModel

# Written into every saved config.json, so each Auto class loads a checkpoint with trust_remote_code=True
# in a Python that never imported cramming.
AUTO_MAP = {
    "AutoConfig": "configuration_crammed.CrammedConfig",
    "AutoModel": "modeling_crammed.CrammedModel",
    "AutoModelForMaskedLM": "modeling_crammed.CrammedForMaskedLM",
    "AutoModelForCausalLM": "modeling_crammed.CrammedForCausalLM",
    "AutoModelForSequenceClassification": "modeling_crammed.CrammedForSequenceClassification",
}
CrammedConfig.register_for_auto_class()
CrammedForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
CrammedForCausalLM.register_for_auto_class("AutoModelForCausalLM")



def __getattr__(name: str):
    """PRETRAINING_HEADS, the old name of the head each objective trains, now read from the objectives registry
    (kept for cramming/pretraining.py; lazy, because cramming.train imports this package)."""
    if name == "PRETRAINING_HEADS":
        from ..train.objectives import OBJECTIVES

        return {objective: cls.head for objective, cls in OBJECTIVES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTO_MAP",
    "PRETRAINING_HEADS",
    "CrammedConfig",
    "CrammedForCausalLM",
    "CrammedForMaskedLM",
    "CrammedForSequenceClassification",
    "CrammedModel",
]
