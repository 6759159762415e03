"""The crammed model family, Hugging Face compatible.

The classes load on first use, so that `cramming.config` can read the architecture's schema (arch.py) without
importing torch and transformers.
"""

import importlib

# Written into every saved config.json, so each Auto class loads a checkpoint with trust_remote_code=True
# in a Python that never imported cramming.
AUTO_MAP = {
    "AutoConfig": "configuration_crammed.CrammedConfig",
    "AutoModel": "modeling_crammed.CrammedModel",
    "AutoModelForMaskedLM": "modeling_crammed.CrammedForMaskedLM",
    "AutoModelForCausalLM": "modeling_crammed.CrammedForCausalLM",
    "AutoModelForSequenceClassification": "modeling_crammed.CrammedForSequenceClassification",
    "AutoModelForTokenClassification": "heads.CrammedForTokenClassification",
    "AutoModelForQuestionAnswering": "heads.CrammedForQuestionAnswering",
    "AutoModelForMultipleChoice": "heads.CrammedForMultipleChoice",
}
CLASSES = {"CrammedConfig": ".configuration_crammed", "CrammedModel": ".modeling_crammed",
           "CrammedForMaskedLM": ".modeling_crammed", "CrammedForCausalLM": ".modeling_crammed",
           "CrammedForSequenceClassification": ".modeling_crammed", "CrammedForReplacedTokenDetection": ".electra",
           "CrammedForTokenClassification": ".heads", "CrammedForQuestionAnswering": ".heads",
           "CrammedForMultipleChoice": ".heads"}


def __getattr__(name: str):
    if name in CLASSES:
        return getattr(importlib.import_module(CLASSES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AUTO_MAP", *CLASSES]
