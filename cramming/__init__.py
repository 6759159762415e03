"""cramming: pretrain a language model on a hard wall-clock budget on one GPU, then measure it on GLUE."""

import logging

__version__ = "0.1.0"

# Where DeepSpeed is installed, accelerate imports it inside save_pretrained, and DeepSpeed then logs every gcc call
# of its feature probes at INFO, which Hydra's job log would print in the middle of our output.
logging.getLogger("compilers").setLevel(logging.WARNING)
# The same import logs "Setting accelerator to CPU ..." on every CPU run: expected there, and not a DeepSpeed run.
# Only that line is dropped; DeepSpeed's other warnings still print.
logging.getLogger("DeepSpeed").addFilter(lambda record: "Setting accelerator to CPU" not in record.getMessage())
# Where torchao is installed (the fp8 extra), transformers imports it with every model: torchao then logs that its
# optional C++ kernels (not those float8 training uses) fail to load on builds without them, and torch that
# torchao's enums need no pytree registration. Only those lines are dropped; other warnings from both still print.
logging.getLogger("torchao").addFilter(lambda record: "Failed to load" not in record.getMessage())
logging.getLogger("torch.utils._pytree").addFilter(
    lambda record: "is an Enum subclass and is now natively supported" not in record.getMessage())
