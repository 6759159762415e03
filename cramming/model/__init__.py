"""The crammed model family, Hugging Face compatible."""

from .configuration_crammed import CrammedConfig
from .modeling_crammed import CrammedForMaskedLM, CrammedForSequenceClassification, CrammedModel

# Written into every saved config.json, so each Auto class loads a checkpoint with trust_remote_code=True
# in a Python that never imported cramming.
AUTO_MAP = {
    "AutoConfig": "configuration_crammed.CrammedConfig",
    "AutoModel": "modeling_crammed.CrammedModel",
    "AutoModelForMaskedLM": "modeling_crammed.CrammedForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_crammed.CrammedForSequenceClassification",
}
CrammedConfig.register_for_auto_class()
CrammedForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = ["AUTO_MAP", "CrammedConfig", "CrammedModel", "CrammedForMaskedLM", "CrammedForSequenceClassification"]
