"""Hugging Face `BertForMaskedLM` weights in this package's names, for train.init_from.

The layout they fit is arch=bert-base's: post-norm blocks, learned positions, biases, a GELU MLP, BERT's MLM head
transform, the decoder tied to the token embeddings. Our model has no token types: BERT adds token type 0's
embedding to every token of a single-segment input, so it is folded into the position table (a constant row added
to every position), which is exact for such inputs and leaves the token embeddings, and so the tied decoder, as
they are. Inputs with a second segment (type 1) are not representable; MLM pretraining has none.
"""

import torch

# Per layer: BERT's name under encoder.layer.<i>. -> ours under encoder.layers.<i>. (query, key and value are
# concatenated into our one qkv projection, in that order).
LAYER = {
    "attention.output.dense": "attn.out", "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.up", "output.dense": "ffn.down", "output.LayerNorm": "norm2",
}
TOP = {
    "bert.embeddings.word_embeddings.weight": "encoder.tokens.weight",
    "bert.embeddings.position_embeddings.weight": "encoder.positions.embedding.weight",
    "bert.embeddings.LayerNorm.weight": "encoder.embedding_norm.weight",
    "bert.embeddings.LayerNorm.bias": "encoder.embedding_norm.bias",
    "cls.predictions.transform.dense.weight": "transform.0.weight",
    "cls.predictions.transform.dense.bias": "transform.0.bias",
    "cls.predictions.transform.LayerNorm.weight": "transform.2.weight",
    "cls.predictions.transform.LayerNorm.bias": "transform.2.bias",
    "cls.predictions.bias": "decoder.bias",
}
# Tied to word_embeddings and cls.predictions.bias, or not part of the MLM model (BertForPreTraining's extras).
SKIPPED = ("cls.predictions.decoder.", "bert.embeddings.position_ids", "bert.embeddings.token_type_ids",
           "bert.pooler.", "cls.seq_relationship.")


def bert_layout(hf_config) -> dict:
    """The arch options BERT's layout fixes that no tensor shape shows, as this package names them."""
    return {"norm_position": "post", "position": "learned", "ffn": "mlp", "norm": "layernorm", "bias": True,
            "activation": hf_config.hidden_act, "norm_eps": hf_config.layer_norm_eps, "head_transform": True,
            "embedding_norm": True, "final_norm": False, "num_heads": hf_config.num_attention_heads,
            "tie_embeddings": bool(getattr(hf_config, "tie_word_embeddings", True)), "objective": "mlm",
            "qk_norm": False, "layout": ["attention"], "parametrization": "standard", "logit_softcap": None,
            "value_embeddings": 0, "unet_skips": False}


def bert_weights(state: dict) -> tuple[dict, dict]:
    """BERT's state dict -> (our name -> tensor, our name -> the BERT name it came from), in BERT's order."""
    weights, origin = {}, {}
    layers = {}
    for name, tensor in state.items():
        if name.startswith(SKIPPED) or name == "bert.embeddings.token_type_embeddings.weight":
            continue
        if name in TOP:
            ours = TOP[name]
        elif name.startswith("bert.encoder.layer."):
            index, rest = name.removeprefix("bert.encoder.layer.").split(".", 1)
            module, kind = rest.rsplit(".", 1)
            if module.startswith("attention.self."):  # query/key/value: joined once all three are seen
                layers.setdefault((index, kind), {})[module.removeprefix("attention.self.")] = tensor
                if len(layers[(index, kind)]) < 3:
                    continue
                parts = layers.pop((index, kind))
                ours = f"encoder.layers.{index}.attn.qkv.{kind}"
                weights[ours] = torch.cat([parts["query"], parts["key"], parts["value"]])
                origin[ours] = f"bert.encoder.layer.{index}.attention.self.query/key/value.{kind}"
                continue
            ours = f"encoder.layers.{index}.{LAYER.get(module, module)}.{kind}"
        else:
            ours = name  # no counterpart: reported as a tensor that does not fit
        weights[ours], origin[ours] = tensor, name
    types = state.get("bert.embeddings.token_type_embeddings.weight")
    position = TOP["bert.embeddings.position_embeddings.weight"]
    if types is not None and position in weights:
        weights[position] = weights[position] + types[0]
    return weights, origin
