"""Loading and checking configs before any work (pretrain.py's and eval.py's), and the checks that read more than one
component's choice (across.py): one layer above every component it asks, below the commands and the recipes."""

from .pretrain import check_no_missing, load_config, validate

# eval.py's (load_eval_config, validate_eval) are imported from .eval where needed: pretraining does not pay for
# importing every benchmark, its metrics and their libraries.
__all__ = ["check_no_missing", "load_config", "validate"]
