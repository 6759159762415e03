"""The attention kernels by name (`impl.attention`), and the path of queries whose mask needs their positions (a KV
cache's step). The kernel computes softmax(QK^T * scale + bias)V for modeling_crammed.SelfAttention: every kernel is
`fn(q, k, v, spec)`, spec an attention_masks.AttentionSpec (its fields' meaning: attention_masks.py), and must give
the same numbers, or refuse what it cannot do. The spec's `scale` is None for the usual 1/sqrt(d), or
the one arch.parametrization sets (parametrization.py: muP's 1/d).
"""

import math

import torch
from torch.nn import functional as F

from .attention_masks import AttentionSpec, alibi_bias, alibi_bias_at, alibi_slopes, same_document, visible_keys  # noqa: F401  (this API)
from .patterns import PATTERNS
from .positions import POSITIONS
from .registry import Registry

ATTENTION_KERNELS = Registry("attention kernel", traits={
    "needs_triton": "it is a Triton kernel: refused where Triton cannot run (impl.triton_problem)",
})
# What a kernel may be asked beyond q, k, v and the spec's padding / causal masks: the patterns' mask fields (window,
# stepped, topk), the position schemes' biases (alibi, a given score bias), dropout and documents.
FEATURES = {"window": "a local window", "stepped": "stepped blocks", "topk": "top-k selection",
            "alibi": "ALiBi bias", "bias": "learned relative-position bias", "dropout": "attention dropout",
            "documents": "document masking"}


def attention_kernel(name: str, serves: set[str], fit_problem=None, **traits):
    """Register a kernel with the FEATURES it computes; `fit_problem(config, device, dtype)` says what else it
    refuses (say, a head dim too large for its tiles), or is None. Not `problem`: validation asks that with the
    run config alone (registry.own_problem). traits: ATTENTION_KERNELS' declared ones."""
    def add(fn):
        fn.serves, fn.fit_problem = frozenset(serves), fit_problem
        return ATTENTION_KERNELS.register(name, **traits)(fn)

    return add


def kernel_problem(kernel, config, documents: bool = False) -> str | None:
    """Why `kernel` cannot compute this architecture's attention (config: an ArchConfig or CrammedConfig), or
    None: each pattern and position scheme names the spec fields it needs, the kernel the ones it serves; documents:
    the run keeps packed documents apart (data.document_masking)."""
    patterns = list(dict.fromkeys(config.attention.pattern))
    missing = [p for p in patterns if set(PATTERNS[p].kernel_args(config)) - kernel.serves]
    if missing:
        served = [name for name, p in PATTERNS.items() if set(p.kernel_args(config)) <= kernel.serves]
        notes = "".join(f" ({PATTERNS[p].kernel_note})" for p in missing if PATTERNS[p].kernel_note)
        return f"it implements the {words(served)} patterns, not {', '.join(missing)}{notes}"
    needed = POSITIONS[config.position].kernel_arg
    if needed and needed not in kernel.serves:
        return f"it has no {FEATURES[needed]} (arch.position={config.position})"
    if config.attention_dropout > 0 and "dropout" not in kernel.serves:
        return f"it has no attention dropout (arch.attention_dropout={config.attention_dropout}); set it to 0"
    if documents and "documents" not in kernel.serves:
        return "it has no document masking (data.document_masking=true)"
    return None


def words(names: list[str]) -> str:
    return " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"


def spec_visible(q, spec: AttentionSpec) -> torch.Tensor | None:
    """attention_masks.visible_keys for a square (q and k of one length) call with this spec."""
    return visible_keys(q.shape[2], spec.causal, spec.window, spec.padding, q.device, spec.stepped, spec.documents)


def score_bias(q, alibi: bool, bias):
    """The additive score bias in fp32 (ALiBi and/or a given bias), or None."""
    total = alibi_bias(q.shape[2], q.shape[1], q.device) if alibi else None
    if bias is not None:
        total = bias.float() if total is None else total + bias.float()
    return total


@attention_kernel("sdpa", serves={"window", "stepped", "alibi", "bias", "dropout", "documents"})
def sdpa_attention(q, k, v, spec: AttentionSpec = AttentionSpec()):
    """PyTorch's fused kernels (flash / memory-efficient / math, picked by PyTorch from the mask it gets)."""
    if spec.topk is not None:
        raise ValueError("the 'sdpa' attention kernel cannot do top-k attention (it never holds the scores); "
                         "use the 'eager' kernel")
    if (spec.padding is None and spec.window is None and spec.stepped is None and not spec.alibi
            and spec.bias is None and spec.documents is None):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=spec.dropout_p, is_causal=spec.causal,
                                              scale=spec.scale)  # flash-eligible
    mask = spec_visible(q, spec)
    additive = score_bias(q, spec.alibi, spec.bias)
    if additive is not None:
        mask = (additive if mask is None else additive.masked_fill(~mask, float("-inf"))).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=spec.dropout_p, scale=spec.scale)


@attention_kernel("eager", serves=set(FEATURES))
def eager_attention(q, k, v, spec: AttentionSpec = AttentionSpec()):
    """The textbook formula, in fp32: the reference the fused kernels are tested against."""
    return weighted_values(eager_probs(q, k, spec), v, spec)


@attention_kernel("matmul", serves=set(FEATURES))
def matmul_attention(q, k, v, spec: AttentionSpec | None = None):
    """The eager formula with its two products in the inputs' dtype (bf16 under autocast: a CPU's AMX or
    AVX512-BF16 units) and the softmax in fp32. impl.attention=auto takes it for bf16 on CPUs, where SDPA's bf16
    backward is several times slower (impl.resolve_kernels). Top-k selects on eager's fp32 scores: rounded ones
    would choose other keys."""
    spec = spec or AttentionSpec()
    probs = eager_probs(q, k, spec, exact=spec.topk is not None)
    probs = F.dropout(probs, p=spec.dropout_p, training=spec.dropout_p > 0)
    return probs.to(v.dtype) @ v


def weighted_values(probs, v, spec: AttentionSpec) -> torch.Tensor:
    """The attention probabilities (after the spec's dropout) times the values, in v's dtype."""
    probs = F.dropout(probs, p=spec.dropout_p, training=spec.dropout_p > 0)
    return (probs @ v.float()).to(v.dtype)


def eager_probs(q, k, spec: AttentionSpec, exact: bool = True) -> torch.Tensor:
    """softmax(q k^T * scale + bias, masked) in fp32, (batch, heads, queries, keys): the probabilities that
    output_attentions returns; a query that sees nothing gets zeros. exact=False: q k^T in the inputs' dtype."""
    scores = q.float() @ k.float().transpose(-2, -1) if exact else (q @ k.transpose(-2, -1)).float()
    scores = scores / math.sqrt(q.shape[-1]) if spec.scale is None else scores * spec.scale
    additive = score_bias(q, spec.alibi, spec.bias)
    if additive is not None:
        scores = scores + additive
    visible = spec_visible(q, spec)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    topk = spec.topk
    if topk is not None and topk < scores.shape[-1]:  # ties at the k-th score keep all tied keys
        kth = scores.topk(topk, dim=-1).values[..., -1:]
        below = scores < kth
        visible = ~below if visible is None else visible & ~below
        scores = scores.masked_fill(below, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if visible is not None:  # a query that sees nothing: softmax gave NaN, the convention is zero output
        probs = probs.masked_fill(~visible.any(-1, keepdim=True), 0.0)
    return probs


def attend_at(q, k, v, spec: AttentionSpec, pattern, positions=None, record: list | None = None,
              shared: dict | None = None):
    """The queries of the last q.shape[2] rows against all k.shape[2] keys (a KV cache's step, or queries whose
    mask needs their positions), with the same mask and bias as the square kernels (mask_at). One formula for every
    impl.attention (the fused kernels need equal q and k lengths): SDPA with the mask as an additive bias, or the
    eager formula for top-k and when `record` (a list) keeps the probabilities; a query that sees nothing gets
    zeros. shared: the forward's dict the layers share (context.Context.shared), or None."""
    additive, sees_nothing = mask_at(q, k, spec, pattern, positions, shared)
    if spec.topk is not None or record is not None:
        probs = eager_probs(q, k, AttentionSpec(topk=spec.topk, bias=additive, scale=spec.scale))
        probs = probs.masked_fill(sees_nothing, 0.0)
        if record is not None:
            record.append(probs.to(q.dtype))
        y = weighted_values(probs, v, spec).to(q.dtype)
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=additive.to(q.dtype), dropout_p=spec.dropout_p,
                                           scale=spec.scale)
    return y.masked_fill(sees_nothing, 0.0)


def mask_at(q, k, spec: AttentionSpec, pattern, positions=None, shared: dict | None = None):
    """attend_at's additive mask (1 or batch, 1 or heads, queries, keys) and which queries see nothing. Every layer
    of a cached step with the same pattern asks for the same mask: given the forward's `shared` dict, it is built
    once there (a cached step is mostly such small ops). A layer's own score bias is added to its own."""
    if shared is None or spec.bias is not None:
        return build_mask_at(q, k, spec, pattern, positions)
    # the forward keeps padding, documents and positions alive: their ids name them for its length
    key = ("mask_at", pattern, spec.window, spec.stepped, spec.topk, spec.causal, spec.alibi and q.shape[1],
           q.shape[2], k.shape[2], q.device, id(spec.padding), id(spec.documents), id(positions))
    if key not in shared:
        shared[key] = build_mask_at(q, k, spec, pattern, positions)
    return shared[key]


def build_mask_at(q, k, spec: AttentionSpec, pattern, positions=None):
    """The spec's pattern mask (pattern.visible at its window / stepped / topk), causality, padding, documents,
    ALiBi and bias. Distances (causality, windows, ALiBi) count the tensor's indices, which are the real tokens'
    distances when padding is only on the left or the right; an absolute pattern (stepped) is computed at
    `positions` (the context's Positions, context.py) when given."""
    key_idx = torch.arange(k.shape[2], device=q.device)
    query_idx = key_idx[k.shape[2] - q.shape[2]:]
    at = (positions.ids, positions.key_ids) if positions is not None and pattern.absolute else (query_idx, key_idx)
    visible = pattern.visible(*at, window=spec.window, stepped=spec.stepped, topk=spec.topk)
    if visible is None:
        visible = torch.ones(query_idx.shape[0], key_idx.shape[0], dtype=torch.bool, device=q.device)
    if spec.causal:
        visible = visible & (query_idx[:, None] >= key_idx[None, :])
    visible = visible.reshape(-1, 1, *visible.shape[-2:])  # (1 or batch, 1, queries, keys)
    if spec.padding is not None:
        visible = visible & spec.padding[:, None, None, :].bool()
    if spec.documents is not None:
        visible = visible & same_document(spec.documents[:, -q.shape[2]:], spec.documents)
    additive = alibi_bias_at(query_idx, key_idx, q.shape[1]) if spec.alibi else torch.zeros((), device=q.device)
    if spec.bias is not None:
        additive = additive + spec.bias.float()
    return additive.masked_fill(~visible, float("-inf")), ~visible.any(-1, keepdim=True)
