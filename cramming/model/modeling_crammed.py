"""The crammed encoder and its heads, as Hugging Face models.

Read top to bottom: embeddings -> blocks -> final norm (CrammedModel), then the MLM head
(CrammedForMaskedLM), the next-token head of causal models (CrammedForCausalLM, `objective: clm`, whose
attention is causal), and the pooled classifier used by GLUE (CrammedForSequenceClassification). The token,
question-answering and multiple-choice heads are in heads.py.
Only relative imports: Hugging Face copies this folder flat for `trust_remote_code=True`.
"""

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (BaseModelOutput, CausalLMOutputWithPast, MaskedLMOutput,
                                           SequenceClassifierOutput)

from .block import BLOCKS, cache_problem
from .configuration_crammed import CrammedConfig
from .context import Context, document_positions
from .ffn import ACTIVATIONS
from .inits import init_std
from .kv_cache import CACHE_KEY, LayerCache, position_ids_from_mask, token_positions
from .losses import LOSSES, head_logits
from .norms import build_norm
from .parametrization import mark_hidden, parametrization
from .positions import POSITIONS
from .registry import copy_into
from .renamed import OLD_KEYS, current_keys
from .stacks import build_stack
from .token_dropping import TokenImportance, dropping_layers
from .unet import UNetSkips
from .value_embeddings import ValueEmbeddings

# save_pretrained(push_to_hub=True, ...)'s keywords that only the push reads.
HUB_KEYWORDS = ("repo_id", "commit_message", "create_pr", "private", "revision", "commit_description", "tags")


class CrammedPreTrainedModel(PreTrainedModel):
    config_class = CrammedConfig
    base_model_prefix = "encoder"
    _supports_sdpa = True
    drops_tokens = False  # a head whose training forward drops tokens (arch.token_dropping) says so
    pipeline_tag = None  # the hub's task for a model pretrained with this head (its model card says it)

    @property
    def logit_multiplier(self) -> float:
        """What the LM head multiplies its input by: W (h * this) + b (1 / m under mup, else 1)."""
        return parametrization(self.config).output_multiplier(self.config)

    @classmethod
    def from_pretrained(cls, *args, key_mapping: dict | None = None, **kwargs):
        """Hugging Face's loader, reading checkpoints saved before a rename too (OLD_KEYS)."""
        return super().from_pretrained(*args, key_mapping={**OLD_KEYS, **(key_mapping or {})}, **kwargs)

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """Hugging Face's save, then the registry's own code over the package's re-export of it (registry.py), so
        the folder loads without cramming. A push goes through push_to_hub, which saves through here again."""
        hub = {key: kwargs.pop(key) for key in HUB_KEYWORDS if key in kwargs}
        super().save_pretrained(save_directory, *args, **kwargs)
        copy_into(save_directory)
        if push_to_hub:
            repo_id = hub.pop("repo_id", Path(save_directory).name)  # Hugging Face's default: the folder's name
            return self.push_to_hub(repo_id, token=kwargs.get("token"), **hub)
        return None

    def init_std_for(self, module) -> float:
        """The std arch.init (and arch.zero_init_out) gives this module's weights (inits.py)."""
        return init_std(self.config, module)

    @torch.no_grad()
    def _init_weights(self, module):
        # transformers.initialization skips tensors already loaded from a checkpoint.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=self.init_std_for(module))
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif hasattr(module, "init_weights_"):  # every module of ours with weights of its own initialises them
            module.init_weights_(init, self.init_std_for(module))


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
        mark_hidden(self.layers)  # arch.parametrization scales their init (inits.py) and lr (train/optim.py)
        # A score bias shared by all layers (T5's relative-position bias), computed once per forward (arch.rpe.cache)
        # or again in every layer. Checkpoints saved before it had this name hold it as `rpe` (OLD_KEYS).
        self.score_bias = positions.score_bias(config)
        self.final_norm = build_norm(config) if config.final_norm else nn.Identity()
        self.value_embeddings = ValueEmbeddings(config) if config.value_embeddings else None
        self.unet = UNetSkips(config) if config.unet_skips else None
        self.stack = build_stack(config)  # how the blocks run: in turn, as a U-net, or dropping tokens (stacks.py)
        self._register_load_state_dict_pre_hook(current_keys)
        self.post_init()

    def get_input_embeddings(self):
        return self.tokens

    def set_input_embeddings(self, value):
        self.tokens = value

    def forward(self, input_ids, attention_mask=None, return_dict=None, cache=None, keep=None, position_ids=None,
                document_ids=None, **unused) -> BaseModelOutput:
        """cache: a transformers Cache when generating with one (CrammedForCausalLM): input_ids are then the tokens
        after the `past` cached ones, at positions past onwards, and attention_mask covers the cached ones too.
        keep: the (batch, k) positions the token-dropping layers update (stacks.DroppingStack); None: every layer sees
        every token.
        position_ids: (batch, seq) positions of input_ids' tokens, or None for past .. past + seq - 1 (padding
        counts). Generation passes them derived from the mask (kv_cache.position_ids_from_mask), so a left-padded
        prompt's tokens sit where they would alone: they pick the position table's rows, turn rotary and place
        stepped blocks. Distances (causality, windows, ALiBi, T5 buckets) count the tensor's indices, the same
        between real tokens when padding is only on the left or the right.
        document_ids: (batch, seq) non-decreasing ids of the documents packed in each row (data.document_masking):
        no token attends to another document's, and positions restart at each document (context.py)."""
        seq_len = input_ids.shape[1]
        past = 0 if cache is None else self.cache_length(cache, attention_mask, seq_len)
        if document_ids is not None:
            position_ids = self.document_position_ids(document_ids, position_ids, cache)
        where = token_positions(position_ids, attention_mask, past, seq_len)  # per-forward: every layer gets it
        x = self.embed(input_ids, past, where)
        # A mask of all ones is the same as no mask; skipping it keeps the fused attention paths.
        padding = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        ctx = Context(padding=padding, positions=where, documents=document_ids)
        shared_bias = (self.score_bias(seq_len, past) if self.score_bias is not None and self.config.rpe.cache
                       else None)
        values = self.value_embeddings(input_ids) if self.value_embeddings is not None else {}

        def at(i: int, base: Context = ctx) -> Context:
            """Layer i's context: its score bias, cache slot and value embedding."""
            bias = shared_bias if self.score_bias is None or self.config.rpe.cache else self.score_bias(seq_len, past)
            return base._replace(bias=bias, value_embedding=values.get(i),
                                 cache=None if cache is None else LayerCache(cache, i, past))

        x = self.stack(self, x, ctx, at, keep)  # chosen at build: plain, U-net or token dropping
        return BaseModelOutput(last_hidden_state=self.final_norm(x))

    def embed(self, input_ids, past: int, where) -> torch.Tensor:
        """Token embeddings plus the position table's rows (where the scheme has one), normalised and projected."""
        x = self.tokens(input_ids)
        pos = self.positions(input_ids.shape[1], past, None if where is None else where.ids)
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
        """How many tokens the cache holds, after checking that these blocks can use one (block.cache_problem)."""
        if (problem := cache_problem(self.config)) is not None:
            raise ValueError(problem)
        past = cache.get_seq_length()
        if attention_mask is not None and attention_mask.shape[1] != past + seq_len:
            raise ValueError(f"attention_mask has {attention_mask.shape[1]} columns for {past} cached and {seq_len} "
                             "new tokens: with a KV cache it covers the cached tokens and the new ones")
        return past


class CrammedForMaskedLM(CrammedPreTrainedModel):
    """Encoder + MLM decoder (tied to the token embeddings).

    With `sparse_prediction` and labels given, only masked positions (label != -100) go through the
    decoder, and `logits` holds just those rows: the vocabulary projection is most of an MLM step's
    compute at small widths, and 75 % of it is wasted on unmasked tokens otherwise.
    """

    _tied_weights_keys = {"decoder.weight": "encoder.tokens.weight"}
    drops_tokens = True  # arch.token_dropping: its training forward chooses the tokens the middle layers see
    pipeline_tag = "fill-mask"

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.encoder = CrammedModel(config)
        # arch.token_dropping: the per-id running MLM loss that decides which tokens to drop (token_dropping.py)
        self.token_importance = TokenImportance(config) if dropping_layers(config) is not None else None
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

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, document_ids=None,
                **unused) -> MaskedLMOutput:
        """With arch.token_dropping, a training forward with labels drops tokens from the middle layers and moves
        the importance averages by its per-token losses; every other forward sees the whole sequence.
        document_ids: CrammedModel's (data.document_masking)."""
        dropping = self.token_importance is not None and self.training and labels is not None
        keep = self.token_importance.choose(input_ids, attention_mask) if dropping else None
        hidden = self.encoder(input_ids, attention_mask, keep=keep, document_ids=document_ids).last_hidden_state
        if labels is None:
            return MaskedLMOutput(logits=head_logits(self.transform(hidden), self.decoder, self.config.logit_softcap,
                                                     self.logit_multiplier))
        if self.config.sparse_prediction:
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
        return MaskedLMOutput(loss=loss, logits=logits)


class CrammedForCausalLM(CrammedPreTrainedModel, GenerationMixin):
    """Decoder + next-token head (tied to the token embeddings).

    `generate` keeps a KV cache (transformers' DynamicCache): the prompt runs once, then each step feeds only the
    new token, which attends to the cached keys and values at its absolute position (kv_cache.py); the tokens are
    those of the uncached path (`use_cache=False`), which recomputes the whole prefix at each step. Models whose
    blocks keep no keys and values (gMLP, block.cache_problem) always take the uncached path. A left-padded batch
    generates what each prompt would alone: positions count only the real tokens (prepare_inputs_for_generation).
    """

    _tied_weights_keys = {"decoder.weight": "encoder.tokens.weight"}
    pipeline_tag = "text-generation"

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
        A padded mask gives position_ids by transformers' rule (kv_cache.position_ids_from_mask), those of the
        tokens fed: a left-padded prompt generates what it would alone."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        position_ids = position_ids_from_mask(attention_mask) if padded else None
        inputs = {"attention_mask": attention_mask, "logits_to_keep": logits_to_keep}
        if use_cache is False or cache_problem(self.config) is not None:
            return {**inputs, "input_ids": input_ids, "position_ids": position_ids, "use_cache": False}
        cache = kwargs.get(CACHE_KEY)
        cache = cache if cache is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        return {**inputs, "input_ids": input_ids[:, past:], CACHE_KEY: cache, "use_cache": True,
                "position_ids": None if position_ids is None else position_ids[:, past:]}

    def cache_to_use(self, cache, use_cache):
        """The cache this forward fills: the given one, a new DynamicCache for use_cache=True, or None. Blocks that
        refuse a cache (block.cache_problem) get None for the empty one generate passes; a filled one is an error."""
        if use_cache is False or (cache is None and not use_cache):
            return None
        if (problem := cache_problem(self.config)) is not None:
            if cache is not None and cache.get_seq_length():
                raise ValueError(problem)
            return None
        return cache if cache is not None else DynamicCache(config=self.config)

    def forward(self, input_ids, attention_mask=None, labels=None, use_cache=None, logits_to_keep=0,
                position_ids=None, return_dict=None, document_ids=None, **kwargs) -> CausalLMOutputWithPast:
        """With `use_cache=True` or a cache given (under the name transformers uses, kv_cache.CACHE_KEY), the
        cache is filled and returned; input_ids are then the tokens after the cached ones. logits_to_keep: the
        last positions whose logits are computed (0: all); generate asks for 1, sparing the vocabulary projection
        of every other position, with or without a cache. position_ids, document_ids: CrammedModel.forward's."""
        cache = self.cache_to_use(kwargs.get(CACHE_KEY), use_cache)
        hidden = self.encoder(input_ids, attention_mask, cache=cache, position_ids=position_ids,
                              document_ids=document_ids).last_hidden_state
        if labels is None:
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = head_logits(hidden[:, keep], self.decoder, self.config.logit_softcap, self.logit_multiplier)
            return CausalLMOutputWithPast(logits=logits, **{CACHE_KEY: cache})
        # Position t predicts token t + 1; the last position predicts nothing (-100). Shift the targets, not the
        # logits: a slice of the (batch, seq, vocab) logits is copied forward and gets a zero-filled full-size
        # gradient backward, a tenth of a small model's CPU step.
        targets = F.pad(labels[:, 1:], (0, 1), value=-100)
        loss, logits = LOSSES.get_or_explain(self.config.loss_impl)(hidden, self.decoder, targets, self.training,
                                                                     self.config.logit_softcap, self.logit_multiplier)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_KEY: cache})


def pooled_token(hidden, attention_mask, causal: bool):
    """The one position a sequence-level head reads: the first ([CLS]) of a bidirectional model; of a causal model
    the last real one (padding on the right), the only token that saw the whole sequence."""
    if not causal:
        return hidden[:, 0]
    if attention_mask is None:
        last = torch.full((hidden.shape[0],), hidden.shape[1] - 1, device=hidden.device)
    else:
        last = attention_mask.sum(1) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class CrammedForSequenceClassification(CrammedPreTrainedModel):
    """Encoder + pooler (dense + tanh) + classifier; one label means regression (STS-B). The pooled token is the
    first ([CLS]) for bidirectional models and the last real one for causal models, the only one that saw all."""

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.encoder = CrammedModel(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **unused):
        hidden = self.encoder(input_ids, attention_mask).last_hidden_state
        pooled = torch.tanh(self.pooler(pooled_token(hidden, attention_mask, self.config.causal)))
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


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
