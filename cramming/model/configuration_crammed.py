"""The Hugging Face config of a crammed model: every architecture knob the model reads."""

from transformers import PretrainedConfig


class CrammedConfig(PretrainedConfig):
    model_type = "crammed"
    # Names generic Hugging Face code (pipelines, Trainer, PEFT) looks for.
    attribute_map = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads"}

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden_size: int = 768,
        num_layers: int = 16,
        num_heads: int = 12,
        ffn_size: int = 3072,
        ffn: str = "glu",
        activation: str = "gelu",
        norm: str = "layernorm",
        norm_eps: float = 1e-12,
        norm_position: str = "pre",
        qk_norm: bool = False,
        embedding_norm: bool = True,
        final_norm: bool = True,
        bias: bool = False,
        position: str = "scaled-sinusoidal",
        rotary_pct: float = 1.0,
        rotary_base: float = 10000.0,
        rotary_interleaved: bool = False,
        rotary_every: int = 1,
        rpe_buckets: int = 32,
        rpe_max_distance: int = 128,
        rpe_cache: bool = True,
        layout: list | str = "attention",
        gmlp_attn_dim: int = 0,
        attention_pattern: list | str = "global",
        attention_window: int = 64,
        attention_topk: int = 16,
        linear: str = "dense",
        linear_on: tuple = ("ffn", "attention"),
        linear_args: dict | None = None,
        max_seq_length: int = 128,
        tie_embeddings: bool = True,
        objective: str = "mlm",
        head_transform: bool = False,
        sparse_prediction: bool = True,
        init: str = "normal",
        init_std: float = 0.02,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        classifier_dropout: float = 0.1,
        attention_impl: str = "sdpa",
        rotary_impl: str = "torch",
        loss_impl: str = "plain",
        pad_token_id: int = 0,
        cls_token_id: int = 2,
        sep_token_id: int = 3,
        mask_token_id: int = 4,
        logit_softcap: float | None = None,
        zero_init_out: bool = False,
        value_embeddings: int = 0,
        unet_skips: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.ffn_size = ffn_size
        self.ffn = ffn
        self.activation = activation
        self.norm = norm
        self.norm_eps = norm_eps
        self.norm_position = norm_position
        self.qk_norm = qk_norm
        self.embedding_norm = embedding_norm
        self.final_norm = final_norm
        self.bias = bias
        self.position = position
        self.rotary_pct = rotary_pct
        self.rotary_base = rotary_base
        self.rotary_interleaved = rotary_interleaved
        self.rotary_every = rotary_every  # rotary in every k-th attention block
        self.rpe_buckets = rpe_buckets
        self.rpe_max_distance = rpe_max_distance
        self.rpe_cache = rpe_cache
        self.layout = [layout] if isinstance(layout, str) else list(layout)  # block kinds, cycled over the layers
        self.gmlp_attn_dim = gmlp_attn_dim
        # one pattern per layer, cycled: ["local", "global"] alternates
        self.attention_pattern = [attention_pattern] if isinstance(attention_pattern, str) else list(attention_pattern)
        self.attention_window = attention_window
        self.attention_topk = attention_topk
        self.linear = linear  # the structured layer used for the projections of the parts in linear_on
        self.linear_on = list(linear_on)
        self.linear_args = {k: v for k, v in (linear_args or {}).items() if v is not None}
        self.max_seq_length = max_seq_length
        self.tie_embeddings = tie_embeddings
        self.objective = objective
        self.head_transform = head_transform
        self.sparse_prediction = sparse_prediction
        self.init = init
        self.init_std = init_std
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.classifier_dropout = classifier_dropout
        self.attention_impl = attention_impl  # kernels are a runtime choice: checkpoints are saved with sdpa/torch
        self.rotary_impl = rotary_impl
        self.loss_impl = loss_impl  # fused | plain: how training computes the head's loss (model/fused_loss.py)
        self.cls_token_id = cls_token_id
        self.mask_token_id = mask_token_id
        self.logit_softcap = logit_softcap  # c * tanh(logits / c) on the LM head's logits; None = off (softcap.py)
        self.zero_init_out = zero_init_out  # residual branches' output projections start at zero (inits.py)
        self.value_embeddings = value_embeddings  # tables mixed into the first and last layers' values
        self.unet_skips = unet_skips  # first half's outputs added to the mirrored second half's inputs (unet.py)
        kwargs.pop("tie_word_embeddings", None)  # derived from tie_embeddings; present when loading a saved config
        super().__init__(
            pad_token_id=pad_token_id,
            sep_token_id=sep_token_id,
            tie_word_embeddings=tie_embeddings,
            **kwargs,
        )

    @property
    def causal(self) -> bool:
        """Attention sees only the past: the objective predicts the next token (`objective: clm`)."""
        return self.objective == "clm"
