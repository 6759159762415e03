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

# The head each objective trains.
PRETRAINING_HEADS = {"mlm": CrammedForMaskedLM, "clm": CrammedForCausalLM}

__all__ = [
    "AUTO_MAP",
    "PRETRAINING_HEADS",
    "CrammedConfig",
    "CrammedForCausalLM",
    "CrammedForMaskedLM",
    "CrammedForSequenceClassification",
    "CrammedModel",
]
