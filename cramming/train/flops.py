"""FLOPs per token, counted from the model that was built, so structured linear layers count their own structure.

Training code, not model code: a checkpoint does not ship it. Each counter is kept by the class it counts
(`FLOPS`, found along the class's MRO); a block or linear layer of your own adds its counter here from its own
file (`FLOPS[MyBlock] = lambda block, seq_len: ...`). 2 FLOPs per multiply-add throughout."""

from torch import nn

from ..model.gmlp import GMLPBlock
from ..model.linear import LinearMethods
from ..model.modeling_crammed import TransformerBlock
from ..model.structured_linear import BTTMoE, Kronecker
from ..model.token_dropping import kept_count, kept_only_layers


def weights_once(layer, seq_len: int = 0) -> int:
    """A linear layer that uses every weight once per token, as a dense one does: 2 x its factors' sizes."""
    return 2 * sum(weight.numel() for weight, _ in layer.factors())


def kronecker(layer, seq_len: int = 0) -> int:
    """(A kron B) x as two small products: B on each of a_in chunks, then A across them."""
    (a_out, a_in), (b_out, b_in) = layer.A.shape, layer.B.shape
    return 2 * (a_in * b_in * b_out + a_out * a_in * b_out)


def btt_moe(layer, seq_len: int = 0) -> int:
    """The router, and the experts_k experts a grouped kernel would run (the reference forward runs them all)."""
    return 2 * layer.experts * layer.in_features + layer.experts_k * weights_once(layer) // layer.experts


def projections(module: nn.Module) -> int:
    """The structured-or-dense layers inside `module`, each by its own counter."""
    return sum(counter(m)(m) for m in module.modules() if isinstance(m, LinearMethods))


def transformer_block(block, seq_len: int) -> int:
    """Its projections, then the scores and the weighted sum: 4 * seq * hidden, half of it when causal
    (FlashAttention's convention: the masked half is skipped)."""
    attention = block.attn
    width = attention.num_heads * attention.head_dim
    return projections(block) + 4 * seq_len * width // (2 if attention.spec.causal else 1)


def tiny_attention(module, seq_len: int) -> int:
    """aMLP's two plain projections, and one head of width dim attending over seq (halved when causal)."""
    plain = 2 * (module.qkv.weight.numel() + module.out.weight.numel())
    return plain + 4 * seq_len * module.dim // (2 if module.causal else 1)


def gmlp_block(block, seq_len: int) -> int:
    """up and down, the spatial mixing (each position sums seq positions over the gate's half width; the causal
    triangle is a masked full matrix, so it costs the same), and aMLP's tiny attention."""
    tiny = tiny_attention(block.tiny_attention, seq_len) if block.tiny_attention is not None else 0
    return projections(block) + 2 * seq_len * block.half + tiny


FLOPS = {LinearMethods: weights_once, Kronecker: kronecker, BTTMoE: btt_moe, TransformerBlock: transformer_block,
         GMLPBlock: gmlp_block}


def counter(module):
    """The counter of the nearest class of `module` that has one."""
    for cls in type(module).__mro__:
        if cls in FLOPS:
            return FLOPS[cls]
    raise ValueError(f"no FLOPs counter for {type(module).__name__}: add one to cramming.train.flops.FLOPS "
                     "(FLOPS[cls] = fn(module, seq_len) -> forward FLOPs per token)")


def block_flops(block, seq_len: int) -> int:
    """Forward FLOPs per token of one block over sequences of seq_len."""
    return counter(block)(block, seq_len)


def forward_flops_per_token(model, seq_len: int, predicted_share: float = 1.0) -> int:
    """Forward FLOPs for one token: each block's own count (its projections, each layer counting its structure,
    and its mixing across positions: attention, or gMLP's spatial gate and aMLP's tiny attention), and the output
    head on the share of tokens it sees (the sparse MLM head: only the masked ones). With arch.token_dropping the
    layers that see only the kept tokens count at k: k / seq_len of the tokens, each attending to k keys; the first
    dropping layer with cross_first counts whole (it runs whole; its dropped rows are discarded). Training is ~3x
    this. objective=rtd (model/electra.py): the detector on every token instead of a vocabulary head, plus the whole
    generator (with its embedding projection and its head's transform back to the shared embeddings' width,
    arch.rtd.tie_embeddings)."""
    c = model.config
    dropping = kept_only_layers(c)
    k = kept_count(c.token_dropping.keep, seq_len) if dropping else seq_len
    blocks = sum(block_flops(block, k) * k / seq_len if i in dropping else block_flops(block, seq_len)
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
