"""What checkpoints saved before a change hold, read as the model reads it now: tensor names of renamed modules, and
the causal flag configs did not yet carry.
Read by from_pretrained (transformers' key_mapping), by load_state_dict (a pre-hook: resume, a state dict) and by
train.init_from and train.averaging, so every old checkpoint still loads. Only the standard library: Hugging Face
copies this folder flat next to the weights."""

import re

# {old: new} patterns of transformers' key_mapping: a regex and a literal (reversed when a model loaded from old
# names is saved in its original format).
OLD_KEYS = {"rpe.": "score_bias."}  # issue 27: CrammedModel.rpe -> score_bias


def current_key(key: str) -> str:
    """The name a tensor saved as `key` has in the model now."""
    for old, new in OLD_KEYS.items():
        key = re.sub(rf"(^|\.){re.escape(old)}", rf"\g<1>{new}", key)
    return key


def current_keys(state_dict, prefix, *args) -> None:
    """load_state_dict's pre-hook: an old checkpoint's names renamed in place (resume, init_from, a state dict)."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = prefix + current_key(key[len(prefix):])
        if new != key:
            state_dict[new] = state_dict.pop(key)


# The sequence and multiple-choice heads' pooler and output layer, one `classifier` module since issue 36
# (modeling_crammed.ClassificationHead): regexes of transformers' key_mapping, anchored at the head's own names.
HEAD_KEYS = {r"^pooler\.": "classifier.dense.", r"^classifier\.(weight|bias)$": r"classifier.out_proj.\1"}


def current_head_keys(state_dict, prefix, *args) -> None:
    """load_state_dict's pre-hook of those heads: a state dict saved before issue 36 read under the new names."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = key[len(prefix):]
        for old, replacement in HEAD_KEYS.items():
            new = re.sub(old, replacement, new)
        if prefix + new != key:
            state_dict[prefix + new] = state_dict.pop(key)


# The objectives whose attention was causal when config.json did not yet say `causal` (issue 27): a config without
# the key reads as these did. New objectives declare the `causal` trait instead (cramming/train/objectives.py), and
# the configs built for them say so.
CAUSAL_BEFORE = ("clm",)


def causal_before(objective: str) -> bool:
    """Whether a config that does not say `causal` attends causally: what its objective meant before configs said."""
    return objective in CAUSAL_BEFORE
