"""How the encoder runs its blocks, chosen once when the model is built (`build_stack`): every block in turn on
every token (Stack), the GPT speedrun's U-net whose mirrored halves are joined by skips (UNetStack, `arch.unet_skips`),
or token dropping, whose middle layers see only the kept tokens (DroppingStack, `arch.token_dropping`).

A stack holds only the structure; the blocks and the skips' weights stay the model's modules (`model.layers`,
`model.unet`), so checkpoints keep their tensor names and an engine that wraps a block in place is seen here.
`stack(model, x, ctx, at, keep)`: x the embedded tokens, ctx the forward's context (context.py), at(i, base=ctx)
block i's context built on base, keep the (batch, k) kept positions of a token-dropping training forward (None
otherwise: every block sees every token).
"""

from .token_dropping import dropping_layers, gather_tokens, scatter_tokens


def recorded(x, ctx):
    """output_hidden_states: a block's output kept (ctx.hidden_states, a list, when asked for)."""
    if ctx.hidden_states is not None:
        ctx.hidden_states.append(x)
    return x


class Stack:
    """Every block in turn, on every token."""

    def __call__(self, model, x, ctx, at, keep=None):
        return self.run(model, x, range(len(model.layers)), at)

    def run(self, model, x, layers: range, at):
        for i in layers:
            ctx = at(i)
            x = recorded(model.layers[i](x, ctx), ctx)
        return x


class UNetStack(Stack):
    """The first half's outputs enter the mirrored blocks of the second half (unet.py weighs them)."""

    def run(self, model, x, layers: range, at):
        outputs = []
        for i in layers:
            ctx = at(i)
            x = recorded(model.layers[i](model.unet(i, x, outputs), ctx), ctx)
            outputs.append(x)
        return x


class DroppingStack(Stack):
    """Token dropping's layers [first, last) update only the kept tokens; the dropped ones wait as they are and
    rejoin after them (token_dropping.py). With cross_first the first of them reads every token as keys and values,
    and only the kept queries' rows go on (the reference's cross-attention). A forward without `keep` (validation,
    fine-tuning, inference) runs every block on every token."""

    def __init__(self, dropping: range, cross_first: bool):
        self.dropping, self.cross_first = dropping, cross_first

    def __call__(self, model, x, ctx, at, keep=None):
        if keep is None:
            return super().__call__(model, x, ctx, at)
        first, last = self.dropping.start, self.dropping.stop
        x = self.run(model, x, range(first), at)
        kept = ctx.kept(keep, x.shape[1])  # the context of the kept tokens alone
        if self.cross_first:
            y = gather_tokens(model.layers[first](x, at(first)), keep)
        else:
            y = model.layers[first](gather_tokens(x, keep), at(first, kept))
        record = ctx.hidden_states is not None  # the dropped tokens as they wait, the kept ones updated
        if record:
            recorded(scatter_tokens(x, keep, y), ctx)
        for i in self.dropping[1:]:
            y = model.layers[i](y, at(i, kept))
            if record:
                recorded(scatter_tokens(x, keep, y), ctx)
        x = scatter_tokens(x, keep, y)
        return self.run(model, x, range(last, len(model.layers)), at)


def build_stack(config) -> Stack:
    """The stack arch's options ask for; validation refuses U-net skips with token dropping (token_dropping.py)."""
    dropping = dropping_layers(config)
    if dropping is not None:
        return DroppingStack(dropping, config.token_dropping.cross_first)
    return UNetStack() if config.unet_skips else Stack()
