"""U-net skip connections (the GPT speedrun, `arch.unet_skips`): the outputs of the first half's blocks are kept and
added, each with a learned scalar weight (starting at 1), to the inputs of the mirrored blocks of the second half:
block i's output enters block num_layers - 1 - i. Early features reach the late blocks without passing through the
middle ones. The skips' weights are the model's module `unet`; UNetStack is the order the blocks run in (a STACKS
entry, blocks.py)."""

import torch
from torch import nn

from .blocks import STACKS, Stack


@STACKS.register("unet")
class UNetStack(Stack):
    """Every block in turn, each second-half block's input joined by its mirror's output (UNetSkips weighs it)."""

    @staticmethod
    def chosen(config) -> bool:
        return bool(config.unet_skips)

    @staticmethod
    def weights(config) -> dict[str, nn.Module]:
        return {"unet": UNetSkips(config)}

    def __call__(self, model, x, ctx, at, keep=None):
        outputs = []
        for i, layer in enumerate(model.layers):
            ctx = at(i)
            x = ctx.record(layer(model.unet(i, x, outputs), ctx))
            outputs.append(x)
        return x


class UNetSkips(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_layers = config.num_layers
        self.weights = nn.Parameter(torch.ones(config.num_layers // 2))

    def init_weights_(self, init, std: float) -> None:
        init.ones_(self.weights)

    def forward(self, index: int, x: torch.Tensor, outputs: list[torch.Tensor]) -> torch.Tensor:
        """The input of block `index`, given the outputs of the blocks before it."""
        receiver = index - (self.num_layers - len(self.weights))  # its place among the second half's receivers
        if receiver < 0:
            return x
        return x + self.weights[receiver].to(x.dtype) * outputs[self.num_layers - 1 - index]
