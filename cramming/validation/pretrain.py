"""A pretraining config, loaded and checked before any work: Hydra's composition against the schema (unknown keys,
wrong types), then one walk over it (cramming/rules.py: each option's declared rule, each chosen component and
what it refuses), then the checks that span sections or components (across.py). The first problem stops the run
in one line."""

import importlib.util

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config import PretrainConfig
from ..data import sources  # noqa: F401  serves data.source
from ..engines import ENGINES  # noqa: F401  serves impl.distributed
from ..errors import UserError, refuse
from ..impl import COMPILE_MODES  # noqa: F401  serves impl.attention, impl.rotary and impl.loss
from ..plugins import import_plugins
from ..registry import invalid
from ..renames import renamed_line
from ..rules import schema_problems
from ..run_folder import name_problem
from ..train import averaging, objectives, optim, schedule  # noqa: F401  serve train.* and arch.objective
from . import across

# The imports marked "serves": each option in PretrainConfig's REGISTERED is served by the registry that says so
# where it is defined (Registry.serves), and the walk finds it once its module is imported (rules.served refuses an
# option nobody serves). across.py imports the rest.


def check_no_missing(cfg) -> None:
    """`key=???` leaves a value missing, and a merge onto the schema would quietly keep the default instead."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"{missing[0]}=??? leaves the value missing; give {missing[0]}=<value> or drop the override")


def load_config(cfg: DictConfig) -> PretrainConfig:
    """Hydra's composed config -> a validated PretrainConfig, or a UserError naming the bad key."""
    import_plugins()  # components of your own ($CRAMMING_PLUGINS), registered before the names are checked
    check_no_missing(cfg)
    try:
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PretrainConfig), cfg))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        first_line = str(err).splitlines()[0]
        if line := renamed_line(key):
            raise UserError(line) from None
        raise UserError(f"config {key}: {first_line}" if key else f"config: {first_line}") from None
    validate(config)
    return config


def validate(c: PretrainConfig) -> None:
    """The schema's walk, skipping the sections of components not chosen, then the checks that span sections."""
    for problem in schema_problems(c):
        refuse(problem)
    for problem in across_sections(c):
        refuse(problem)


def across_sections(c: PretrainConfig):
    """The checks that read more than one option or the machine, lazily: the first one that fails stops."""
    a, t = c.arch, c.train
    yield None if c.name.strip() else invalid("name", c.name, "name the run (its folder is outputs/<name>/<date>)")
    yield name_problem(c.name)  # a relative path inside outputs/ (run_folder.py checks it before the folder is made)
    yield None if a.hidden_size % a.num_heads == 0 else invalid(
        "arch.num_heads", a.num_heads, f"must divide arch.hidden_size={a.hidden_size}")
    for key, extra in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        wanted = getattr(t, key) not in (False, "off")
        if wanted and importlib.util.find_spec(extra) is None:
            yield invalid(f"train.{key}", getattr(t, key), f"needs the {extra} package: pip install 'cramming[{extra}]'")
    if t.wandb != "off" and not t.wandb_project:
        yield invalid("train.wandb_project", t.wandb_project, "must not be empty")
    if t.target_loss is not None and not t.validate_every_minutes:
        yield invalid("train.target_loss", t.target_loss, "is checked at the periodic validations: also set "
                      "train.validate_every_minutes (e.g. train.validate_every_minutes=1)")
    for check in across.CHECKS:
        yield check(c)
