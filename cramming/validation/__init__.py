"""Loading and checking configs before any work (pretrain.py's and eval.py's), and the checks that read more than one
component's choice (across.py): one layer above every component it asks, below the commands and the recipes."""

from .eval import load_eval_config, validate_eval
from .pretrain import check_no_missing, load_config, validate

__all__ = ["check_no_missing", "load_config", "load_eval_config", "validate", "validate_eval"]
