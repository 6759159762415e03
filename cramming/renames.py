"""Options that moved into their component's section (arch.rotary.pct, train.ema.decay, ...): the one table of
old key -> new key. An old key on the command line, in eval_overrides or in a composed config stops with one line
naming the new one; a run config saved before the move (a checkpoint's config.json, compared when resuming) is
read with the keys moved. Checkpoints' model configs map the old flat arch names themselves
(model/configuration_crammed.py: `rotary_pct` is section `rotary`, field `pct`)."""

import copy
import re

RENAMED = {
    "arch.rotary_pct": "arch.rotary.pct", "arch.rotary_base": "arch.rotary.base",
    "arch.rotary_interleaved": "arch.rotary.interleaved", "arch.rotary_every": "arch.rotary.every",
    "arch.rpe_buckets": "arch.rpe.buckets", "arch.rpe_max_distance": "arch.rpe.max_distance",
    "arch.rpe_cache": "arch.rpe.cache", "arch.gmlp_attn_dim": "arch.gmlp.attn_dim",
    "arch.mup_base_width": "arch.mup.base_width",
    "train.optim.momentum": "train.optim.sgd.momentum", "train.optim.muon_lr": "train.optim.muon.lr",
    "train.optim.muon_momentum": "train.optim.muon.momentum",
    "train.ema_decay": "train.ema.decay", "train.lawa_k": "train.lawa.k",
    "train.lawa_every_fraction": "train.lawa.every_fraction", "train.max_skipped": "train.skip.max_in_row",
    "train.rollback_lr_factor": "train.rollback.lr_factor",
}
OVERRIDE = re.compile(r"^[+~]*(?P<key>[\w.]+)(?:=(?P<value>.*))?$")


def renamed_line(key: str, value: str | None = None) -> str | None:
    """The one line for an old key (None for any other): it names the new key, with the value given."""
    new = RENAMED.get(key)
    if new is None:
        return None
    return f"{key} was renamed: use {new}={'<value>' if value is None else value}"


def renamed_override(overrides: list[str]) -> str | None:
    """The line for the first override (key=value, +key=, ~key) that names an old key, else None."""
    for override in overrides:
        match = OVERRIDE.match(override)
        if match and (line := renamed_line(match["key"], match["value"])):
            return line
    return None


def moved(saved: dict) -> dict:
    """A run config saved before the move (nested dicts), with each old key moved to its new place."""
    out = copy.deepcopy(saved)
    for old, new in RENAMED.items():
        *parents, name = old.split(".")
        holder = out
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or name not in holder:
            continue
        value = holder.pop(name)
        *new_parents, new_name = new.split(".")
        target = out
        for part in new_parents:
            target = target.setdefault(part, {})
        target.setdefault(new_name, value)
    return out
