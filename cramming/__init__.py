"""cramming: pretrain a language model on a hard wall-clock budget on one GPU, then measure it on GLUE."""

__version__ = "0.1.0"
