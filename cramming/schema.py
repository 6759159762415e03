"""The dataclasses as Hydra's base, and where conf/ lies. conf/pretrain.yaml and conf/eval.yaml compose onto their command's schema
node first, so every key and every default comes from the dataclasses and a preset in conf/ lists only what
differs from them (an empty preset such as arch=crammed-bert is the defaults themselves)."""

from importlib import resources
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

CONF = Path(str(resources.files("cramming.conf")))  # conf/ in a checkout; the installed package's copy otherwise


def group_options(group: str) -> list[str]:
    """The options of a config group, read from conf/ (Hydra's own source of them)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def defaults_node(cls, late: dict | None = None) -> dict:
    """The dataclass's defaults as plain values. Hydra then knows every key (an unknown one is refused while
    composing, as before) but checks no type, so a wrongly typed value still reaches load_config's one-line
    error. `late`: {dotted key: interpolation} for defaults read when the config is composed, not at import."""
    node = OmegaConf.structured(cls)
    for key, value in (late or {}).items():
        OmegaConf.update(node, key, value)
    return OmegaConf.to_container(node)


def register(name: str, cls, late: dict | None = None) -> None:
    """Store the schema node that a command's primary config names first in its defaults list."""
    ConfigStore.instance().store(name=name, node=defaults_node(cls, late))
