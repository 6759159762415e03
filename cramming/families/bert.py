"""BertForMaskedLM: post-norm LayerNorm blocks, a plain MLP, a learned position table, biases, no final norm, and
the head transform (dense, activation, norm) before the decoder: the original BERT (arch=bert-base). Its norms,
projections and decoder always have biases (ours without: zeros, the same numbers). We have no segment
embeddings: BERT's token-type table is two rows of zeros, so token_type_ids change nothing."""

import torch
from transformers import BertConfig

from .family import ACTIVATIONS, Family, or_zeros, per_layer, rules, split_qkv


class Bert(Family):
    name, model_class, causal = "bert", "BertForMaskedLM", False
    model_type = "bert"
    presets = ("bert-base", "bert-tiny")  # conf/arch: the GPU-sized one, the CPU-sized one
    rules = rules(
        position="learned", norm="layernorm", norm_position="post", ffn="mlp", embedding_norm=True, final_norm=False,
        head_transform=True,
        attention__pattern=(lambda value, config: set(value) == {"global"}, "global attention only (['global'])"),
    )

    def config(self, config, special: dict) -> BertConfig:
        return BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_size,
            num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
            hidden_act=ACTIVATIONS[config.activation], max_position_embeddings=config.max_seq_length,
            type_vocab_size=2, layer_norm_eps=config.norm_eps, hidden_dropout_prob=config.hidden_dropout,
            attention_probs_dropout_prob=config.attention_dropout, classifier_dropout=config.classifier_dropout,
            tie_word_embeddings=config.tie_embeddings, initializer_range=config.init_std,
            pad_token_id=special["pad"])

    def tensors(self, state: dict, config) -> dict:
        width = config.hidden_size

        def pair(theirs, ours, size):
            return {f"{theirs}.weight": state[f"{ours}.weight"],
                    f"{theirs}.bias": or_zeros(state, f"{ours}.bias", size)}

        def layer(i, ours):
            theirs = f"bert.encoder.layer.{i}."
            weights = split_qkv(state[ours + "attn.qkv.weight"])
            biases = split_qkv(or_zeros(state, ours + "attn.qkv.bias", 3 * width))
            out = {f"{theirs}attention.self.{name}.{kind}": tensor
                   for name, w, b in zip(("query", "key", "value"), weights, biases)
                   for kind, tensor in (("weight", w), ("bias", b))}
            return {**out, **pair(theirs + "attention.output.dense", ours + "attn.out", width),
                    **pair(theirs + "attention.output.LayerNorm", ours + "norm1", width),
                    **pair(theirs + "intermediate.dense", ours + "ffn.up", config.ffn_size),
                    **pair(theirs + "output.dense", ours + "ffn.down", width),
                    **pair(theirs + "output.LayerNorm", ours + "norm2", width)}

        return {"bert.embeddings.word_embeddings.weight": state["encoder.tokens.weight"],
                "bert.embeddings.position_embeddings.weight": state["encoder.positions.embedding.weight"],
                "bert.embeddings.token_type_embeddings.weight": torch.zeros(2, width),
                **pair("bert.embeddings.LayerNorm", "encoder.embedding_norm", width), **per_layer(config, layer),
                **pair("cls.predictions.transform.dense", "transform.0", width),
                **pair("cls.predictions.transform.LayerNorm", "transform.2", width),
                "cls.predictions.decoder.weight": state["decoder.weight"],
                # one bias, which BERT holds twice (the decoder's is the head's)
                "cls.predictions.bias": or_zeros(state, "decoder.bias", config.vocab_size),
                "cls.predictions.decoder.bias": or_zeros(state, "decoder.bias", config.vocab_size)}
