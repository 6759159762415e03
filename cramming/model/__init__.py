"""The crammed model family, Hugging Face compatible.

The classes load on first use, so that `cramming.config` can read the architecture's schema (arch.py) without
importing torch and transformers.
"""

import importlib

# Written into every saved config.json, so each Auto class loads a checkpoint with trust_remote_code=True
# in a Python that never imported cramming: the classes every checkpoint serves, and (auto_map_of) the one of the
# objective it was pretrained with, so that a causal checkpoint is no masked LM to transformers (fill-mask refuses it).
AUTO_MAP = {
    "AutoConfig": "configuration_crammed.CrammedConfig",
    "AutoModel": "modeling_crammed.CrammedModel",
    "AutoModelForSequenceClassification": "heads.CrammedForSequenceClassification",
    "AutoModelForTokenClassification": "heads.CrammedForTokenClassification",
    "AutoModelForQuestionAnswering": "heads.CrammedForQuestionAnswering",
    "AutoModelForMultipleChoice": "heads.CrammedForMultipleChoice",
}
CLASSES = {"CrammedConfig": ".configuration_crammed", "CrammedModel": ".modeling_crammed",
           "CrammedForMaskedLM": ".modeling_crammed", "CrammedForCausalLM": ".modeling_crammed",
           "CrammedForSequenceClassification": ".heads", "CrammedForReplacedTokenDetection": ".electra",
           "CrammedForTokenClassification": ".heads", "CrammedForQuestionAnswering": ".heads",
           "CrammedForMultipleChoice": ".heads"}


def auto_map_of(model) -> dict:
    """config.json's auto_map for a checkpoint of this pretraining head: AUTO_MAP and the head's own (its
    extra_auto_map: AutoModelForMaskedLM, AutoModelForCausalLM, AutoModelForPreTraining)."""
    return {**AUTO_MAP, **getattr(model, "extra_auto_map", {})}


def __getattr__(name: str):
    if name in CLASSES:
        return getattr(importlib.import_module(CLASSES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AUTO_MAP", "auto_map_of", *CLASSES]
