"""Changing the attention window of a built model (train.window_schedule, the speedrun's window warm-up): every
local or stepped attention block re-reads its pattern's arguments from the config, and the config keeps the new
window, so a checkpoint saved afterwards loads with the window the model last trained with."""

from .attention import SelfAttention


def set_attention_window(model, window: int) -> None:
    """model: a crammed model (the module itself, not a compiled or engine wrapper)."""
    config = model.config
    if config.attention.window == window:
        return
    config.attention.window = window
    for module in model.modules():
        if isinstance(module, SelfAttention):
            module.pattern_args = module.pattern.kernel_args(config)
