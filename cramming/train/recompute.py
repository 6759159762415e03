"""impl.activation_checkpointing: each block keeps only its input for the backward pass and runs its forward again
there (torch.utils.checkpoint, non-reentrant, the random state replayed so dropout draws the same). The loss and
gradients are those of the plain run to rounding; the activations held between forward and backward shrink from
every block's intermediates to one tensor per block, which lets impl.microbatch_size=auto take larger microbatches
on a small GPU, for about a third more compute per step."""

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from ..model.modeling_crammed import CrammedModel


def recompute_blocks(model: nn.Module) -> int:
    """Turn on gradient checkpointing in every block of every encoder in `model` (the generator's too), the way
    transformers' gradient_checkpointing_enable does (the blocks are GradientCheckpointingLayers), with the
    non-reentrant checkpoint; returns how many blocks it turned on. The module tree and its state dict are
    unchanged."""
    count = 0
    for encoder in {id(m): m for m in model.modules() if isinstance(m, CrammedModel)}.values():
        for block in encoder.layers:
            if not block.gradient_checkpointing:
                block._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)
                block.gradient_checkpointing = True
                count += 1
    return count
