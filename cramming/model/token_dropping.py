"""Token dropping (Hou et al., "Token Dropping for Efficient BERT Pretraining", ACL 2022), `arch.token_dropping`:
which layers see only the kept tokens (DroppingStack, the order the blocks run in: a STACKS entry, blocks.py), and
which tokens are kept (TokenImportance, the per-id running MLM loss that CrammedForMaskedLM asks). Training-only: a
checkpoint ships this file when it was pretrained with token dropping."""

import math

import torch
import torch.distributed as dist
from torch import nn

from .blocks import STACKS, Stack
from .context import Context, Positions

# The layout is the TF reference's (tensorflow/models, official/projects/token_dropping/encoder.py), whose encoder
# says: "For a 12-layer BERT: 1. All tokens fist go though 5 transformer layers, then 2. Only important tokens go
# through 1 transformer layer with cross attention to unimportant tokens, then 3. Only important tokens go through 5
# transformer layers without cross attention. 4. Finally, all tokens go through the last layer." In general, with
# L layers and arch.token_dropping.layers = [first, last) (default the reference's [L // 2 - 1, L - 1)):
#   - layers 0 .. first - 1 see every token;
#   - layer `first` (with `cross_first`, the default) updates only the k kept tokens, whose queries attend to every
#     token's keys and values; computed as the whole layer with its kept rows taken, which is the same numbers;
#   - layers first + 1 .. last - 1 see only the kept tokens (attending among themselves);
#   - the dropped tokens rejoin before layer `last` with the state they had when they were dropped, the input of
#     layer `first` (the reference's x_not_selected); layers last .. L - 1 and the MLM loss see every token.
# With cross_first=false layer `first` too sees only the kept tokens (no cross-attention).
# k = round(keep * seq_len) is fixed per sequence length: shapes stay static for torch.compile and CUDA graphs.
#
# Importance is the paper's cumulative-loss criterion: a running average of the MLM loss per vocabulary id
# (`TokenImportance.loss`, a model buffer, so checkpoints and exact resume carry it), updated from every training
# forward's per-masked-token losses; the tokens whose id has the lowest average are dropped. [CLS], [SEP] and [MASK]
# are always kept, [PAD] (and any position the attention mask hides) is dropped first. Every id starts at ln(vocab),
# the loss of a uniform prediction, which is about where an untrained model's loss is: the averages of ids seen
# fall from there as the model learns, so ids not seen yet rank as important and are kept. Under torch.distributed
# the per-id loss sums and counts are all-reduced before the update, so every rank moves by the whole global
# microbatch and all ranks hold the same buffer.
#
# Only CrammedForMaskedLM drops, and only in training mode with labels: validation, fine-tuning and inference
# always run the whole sequence. Unlike the reference, ids seen more than once in a forward move by the mean of their
# losses (the reference's scatter keeps an arbitrary one), and [UNK] is an ordinary id (the reference keeps it).


@STACKS.register("token-dropping")
class DroppingStack(Stack):
    """Token dropping's layers [first, last) update only the kept tokens; the dropped ones wait as they are and
    rejoin after them (above). With cross_first the first of them reads every token as keys and values,
    and only the kept queries' rows go on (the reference's cross-attention). A forward without `keep` (validation,
    fine-tuning, inference) runs every block on every token. `stack(model, x, ctx, at, keep)`:
    modeling_crammed.CrammedModel.blocks' arguments."""

    def __init__(self, config):
        self.dropping, self.cross_first = dropping_layers(config), config.token_dropping.cross_first

    @staticmethod
    def chosen(config) -> bool:
        return dropping_layers(config) is not None

    @staticmethod
    def importance(config) -> "TokenImportance":
        """The per-id running loss, held by the MLM head: its buffer is saved with the weights."""
        return TokenImportance(config)

    def __call__(self, model, x, ctx, at, keep=None):
        if keep is None:
            return model.run_blocks(x, range(len(model.layers)), at)
        first, last = self.dropping.start, self.dropping.stop
        x = model.run_blocks(x, range(first), at)
        kept = kept_context(ctx, keep, x.shape[1])
        if self.cross_first:
            y = gather_tokens(model.layers[first](x, at(first)), keep)
        else:
            y = model.layers[first](gather_tokens(x, keep), at(first, kept))
        record = ctx.hidden_states is not None  # the dropped tokens as they wait, the kept ones updated
        if record:
            ctx.record(scatter_tokens(x, keep, y))
        for i in self.dropping[1:]:
            y = model.layers[i](y, at(i, kept))
            if record:
                ctx.record(scatter_tokens(x, keep, y))
        x = scatter_tokens(x, keep, y)
        return model.run_blocks(x, range(last, len(model.layers)), at)


def kept_context(ctx: Context, keep: torch.Tensor, seq_len: int) -> Context:
    """The context of the kept tokens alone: their padding, document ids and positions."""
    ids = keep if ctx.positions is None else ctx.positions.ids.gather(1, keep)
    return ctx._replace(padding=None if ctx.padding is None else gather_tokens(ctx.padding, keep),
                        documents=None if ctx.documents is None else gather_tokens(ctx.documents, keep),
                        positions=Positions(ids, seq_len))


def split(config) -> tuple[int, int]:
    """[first, last) as configured, or the reference's [L // 2 - 1, L - 1) (config: a CrammedConfig or ArchConfig)."""
    layers = config.token_dropping.layers
    return tuple(layers) if layers is not None else (config.num_layers // 2 - 1, config.num_layers - 1)


def dropping_layers(config) -> range | None:
    """The layers that update only the kept tokens, [first, last), or None when off. With cross_first the first of
    them still reads every token (as keys and values); the others see only the kept ones."""
    drop = config.token_dropping
    if drop.keep is None or drop.keep >= 1.0:
        return None
    return range(*split(config))


def kept_only_layers(config) -> range:
    """The layers that see only the kept tokens, queries and keys alike (empty when token dropping is off)."""
    dropping = dropping_layers(config) or range(0)
    return dropping[1:] if config.token_dropping.cross_first else dropping


def kept_count(keep: float, seq_len: int) -> int:
    """k: the tokens per sequence the dropping layers see, at least one."""
    return min(seq_len, max(1, round(keep * seq_len)))


class TokenImportance(nn.Module):
    """The per-id running MLM loss and what CrammedForMaskedLM asks of it: which positions to keep, and the update
    from each training forward's per-token losses."""

    def __init__(self, config):
        super().__init__()
        self.keep, self.decay = config.token_dropping.keep, config.token_dropping.decay
        self.always = (config.cls_token_id, config.sep_token_id, config.mask_token_id)
        self.pad = config.pad_token_id
        self.register_buffer("loss", torch.full((config.vocab_size,), math.log(config.vocab_size)))

    def init_weights_(self, init, std: float) -> None:
        init.constant_(self.loss, math.log(self.loss.shape[0]))

    @torch.no_grad()
    def choose(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """The (batch, k) positions to keep, in order; None when k is the whole sequence."""
        k = kept_count(self.keep, input_ids.shape[1])
        if k >= input_ids.shape[1]:
            return None
        always = (input_ids == self.always[0]) | (input_ids == self.always[1]) | (input_ids == self.always[2])
        never = input_ids == self.pad
        if attention_mask is not None:
            never = never | (attention_mask == 0)
        score = self.loss[input_ids].masked_fill(always, math.inf).masked_fill(never, -math.inf)
        return score.topk(k, dim=1).indices.sort(dim=1).values

    @torch.no_grad()
    def update(self, targets: torch.Tensor, losses: torch.Tensor) -> None:
        """Move each id's average toward the mean of its losses in this forward. targets: the true ids (-100: not
        predicted); losses: the same rows' cross-entropy. A non-finite loss (a step the trainer will skip) is left
        out, so it cannot poison the averages. Under torch.distributed every rank must call this once per
        microbatch (they all take the same microbatches): the sums and counts are all-reduced first."""
        targets, losses = targets.reshape(-1), losses.reshape(-1).float()
        valid = (targets != -100) & torch.isfinite(losses)
        ids = torch.where(valid, targets, 0)
        # per id: the loss sum, the count
        stats = torch.zeros(2, self.loss.shape[0], device=self.loss.device, dtype=torch.float32)
        stats[0].index_add_(0, ids, torch.where(valid, losses, 0.0))
        stats[1].index_add_(0, ids, valid.float())
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stats)  # every rank's microbatch slice: the ranks move as one process would
        sums, counts = stats[0], stats[1]
        moved = self.decay * self.loss + (1 - self.decay) * (sums / counts.clamp(min=1))
        self.loss.copy_(torch.where(counts > 0, moved, self.loss))


def gather_tokens(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The kept rows of x (batch, seq, ...) at the (batch, k) positions `keep`."""
    index = keep.view(*keep.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


def scatter_tokens(full: torch.Tensor, keep: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`full` with the kept rows replaced by `kept` (out of place: gradients reach both)."""
    index = keep.view(*keep.shape, 1).expand(-1, -1, full.shape[-1])
    return full.scatter(1, index, kept.to(full.dtype))
