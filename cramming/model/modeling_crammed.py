"""The crammed model read top to bottom, as Hugging Face models: the feed-forward block, self-attention, the
transformer block (attention then feed-forward, each a residual branch, normalised pre or post), the model
(embeddings -> blocks -> final norm, CrammedModel), the MLM head (CrammedForMaskedLM) and the next-token head of
causal models (CrammedForCausalLM, `objective: clm`, whose attention is causal).

Every variant is a file of its own, registered at an extension point this file asks by name (docs/extending.md):
the attention kernel and pattern (attention.py, patterns.py), the position scheme (positions.py), the linear layers
(linear.py), the activation and norm (activations.py, norms.py), the block kind and the stack (blocks.py) and
arch.parametrization. variants.py imports the variant files (gmlp.py, rotary.py, unet.py, ...), last of all below;
a saved checkpoint's imports only those its config uses. What every model shares as a PreTrainedModel (saving,
loading, init) is pretrained.py; the fine-tuning heads (GLUE's classifier and the others) are heads.py, ELECTRA's
pretraining head electra.py. Only relative imports: Hugging Face copies this folder flat for
`trust_remote_code=True`.
"""

import warnings

import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache, GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast, MaskedLMOutput

from .activations import ACTIVATIONS
from .arch import ArchConfig
from .attention import ATTENTION_KERNELS, attend_at, eager_attention, eager_probs, weighted_values
from .attention_masks import AttentionSpec
from .blocks import BLOCKS, build_stack, cache_problem
from .configuration_crammed import CrammedConfig, current_keys
from .context import PLAIN, Context, document_positions, position_ids_from_mask, token_positions
from .kv_cache import CACHE_KEY, LayerCache
from .linear import build_linear
from .losses import LOSSES, head_logits
from .norms import build_norm
from .parametrization import mark_hidden, parametrization
from .patterns import PATTERNS
from .positions import POSITIONS
from .pretrained import CrammedPreTrainedModel
from .registry import Registry, invalid
from .value_embeddings import ValueEmbeddings, ValueMix, value_layers

# ---------------------------------------------------------------- the feed-forward block (arch.ffn)

FFNS = Registry("ffn", traits={
    "gated": "its up projection is split into a gate and a value: the down projection takes ffn_size / 2",
})
FFNS.serves(ArchConfig, "ffn")


@FFNS.register("mlp")
class MLP(nn.Module):
    """Two projections, hidden -> ffn_size -> hidden, with the activation between (BERT's feed-forward)."""

    def __init__(self, config):
        super().__init__()
        self.up = build_linear(config, "ffn", config.hidden_size, config.ffn_size)
        self.down = build_linear(config, "ffn", config.ffn_size, config.hidden_size)
        self.down.residual_output = True  # scaled down by arch.init=megatron-scaled
        self.act = ACTIVATIONS.get_or_explain(config.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


@FFNS.register("glu")
class GLU(nn.Module):
    """Gated linear unit: one projection to ffn_size, split in halves, act(a) * b, back from ffn_size / 2.

    This is Cramming's form: the GLU halves the width and is not rescaled to keep parameters equal.
    """

    gated = True

    @staticmethod
    def problem(config) -> str | None:
        if config.arch.ffn_size % 2:
            return invalid("arch.ffn_size", config.arch.ffn_size, "must be even for a GLU")
        return None

    def __init__(self, config):
        super().__init__()
        if config.ffn_size % 2:
            raise ValueError(f"ffn_size {config.ffn_size} is odd: a GLU splits it in halves")
        self.up = build_linear(config, "ffn", config.hidden_size, config.ffn_size)
        self.down = build_linear(config, "ffn", config.ffn_size // 2, config.hidden_size)
        self.down.residual_output = True
        self.act = ACTIVATIONS.get_or_explain(config.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * value)


# ---------------------------------------------------------------- self-attention


def autocast_dtype(q, k, v):
    """q, k, v in the autocast dtype. CUDA autocast runs layer/RMS norms in fp32 (CPU autocast in bf16), so with
    QK-norm q and k would reach the kernel as fp32 beside a bf16 v: every kernel gets one dtype instead."""
    device_type = q.device.type
    if not torch.is_autocast_enabled(device_type):
        return q, k, v
    dtype = torch.get_autocast_dtype(device_type)
    return q.to(dtype), k.to(dtype), v.to(dtype)


class SelfAttention(nn.Module):
    """Multi-head self-attention: one projection to queries, keys and values, softmax(QK^T * scale + bias)V by the
    kernel impl.attention names (attention.py), and the output projection. Its extension points: the pattern
    (which keys a query sees, patterns.py), the position scheme's rotation (rotary.py), value embeddings, the KV
    cache. `index` counts the attention blocks only: the pattern list and arch.rotary.every cycle over those."""

    def __init__(self, config, index: int = 0):
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise ValueError(f"hidden_size {config.hidden_size} is not divisible by num_heads {config.num_heads}")
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.qkv = build_linear(config, "attention", config.hidden_size, 3 * config.hidden_size)
        self.out = build_linear(config, "attention", config.hidden_size, config.hidden_size)
        self.out.residual_output = True  # scaled down by arch.init=megatron-scaled
        # QK-norm (Dehghani et al. 2023): normalise each head's queries and keys, bounding the attention logits.
        self.q_norm = build_norm(config, self.head_dim) if config.qk_norm else nn.Identity()
        self.k_norm = build_norm(config, self.head_dim) if config.qk_norm else nn.Identity()
        self.dropout = config.attention_dropout
        self.kernel = ATTENTION_KERNELS.get_or_explain(config.attention_impl)
        self.config = config  # its _attn_implementation: "eager" (transformers' name) asks for the eager kernel
        self.pattern = PATTERNS.get_or_explain(config.attention.pattern[index % len(config.attention.pattern)])
        positions = POSITIONS.get_or_explain(config.position)
        self.rotary = positions.rotation(config, index)
        self.value_mix = ValueMix() if index in value_layers(config) else None  # arch.value_embeddings
        # the static part of every call's spec: a forward adds its context's tensors and dropout
        self.spec = self.static_spec(config, alibi=positions.alibi,
                                     scale=parametrization(config).attention_scale(config))  # None: 1/sqrt(head_dim)

    def static_spec(self, config, alibi: bool, scale: float | None) -> AttentionSpec:
        """Causality, ALiBi, the scale and the pattern's window / stepped / topk (its kernel_args, which
        set_attention_window re-reads when train.window_schedule changes the window)."""
        return AttentionSpec(causal=config.causal, alibi=alibi, scale=scale, **self.pattern.kernel_args(config))

    def forward(self, x: torch.Tensor, ctx: Context = PLAIN) -> torch.Tensor:
        """ctx: this forward's context (context.py). With a cache slot, x holds only the tokens after the cached
        ones, at positions cache.past onwards (with an empty cache, the prompt, the kernel runs as without one).
        Given positions, rotary turns by them and an absolute pattern (stepped) masks by them."""
        batch, seq_len, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq, head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        if ctx.value_embedding is not None:
            v = self.value_mix(v, ctx.value_embedding)
        q, k, v = autocast_dtype(q, k, v)
        spec = self.spec._replace(padding=ctx.padding, bias=ctx.bias, documents=ctx.documents,
                                  dropout_p=self.dropout if self.training else 0.0)
        cache = ctx.cache
        if self.rotary is not None:  # before the keys are cached: the cache keeps them turned
            q, k = self.rotary(q, k, 0 if cache is None else cache.past, ctx.positions, ctx.shared)
        if cache is not None:
            k, v = cache.append(k, v)
        if (cache is not None and cache.past) or (ctx.positions is not None and self.pattern.absolute):
            y = attend_at(q, k, v, spec, self.pattern, ctx.positions, ctx.attentions, ctx.shared)
        elif ctx.attentions is not None:  # output_attentions: the probabilities themselves, whatever the kernel
            probs = eager_probs(q, k, spec)
            ctx.attentions.append(probs.to(q.dtype))
            y = weighted_values(probs, v, spec).to(q.dtype)
        elif getattr(self.config, "_attn_implementation", None) == "eager":
            y = eager_attention(q, k, v, spec)
        else:
            y = self.kernel(q, k, v, spec)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, hidden))


def set_attention_window(model, window: int) -> None:
    """A built model's attention window changed (train.window_schedule, the speedrun's window warm-up): every local
    or stepped attention block rebuilds its static spec's pattern fields from the config, and the config keeps the
    new window, so a checkpoint saved afterwards loads with the window the model last trained with. model: a crammed
    model (the module itself, not a compiled or engine wrapper)."""
    config = model.config
    if config.attention.window == window:
        return
    config.attention.window = window
    for module in model.modules():
        if isinstance(module, SelfAttention):
            module.spec = module.spec._replace(**module.pattern.kernel_args(config))


# ---------------------------------------------------------------- the block (arch.layout)


@BLOCKS.register("attention")
class TransformerBlock(GradientCheckpointingLayer):
    """Self-attention then the feed-forward block, each with its residual and norm (pre or post, arch.norm_position).
    A GradientCheckpointingLayer: with gradient checkpointing on (transformers' gradient_checkpointing_enable, or
    impl.activation_checkpointing), it keeps only its input and runs again in the backward pass."""

    kv_cache = True  # its forward takes a LayerCache (kv_cache.py)
    token_subsets = True  # it may run on a subset of the tokens (arch.token_dropping), given their positions
    takes_value_embedding = True  # its attention mixes arch.value_embeddings' tables into the values
    width_scaled = True  # every weight's fan-in is the width: arch.parametrization=mup covers it

    @staticmethod
    def problem(config) -> str | None:
        """The first block's attention norm can be left out of pre-LN blocks only (post-LN norms the sum)."""
        a = config.arch
        if not a.first_attention_norm and a.norm_position == "post":
            return invalid("arch.first_attention_norm", False, "applies to pre-LN blocks only "
                           "(arch.norm_position=post normalises each residual sum); leave it true")
        return None

    def __init__(self, config, index: int = 0):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        # ModernBERT's first block reads the normalised embeddings as they are (arch.first_attention_norm=false)
        first_unnormed = self.pre_norm and index == 0 and not config.first_attention_norm
        self.norm1 = nn.Identity() if first_unnormed else build_norm(config)
        self.attn = SelfAttention(config, index)
        self.norm2 = build_norm(config)
        self.ffn = FFNS.get_or_explain(config.ffn)(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, ctx: Context = PLAIN) -> torch.Tensor:
        """ctx: this forward's context (context.py), which the attention reads."""
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), ctx))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, ctx)))
        return self.norm2(x + self.dropout(self.ffn(x)))



# ---------------------------------------------------------------- the model


def as_requested(output, return_dict, config):
    """The output as transformers' models give it: a ModelOutput, or with return_dict=False (the argument, else the
    config's) a tuple of its fields that are set."""
    wanted = return_dict if return_dict is not None else getattr(config, "return_dict", True)
    return output if wanted else output.to_tuple()


def given_cache(cache, past_key_values):
    """The cache passed as `cache` or under its older name past_key_values, which transformers now calls deprecated
    (said once per call, as transformers' own models do)."""
    if past_key_values is None:
        return cache
    if CACHE_KEY == "cache":
        warnings.warn("`past_key_values` is deprecated: pass the cache as `cache`", FutureWarning, stacklevel=3)
    return cache if cache is not None else past_key_values


def encoder_outputs(out) -> dict:
    """A head's share of its encoder's output: the hidden states and attentions, when they were asked for."""
    return {"hidden_states": out.hidden_states, "attentions": out.attentions}


def summed_over(loss, targets, num_items_in_batch):
    """A mean loss over the targets that count (!= -100) as a sum over num_items_in_batch of them, when the Trainer
    accumulates gradients and passes that count; the mean otherwise."""
    if num_items_in_batch is None:
        return loss
    return loss * (targets != -100).sum() / num_items_in_batch


def build_layers(config) -> list[nn.Module]:
    """arch.layout cycled over the layers; each block gets its index among blocks of its kind, so attention
    patterns and arch.rotary.every cycle over the attention blocks."""
    layers, seen = [], {}
    for i in range(config.num_layers):
        kind = config.layout[i % len(config.layout)]
        layers.append(BLOCKS.get_or_explain(kind)(config, seen.get(kind, 0)))
        seen[kind] = seen.get(kind, 0) + 1
    return layers


class CrammedModel(CrammedPreTrainedModel):
    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        positions = POSITIONS.get_or_explain(config.position)
        self.positions = positions.embedding(config)
        self.embedding_norm = build_norm(config) if config.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.embedding_project = nn.Identity()  # embeddings of another width, shared (ELECTRA's generator): to ours
        self.layers = nn.ModuleList(build_layers(config))
        mark_hidden(self.layers)  # arch.parametrization scales their init (parametrization.py) and lr (train/optim.py)
        # A score bias shared by all layers (T5's relative-position bias), computed once per forward (arch.rpe.cache)
        # or again in every layer. Checkpoints saved before it had this name hold it as `rpe` (OLD_KEYS).
        self.score_bias = positions.score_bias(config)
        self.final_norm = build_norm(config) if config.final_norm else nn.Identity()
        self.value_embeddings = ValueEmbeddings(config) if config.value_embeddings else None
        self.stack = build_stack(config)  # how the blocks run (blocks.STACKS): None in turn; a U-net; token dropping
        for name, module in (self.stack.weights(config) if self.stack is not None else {}).items():
            self.add_module(name, module)  # what the stack's weights are saved as (the U-net's skips: `unet`)
        self._register_load_state_dict_pre_hook(current_keys)
        self.post_init()

    def get_input_embeddings(self):
        return self.tokens

    def set_input_embeddings(self, value):
        self.tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, cache=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, keep=None, document_ids=None,
                past_key_values=None, **kwargs) -> BaseModelOutput:
        """input_ids, or inputs_embeds: (batch, seq, hidden) vectors in place of the token embeddings (the position
        table is still added). output_hidden_states: the embeddings' output and each block's, the last one after
        the final norm (= last_hidden_state); output_attentions: each attention block's probabilities, computed by
        the eager formula for that forward; return_dict=False: a tuple (all three default to the config's).
        cache (transformers' Cache; past_key_values, its older name): input_ids are then the tokens after the `past`
        cached ones, at positions past onwards, and attention_mask covers the cached ones too.
        keep: the (batch, k) positions the token-dropping layers update (token_dropping.DroppingStack); None: every
        layer sees every token.
        position_ids: (batch, seq) positions of input_ids' tokens, or None for past .. past + seq - 1 (padding
        counts). Generation passes them derived from the mask (context.position_ids_from_mask), so a left-padded
        prompt's tokens sit where they would alone: they pick the position table's rows, turn rotary and place
        stepped blocks. Distances (causality, windows, ALiBi, T5 buckets) count the tensor's indices, the same
        between real tokens when padding is only on the left or the right.
        document_ids: (batch, seq) non-decreasing ids of the documents packed in each row (data.document_masking):
        no token attends to another document's, and positions restart at each document (context.py).
        No branch reads a tensor's values, so the forward traces and exports with dynamic shapes (torch.export)."""
        cache = given_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give input_ids or inputs_embeds (one of them)")
        seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        past = 0 if cache is None else self.cache_length(cache, attention_mask, seq_len)
        if document_ids is not None:
            position_ids = self.document_position_ids(document_ids, position_ids, cache)
        where = token_positions(position_ids, attention_mask, past, seq_len)  # per-forward: every layer gets it
        x = self.embed(input_ids, past, where, inputs_embeds)
        ctx = self.context(x, attention_mask, where, document_ids, cache, output_hidden_states, output_attentions)
        at = self.layer_contexts(ctx, input_ids, cache, seq_len, past)
        x = self.final_norm(self.blocks(x, ctx, at, keep))
        return as_requested(self.outputs(x, ctx), return_dict, self.config)

    def blocks(self, x, ctx: Context, at, keep=None) -> torch.Tensor:
        """The blocks on the embedded tokens x: in turn, or as the stack chosen at build runs them
        (`stack(model, x, ctx, at, keep)`: a U-net, or token dropping given keep). at(i, base=ctx) is block i's
        context built on base (layer_contexts)."""
        if self.stack is not None:
            return self.stack(self, x, ctx, at, keep)
        return self.run_blocks(x, range(len(self.layers)), at)

    def run_blocks(self, x, layers: range, at) -> torch.Tensor:
        """The blocks `layers` in turn, on every token, each output recorded when hidden states were asked for."""
        for i in layers:
            ctx = at(i)
            x = ctx.record(self.layers[i](x, ctx))
        return x

    def context(self, x, attention_mask, where, documents, cache, output_hidden_states, output_attentions) -> Context:
        """What this forward tells every block (context.py): padding, positions, documents, and the lists that
        collect the hidden states (the embeddings' output first) and attentions asked for (else the config's)."""
        config = self.config
        hidden = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        attentions = output_attentions if output_attentions is not None else config.output_attentions
        return Context(padding=None if attention_mask is None else attention_mask.bool(), positions=where,
                       documents=documents, hidden_states=[x] if hidden else None,
                       attentions=[] if attentions else None,
                       shared=None if cache is None or torch.compiler.is_compiling() else {})  # keyed by ids: eager only

    def layer_contexts(self, ctx: Context, input_ids, cache, seq_len: int, past: int):
        """at(i, base=ctx): layer i's context, with its score bias (computed once per forward under arch.rpe.cache,
        else in every layer), its cache slot and its value embedding."""
        cached = self.score_bias is None or self.config.rpe.cache
        shared_bias = self.score_bias(seq_len, past) if self.score_bias is not None and cached else None
        values = self.value_embeddings(self.token_ids(input_ids)) if self.value_embeddings is not None else {}

        def at(i: int, base: Context = ctx) -> Context:
            bias = shared_bias if cached else self.score_bias(seq_len, past)
            return base._replace(bias=bias, value_embedding=values.get(i),
                                 cache=None if cache is None else LayerCache(cache, i, past))

        return at

    @staticmethod
    def outputs(x, ctx: Context) -> BaseModelOutput:
        """last_hidden_state, with the hidden states and attentions asked for; the last hidden state is the last
        block's output normalised, as transformers' models give it."""
        hidden = ctx.hidden_states
        if hidden is not None:
            hidden[-1] = x
        return BaseModelOutput(last_hidden_state=x, hidden_states=None if hidden is None else tuple(hidden),
                               attentions=None if ctx.attentions is None else tuple(ctx.attentions))

    @staticmethod
    def token_ids(input_ids):
        if input_ids is None:
            raise ValueError("arch.value_embeddings reads the token ids: pass input_ids, not inputs_embeds")
        return input_ids

    def embed(self, input_ids, past: int, where, inputs_embeds=None) -> torch.Tensor:
        """Token embeddings (or the given inputs_embeds) plus the position table's rows (where the scheme has one),
        normalised and projected."""
        x = self.tokens(input_ids) if inputs_embeds is None else inputs_embeds
        pos = self.positions(x.shape[1], past, None if where is None else where.ids)
        if pos is not None:
            x = x + pos.to(x.dtype)
        return self.embedding_project(self.dropout(self.embedding_norm(x)))

    @staticmethod
    def document_position_ids(document_ids, position_ids, cache):
        """The positions of a row of packed documents: restarting at each document, unless given."""
        if cache is not None:
            raise ValueError("document_ids are for training and scoring whole packed rows, not for generating with "
                             "a KV cache; generate each document on its own")
        return document_positions(document_ids) if position_ids is None else position_ids

    def cache_length(self, cache, attention_mask, seq_len: int) -> int:
        """How many tokens the cache holds, after checking that these blocks can use one (cache_problem)."""
        if (problem := cache_problem(self.config)) is not None:
            raise ValueError(problem)
        past = cache.get_seq_length()
        if attention_mask is not None and attention_mask.shape[1] != past + seq_len:
            raise ValueError(f"attention_mask has {attention_mask.shape[1]} columns for {past} cached and {seq_len} "
                             "new tokens: with a KV cache it covers the cached tokens and the new ones")
        return past


class CrammedForMaskedLM(CrammedPreTrainedModel):
    """Encoder + MLM decoder (tied to the token embeddings). `logits` are (batch, seq, vocab), as for any masked LM.

    The pretraining objective calls it with `pretraining=True`: then, with labels, only the masked positions
    (label != -100) go through the decoder and `logits` holds just those rows (arch.sparse_prediction: the vocabulary
    projection is most of an MLM step's compute at small widths, and 75 % of it is wasted on unmasked tokens
    otherwise), and arch.token_dropping drops tokens from the middle layers.
    """

    _tied_weights_keys = {"decoder.weight": "encoder.tokens.weight"}
    drops_tokens = True  # arch.token_dropping: its training forward chooses the tokens the middle layers see
    pipeline_tag = "fill-mask"
    # What a checkpoint pretrained with this head adds to config.json's auto_map (AUTO_MAP holds the ones every
    # model has): the Auto classes a checkpoint serves are those of its objective.
    extra_auto_map = {"AutoModelForMaskedLM": "modeling_crammed.CrammedForMaskedLM"}

    def __init__(self, config: CrammedConfig):
        if config.causal:  # an MLM head on it would be untrained (a process that loaded an MLM checkpoint maps ours)
            raise ValueError(f"this checkpoint was trained with objective {config.objective!r}, whose attention is "
                             "causal: it has no masked-LM head; load it with AutoModelForCausalLM")
        super().__init__(config)
        self.encoder = CrammedModel(config)
        # arch.token_dropping: the per-id running MLM loss that decides which tokens to drop (token_dropping.py)
        self.token_importance = None if self.encoder.stack is None else self.encoder.stack.importance(config)
        if config.head_transform:  # the original BERT head: dense -> act -> norm before the decoder
            self.transform = nn.Sequential(
                nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias),
                _Activation(config.activation),
                build_norm(config),
            )
            mark_hidden(self.transform)
        else:
            self.transform = nn.Identity()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.bias)
        self.post_init()

    def get_output_embeddings(self):
        return self.decoder

    def set_output_embeddings(self, value):
        self.decoder = value

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, document_ids=None,
                pretraining: bool = False, num_items_in_batch=None, **kwargs) -> MaskedLMOutput:
        """CrammedModel.forward's arguments; labels: the original ids at the masked positions, -100 elsewhere.
        pretraining: the objective's forward (the class docstring). document_ids: data.document_masking's."""
        dropping = pretraining and self.token_importance is not None and self.training and labels is not None
        keep = self.token_importance.choose(input_ids, attention_mask) if dropping else None
        out = self.encoder(input_ids, attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
                           output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                           return_dict=True, keep=keep, document_ids=document_ids)
        hidden, loss = out.last_hidden_state, None
        if labels is None:
            logits = head_logits(self.transform(hidden), self.decoder, self.config.logit_softcap,
                                 self.logit_multiplier)
        else:
            if pretraining and self.config.sparse_prediction:
                labels = labels.reshape(-1)
                selected = labels != -100
                hidden = hidden.reshape(-1, hidden.shape[-1])[selected]
                labels = labels[selected]
            loss_fn = LOSSES.get_or_explain(self.config.loss_impl)
            head = (self.transform(hidden), self.decoder, labels, self.training, self.config.logit_softcap,
                    self.logit_multiplier)
            if not dropping:
                loss, logits = loss_fn(*head)
            else:
                loss, logits, token_losses = loss_fn.per_token(*head)
                self.token_importance.update(labels, token_losses)
            loss = summed_over(loss, labels, num_items_in_batch)
        return as_requested(MaskedLMOutput(loss=loss, logits=logits, **encoder_outputs(out)), return_dict,
                            self.config)


class CrammedForCausalLM(CrammedPreTrainedModel, GenerationMixin):
    """Decoder + next-token head (tied to the token embeddings).

    `generate` keeps a KV cache (transformers' DynamicCache): the prompt runs once, then each step feeds only the
    new token, which attends to the cached keys and values at its absolute position (kv_cache.py); the tokens are
    those of the uncached path (`use_cache=False`), which recomputes the whole prefix at each step. Models whose
    blocks keep no keys and values (gMLP, cache_problem) always take the uncached path. A left-padded batch
    generates what each prompt would alone: positions count only the real tokens (prepare_inputs_for_generation).
    """

    _tied_weights_keys = {"decoder.weight": "encoder.tokens.weight"}
    pipeline_tag = "text-generation"
    extra_auto_map = {"AutoModelForCausalLM": "modeling_crammed.CrammedForCausalLM"}  # CrammedForMaskedLM's note

    def __init__(self, config: CrammedConfig):
        if not config.causal:
            raise ValueError(f"this checkpoint was trained with objective {config.objective!r}, whose attention is "
                             "bidirectional; load it with AutoModelForMaskedLM")
        super().__init__(config)
        self.encoder = CrammedModel(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.bias)
        self.post_init()
        if self.generation_config.eos_token_id is None:  # training closed each document with [SEP]: stop there
            self.generation_config.eos_token_id = config.sep_token_id

    def get_output_embeddings(self):
        return self.decoder

    def set_output_embeddings(self, value):
        self.decoder = value

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=None, logits_to_keep=0,
                                      **kwargs):
        """Only the tokens the cache has not seen, with the attention mask of all of them; every token when the
        cache is off or refused (whatever step generate is at, so a refused cache never truncates the input).
        A padded mask gives position_ids by transformers' rule (context.position_ids_from_mask), those of the
        tokens fed: a left-padded prompt generates what it would alone."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        position_ids = position_ids_from_mask(attention_mask) if padded else None
        inputs = {"attention_mask": attention_mask, "logits_to_keep": logits_to_keep}
        if use_cache is False or cache_problem(self.config) is not None:
            return {**inputs, "input_ids": input_ids, "position_ids": position_ids, "use_cache": False}
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        cache = cache if cache is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        return {**inputs, "input_ids": input_ids[:, past:], CACHE_KEY: cache, "use_cache": True,
                "position_ids": None if position_ids is None else position_ids[:, past:]}

    def cache_to_use(self, cache, use_cache):
        """The cache this forward fills: the given one, a new DynamicCache for use_cache=True, or None. Blocks that
        refuse a cache (cache_problem) get None for the empty one generate passes; a filled one is an error."""
        if use_cache is False or (cache is None and not use_cache):
            return None
        if (problem := cache_problem(self.config)) is not None:
            if cache is not None and cache.get_seq_length():
                raise ValueError(problem)
            return None
        return cache if cache is not None else DynamicCache(config=self.config)

    def forward(self, input_ids=None, attention_mask=None, labels=None, use_cache=None, logits_to_keep=0,
                position_ids=None, inputs_embeds=None, cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, document_ids=None, num_items_in_batch=None, past_key_values=None,
                **kwargs) -> CausalLMOutputWithPast:
        """With `use_cache=True` or a cache given (`cache`, or its older name past_key_values), the cache is filled
        and returned; input_ids are then the tokens after the cached ones. logits_to_keep: the last positions whose
        logits are computed (0: all); generate asks for 1, sparing the vocabulary projection of every other position,
        with or without a cache. labels: position t is scored against labels[t + 1], as transformers' causal LMs do;
        shift_labels (a keyword, through **kwargs as in transformers' causal LMs: the Trainer takes every forward
        argument named *label* for a label the batches must carry, and without it computes no eval_loss): the
        targets already aligned with the positions (labels is then not shifted, nor needed).
        The rest: CrammedModel.forward's."""
        shift_labels = kwargs.get("shift_labels")
        cache = self.cache_to_use(given_cache(cache, past_key_values), use_cache)
        out = self.encoder(input_ids, attention_mask, cache=cache, position_ids=position_ids,
                           inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                           output_hidden_states=output_hidden_states, return_dict=True, document_ids=document_ids)
        hidden, loss = out.last_hidden_state, None
        if labels is None and shift_labels is None:
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = head_logits(hidden[:, keep], self.decoder, self.config.logit_softcap, self.logit_multiplier)
        else:
            # Shift the targets, not the logits: a slice of the (batch, seq, vocab) logits is copied forward and
            # gets a zero-filled full-size gradient backward, a tenth of a small model's CPU step.
            targets = shift_labels if shift_labels is not None else F.pad(labels[:, 1:], (0, 1), value=-100)
            loss, logits = LOSSES.get_or_explain(self.config.loss_impl)(
                hidden, self.decoder, targets, self.training, self.config.logit_softcap, self.logit_multiplier)
            loss = summed_over(loss, targets, num_items_in_batch)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_KEY: cache}, **encoder_outputs(out))
        return as_requested(output, return_dict, self.config)


class _Activation(nn.Module):
    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.fn = ACTIVATIONS.get_or_explain(name)

    def forward(self, x):
        return self.fn(x)


# Saved checkpoints name these classes in config.json's auto_map (cramming.model.AUTO_MAP).
CrammedForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
CrammedForCausalLM.register_for_auto_class("AutoModelForCausalLM")


# Last, with every extension point defined: the variant files this folder holds register themselves there. A variant
# imports the extension points it extends, never this file (variants.py).
from .variants import __name__ as _variants  # noqa: E402, F401, I001
