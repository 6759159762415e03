"""FLOPs per token, counted from the model that was built, so structured linear layers count their own."""

from torch import nn

from ..model.stacks import kept_count, kept_only_layers


def forward_flops_per_token(model, seq_len: int, predicted_share: float = 1.0) -> int:
    """Forward FLOPs (2 per multiply-add) for one token: each block's own count (its projections, each layer
    counting its structure, and its mixing across positions: attention, or gMLP's spatial gate and aMLP's tiny
    attention), and the output head on the share of tokens it sees (the sparse MLM head: only the masked ones).
    With arch.token_dropping the layers that see only the kept tokens count at k: k / seq_len of the tokens, each
    attending to k keys; the first dropping layer with cross_first counts whole (it runs whole; its dropped rows
    are discarded). Training is ~3x this. objective=rtd (model/heads.py): the detector on every token
    instead of a vocabulary head, plus the whole generator (with its embedding projection and its head's transform
    back to the shared embeddings' width, arch.rtd.tie_embeddings)."""
    c = model.config
    dropping = kept_only_layers(c)
    k = kept_count(c.token_dropping.keep, seq_len) if dropping else seq_len
    blocks = sum(block.flops_per_token(k) * k / seq_len if i in dropping else block.flops_per_token(seq_len)
                 for i, block in enumerate(model.encoder.layers))
    if getattr(model, "generator", None) is not None:
        detector = 2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size
        return int(blocks + detector + forward_flops_per_token(model.generator, seq_len, predicted_share))
    head = 2 * model.decoder.in_features * c.vocab_size * predicted_share
    return int(blocks + head + linear_flops(model.encoder.embedding_project)
               + linear_flops(getattr(model, "transform", None)) * predicted_share)


def linear_flops(module) -> int:
    """2 x in x out for each dense projection in a module outside the blocks (a head transform, an embedding
    projection), per token it sees."""
    if module is None:
        return 0
    return sum(2 * m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))
