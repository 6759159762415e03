"""LlamaForCausalLM: pre-norm RMSNorm blocks, a gated feed-forward (SwiGLU with silu), rotary on whole heads, no
biases. Our GLU's up projection is [gate; value] (ffn.GLU), Llama's gate_proj and up_proj."""

from transformers import LlamaConfig

from .family import ACTIVATIONS, Family, per_layer, rules, split_qkv


class Llama(Family):
    name, model_class, causal = "llama", "LlamaForCausalLM", True
    model_type = "llama"
    presets = ("llama-small", "llama-tiny")  # conf/arch: the GPU-sized one, the CPU-sized one
    rules = rules(
        position="rotary", norm="rmsnorm", norm_position="pre", ffn="glu", bias=False, embedding_norm=False,
        final_norm=True, rotary__pct=1.0, rotary__interleaved=False, rotary__every=1, head_transform=False,
        attention__pattern=(lambda value, config: set(value) == {"global"}, "global attention only (['global'])"),
    )

    def config(self, config, special: dict) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_size // 2,
            num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_heads, hidden_act=ACTIVATIONS[config.activation],
            max_position_embeddings=config.max_seq_length, rms_norm_eps=config.norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": config.rotary.base},
            attention_bias=False, mlp_bias=False, attention_dropout=config.attention_dropout,
            tie_word_embeddings=config.tie_embeddings, initializer_range=config.init_std,
            pad_token_id=special["pad"], bos_token_id=special["bos"], eos_token_id=special["eos"])

    def tensors(self, state: dict, config) -> dict:
        def layer(i, ours):
            q, k, v = split_qkv(state[ours + "attn.qkv.weight"])
            gate, up = state[ours + "ffn.up.weight"].chunk(2, dim=0)
            theirs = f"model.layers.{i}."
            return {theirs + "input_layernorm.weight": state[ours + "norm1.weight"],
                    theirs + "self_attn.q_proj.weight": q, theirs + "self_attn.k_proj.weight": k,
                    theirs + "self_attn.v_proj.weight": v,
                    theirs + "self_attn.o_proj.weight": state[ours + "attn.out.weight"],
                    theirs + "post_attention_layernorm.weight": state[ours + "norm2.weight"],
                    theirs + "mlp.gate_proj.weight": gate, theirs + "mlp.up_proj.weight": up,
                    theirs + "mlp.down_proj.weight": state[ours + "ffn.down.weight"]}

        return {"model.embed_tokens.weight": state["encoder.tokens.weight"], **per_layer(config, layer),
                "model.norm.weight": state["encoder.final_norm.weight"], "lm_head.weight": state["decoder.weight"]}
