"""GPTNeoXForCausalLM: pre-norm LayerNorm blocks run one after the other (use_parallel_residual=False), a plain
MLP, rotary on a share of each head (rotary.pct, NeoX's partial_rotary_factor). Its norms and MLP always have
biases (ours without: zeros, the same numbers); its LM head never has one. NeoX fuses q, k and v head by head
([q_h; k_h; v_h] for each head h), ours part by part ([q; k; v])."""

import torch
from transformers import GPTNeoXConfig

from .family import ACTIVATIONS, Family, or_zeros, per_layer, rules


def head_by_head(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Our (3 * hidden, ...) fused rows, part by part, in NeoX's order, head by head."""
    rest = tensor.shape[1:]
    return tensor.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


class GPTNeoX(Family):
    name, model_class, causal = "gpt-neox", "GPTNeoXForCausalLM", True
    model_type = "gpt_neox"
    presets = ("gpt-small", "gpt-tiny")  # conf/arch: the GPU-sized one, the CPU-sized one
    rules = rules(
        position="rotary", norm="layernorm", norm_position="pre", ffn="mlp", embedding_norm=False, final_norm=True,
        rotary__interleaved=False, rotary__every=1, head_transform=False,
        rotary__pct=(lambda value, config: int(config.hidden_size // config.num_heads * value) % 2 == 0,
                     "a share giving an even number of dims per head"),
        bias=(lambda value, config: not value, "False: NeoX's LM head has no bias"),
        attention__pattern=(lambda value, config: set(value) == {"global"}, "global attention only (['global'])"),
    )

    def config(self, config, special: dict) -> GPTNeoXConfig:
        return GPTNeoXConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_size,
            num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
            hidden_act=ACTIVATIONS[config.activation], max_position_embeddings=config.max_seq_length,
            layer_norm_eps=config.norm_eps, use_parallel_residual=False, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": config.rotary.base,
                             "partial_rotary_factor": config.rotary.pct},
            hidden_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
            tie_word_embeddings=config.tie_embeddings, initializer_range=config.init_std,
            pad_token_id=special["pad"], bos_token_id=special["bos"], eos_token_id=special["eos"])

    def tensors(self, state: dict, config) -> dict:
        width, heads = config.hidden_size, config.num_heads

        def layer(i, ours):
            theirs = f"gpt_neox.layers.{i}."
            out = {theirs + "attention.query_key_value.weight": head_by_head(state[ours + "attn.qkv.weight"], heads),
                   theirs + "attention.dense.weight": state[ours + "attn.out.weight"],
                   theirs + "mlp.dense_h_to_4h.weight": state[ours + "ffn.up.weight"],
                   theirs + "mlp.dense_h_to_4h.bias": or_zeros(state, ours + "ffn.up.bias", config.ffn_size),
                   theirs + "mlp.dense_4h_to_h.weight": state[ours + "ffn.down.weight"],
                   theirs + "mlp.dense_4h_to_h.bias": or_zeros(state, ours + "ffn.down.bias", width)}
            for norm, their_norm in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
                out[f"{theirs}{their_norm}.weight"] = state[f"{ours}{norm}.weight"]
                out[f"{theirs}{their_norm}.bias"] = or_zeros(state, f"{ours}{norm}.bias", width)
            return out

        return {"gpt_neox.embed_in.weight": state["encoder.tokens.weight"], **per_layer(config, layer),
                "gpt_neox.final_layer_norm.weight": state["encoder.final_norm.weight"],
                "gpt_neox.final_layer_norm.bias": or_zeros(state, "encoder.final_norm.bias", width),
                "lm_head.weight": state["decoder.weight"]}
