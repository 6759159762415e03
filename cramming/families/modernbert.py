"""ModernBertForMaskedLM: pre-norm LayerNorm blocks whose first has no attention norm (the embedding norm precedes
it: arch.first_attention_norm=false), a GLU feed-forward, rotary on whole heads, global and local (sliding-window)
layers, and BERT's head transform (dense, activation, norm) before the decoder. Its local_attention is the whole
window, 2 x our arch.attention.window (keys within window on each side); both rotary bases are our one base."""

from transformers import ModernBertConfig

from .family import ACTIVATIONS, Family, per_layer, rules

LAYER_TYPES = {"global": "full_attention", "local": "sliding_attention"}


class ModernBert(Family):
    name, model_class, causal = "modernbert", "ModernBertForMaskedLM", False
    model_type = "modernbert"
    presets = ("modernbert", "modernbert-tiny")  # conf/arch: the GPU-sized one, the CPU-sized one
    rules = rules(
        position="rotary", norm="layernorm", norm_position="pre", ffn="glu", embedding_norm=True, final_norm=True,
        first_attention_norm=False, rotary__pct=1.0, rotary__interleaved=False, rotary__every=1,
        head_transform=True,
        attention__pattern=(lambda value, config: set(value) <= set(LAYER_TYPES), "global and local layers only"),
    )

    def config(self, config, special: dict) -> ModernBertConfig:
        pattern = config.attention.pattern
        bias = config.bias
        return ModernBertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_size // 2,
            num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
            hidden_activation=ACTIVATIONS[config.activation], classifier_activation=ACTIVATIONS[config.activation],
            max_position_embeddings=config.max_seq_length, norm_eps=config.norm_eps, norm_bias=bias,
            attention_bias=bias, mlp_bias=bias, classifier_bias=bias, decoder_bias=bias,
            layer_types=[LAYER_TYPES[pattern[i % len(pattern)]] for i in range(config.num_layers)],
            local_attention=2 * config.attention.window,
            rope_parameters={kind: {"rope_type": "default", "rope_theta": config.rotary.base}
                             for kind in LAYER_TYPES.values()},
            embedding_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
            classifier_dropout=config.classifier_dropout, tie_word_embeddings=config.tie_embeddings,
            initializer_range=config.init_std, pad_token_id=special["pad"], bos_token_id=special["cls"],
            eos_token_id=special["sep"], cls_token_id=special["cls"], sep_token_id=special["sep"])

    def tensors(self, state: dict, config) -> dict:
        def norm(theirs, ours):
            return {f"{theirs}.{key}": state[f"{ours}.{key}"] for key in ("weight", "bias") if f"{ours}.{key}" in state}

        def linear(theirs, ours):
            return norm(theirs, ours)  # weight, and bias where we have one: the family has the same flags

        def layer(i, ours):
            theirs = f"model.layers.{i}."
            return {**(norm(theirs + "attn_norm", ours + "norm1") if i else {}),
                    **linear(theirs + "attn.Wqkv", ours + "attn.qkv"), **linear(theirs + "attn.Wo", ours + "attn.out"),
                    **norm(theirs + "mlp_norm", ours + "norm2"), **linear(theirs + "mlp.Wi", ours + "ffn.up"),
                    **linear(theirs + "mlp.Wo", ours + "ffn.down")}

        return {"model.embeddings.tok_embeddings.weight": state["encoder.tokens.weight"],
                **norm("model.embeddings.norm", "encoder.embedding_norm"), **per_layer(config, layer),
                **norm("model.final_norm", "encoder.final_norm"), **linear("head.dense", "transform.0"),
                **norm("head.norm", "transform.2"), **linear("decoder", "decoder")}
