"""impl.precision=fp8: the blocks' large projections train in float8 through torchao's float8 training
(torchao.float8.convert_to_float8_training: dynamic tensorwise or rowwise scales, matmuls in float8 with
higher-precision accumulation), everything else under bf16 autocast. The swap keeps each weight as the same plain
parameter, so the state dict, checkpoints and the optimizer see ordinary tensors; only the matmuls change.

What converts (`converts`, a pure function of the name and shape): a dense projection inside an encoder block
(`...layers.<i>.`: attention qkv/out, FFN up/down; the ELECTRA generator's blocks too) whose in and out features
are multiples of 16 (float8 matmul's requirement) and whose weight has at least impl.fp8.min_elements entries
(small matmuls lose more to the scaling casts than float8 saves; torchao's H100 tables put the break-even above
768 x 768, so the default converts crammed BERT's projections for the measurement to decide, docs/kernels.md).
The output head (`decoder`, tied to the embeddings), the head transform, the embedding projection, ELECTRA's
detector, the pooler and classifier stay bf16: their outputs feed the loss directly. Embeddings are no Linear.
The swapped layers lose the project's LinearMethods (its FLOPs counter, reset_parameters_): the run counts FLOPs and
initialises before place() converts, averaging rebuilds unconverted models from the state dict, and the final
checkpoint saves the converted model's plain weights.
"""

import dataclasses
import re

from torch import nn

from ..errors import UserError
from ..registry import invalid

BLOCK = re.compile(r"(^|\.)layers\.\d+\.")  # a module inside an encoder block (CrammedModel.layers)
CARRIED = ("hidden_matrix", "residual_output")  # marks set on the layer instance (muP, init) that must survive


def converts(name: str, module: nn.Module, min_elements: int) -> bool:
    """Whether the module `name` trains in float8: a dense block projection, dims multiples of 16, big enough."""
    if type(module).__name__ == "Float8Linear" or not isinstance(module, nn.Linear):
        return False
    if not BLOCK.search(name):
        return False
    if module.in_features % 16 or module.out_features % 16:
        return False
    return module.in_features * module.out_features >= min_elements


def torchao_problem() -> str | None:
    """Why torchao's float8 training cannot be imported, or None (cramming/__init__.py quiets its import)."""
    try:
        import torchao.float8  # noqa: F401  the optional torchao, tried only when fp8 is asked for
    except ImportError as error:
        return f"torchao's float8 training is not importable ({error}); pip install 'cramming[fp8]'"
    return None


def float8_config(fp8):
    """torchao's Float8LinearConfig for impl.fp8 (the recipe; emulate: the casts with high-precision matmuls)."""
    from torchao.float8 import Float8LinearConfig  # the optional torchao: only under impl.precision=fp8

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(fp8.recipe), emulate=fp8.emulate)


def convert_to_fp8(model: nn.Module, fp8) -> list[str]:
    """Swap the layers `converts` picks for torchao's Float8Linear, in place; returns their names. The weights
    stay the same Parameter objects (ties and optimizer groups hold); the instance marks in CARRIED move over."""
    if reason := torchao_problem():
        raise UserError(f"impl.precision=fp8: {reason}")
    from torchao.float8 import convert_to_float8_training  # the optional torchao (checked just above)

    chosen = {name: module for name, module in model.named_modules() if converts(name, module, fp8.min_elements)}
    marks = {name: {k: getattr(m, k) for k in CARRIED if hasattr(m, k)} for name, m in chosen.items()}
    convert_to_float8_training(model, config=float8_config(fp8), module_filter_fn=lambda m, name: name in chosen)
    for name, carried in marks.items():
        for key, value in carried.items():
            setattr(model.get_submodule(name), key, value)
    return list(chosen)


def fp8_problem(config) -> str | None:
    """impl.precision=fp8 against the rest of the config, at load time: torchao importable (DeepSpeed, which casts
    the whole model to its own precision, refuses fp8 itself: engines/deepspeed.py)."""
    impl = config.impl
    if impl.precision != "fp8":
        return None
    if reason := torchao_problem():
        return invalid("impl.precision", "fp8", reason)
    return None


