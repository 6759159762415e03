"""What each option accepts, declared beside its field and read here by one walk over the schema (config.validate,
eval's validate_eval):

- RULES: a plain option's range ("> 0", "[0, 1)", ">= 1 or null", "each [0, 1)" for a tuple, optionally followed
  by ": why") or a tuple of choices. The requirement the user reads is the declaration itself ("must be in [0, 1)").
- REGISTERED: the options that name registered components, {field: choices beyond the registry's, as ("auto",)},
  in the order they are asked. The registry says which option it serves, beside its entries
  (`FFNS.serves(ArchConfig, "ffn")`), so the schema imports nothing. The name must be registered, and the chosen
  entry is asked what it refuses (the registry's `ask`, cramming/registry.py).
- COMPONENT = (field, names): a section that belongs to one component (arch.rotary: ("position", "rotary")), named
  by a field of the dataclass holding the section; its rules are checked only when one of `names` is chosen.
"""

import dataclasses
import operator
import re

from .registry import Registry, invalid

SPEC = re.compile(r"(?P<each>each )?(?:(?P<op>>=|>) (?P<x>\S+)|(?P<lo>[\[(])(?P<a>\S+), (?P<b>\S+?)(?P<hi>[\])]))"
                  r"(?P<null> or null)?(?:: (?P<why>.+))?")
COMPARE = {">": operator.gt, ">=": operator.ge, "[": operator.ge, "(": operator.gt,
           "]": operator.le, ")": operator.lt}


def rule_problem(key: str, value, rule) -> str | None:
    """None when `value` obeys `rule`, else the one-line refusal naming key, value and requirement."""
    if isinstance(rule, tuple):  # choices (None among them: null too); a list option names one per element
        bad = [v for v in (value if isinstance(value, list) else [value]) if v not in rule]
        named = sorted(choice for choice in rule if choice is not None)
        return f"{key}={bad[0]!r} is not a valid option; choose one of: {', '.join(named)}" if bad else None
    spec = SPEC.fullmatch(rule)
    if spec is None:
        raise ValueError(f"{key}: unreadable rule {rule!r}")
    if value is None and spec["null"]:
        return None
    values = value if spec["each"] else [value]
    if value is not None and all(within(v, spec) for v in values):
        return None
    core = rule.split(": ", 1)[0].removeprefix("each ")
    requirement = f"must be {core}" if spec["op"] else f"must be in {core}"
    requirement = f"each {requirement}" if spec["each"] else requirement
    return invalid(key, value, f"{requirement}: {spec['why']}" if spec["why"] else requirement)


def within(value, spec) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if spec["op"]:
        return COMPARE[spec["op"]](value, float(spec["x"]))
    return COMPARE[spec["lo"]](value, float(spec["a"])) and COMPARE[spec["hi"]](value, float(spec["b"]))


def sections(config, prefix: str = ""):
    """(dotted prefix, dataclass) for `config` and every section inside it whose component is chosen, in field
    order; a section whose COMPONENT names a component that is not chosen is left out with all inside it."""
    yield prefix, config
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and in_use(config, value):
            yield from sections(value, f"{prefix}{field.name}.")


def in_use(holder, section) -> bool:
    """Whether `section` (a field of `holder`) is read in this config: always, unless it declares the component
    it belongs to (COMPONENT = (holder's field, name or names)) and the holder chose another."""
    belongs = getattr(type(section), "COMPONENT", None)
    if belongs is None:
        return True
    field, names = belongs
    value = getattr(holder, field)
    names = {names} if isinstance(names, str) else set(names)
    return bool(names & set(value if isinstance(value, list) else [value]))


def declared_rules(config, prefix: str = ""):
    """(key, value, rule) for every rule the schema declares in the sections in use, in field order."""
    for where, section in sections(config, prefix):
        rules = getattr(type(section), "RULES", {})
        for field in dataclasses.fields(section):
            if field.name in rules:
                yield f"{where}{field.name}", getattr(section, field.name), rules[field.name]


def declared_registries(config, prefix: str = "", leave_out=()):
    """(key, value, registry, extra choices) for every option that names registered components, in the order
    each dataclass's REGISTERED lists them (its own before its sections'); keys in `leave_out` are not walked."""
    for where, section in sections(config, prefix):
        for name, extra in getattr(type(section), "REGISTERED", {}).items():
            if f"{where}{name}" not in leave_out:
                yield f"{where}{name}", getattr(section, name), served(type(section), name), tuple(extra)


def registry_keys(cls, prefix: str = ""):
    """(key, (registry, extra choices)) for every option of a schema class that names registered components,
    sections included whether chosen or not (docs/options.md lists them all)."""
    for name, extra in getattr(cls, "REGISTERED", {}).items():
        yield f"{prefix}{name}", (served(cls, name), tuple(extra))
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(field.default_factory):
            yield from registry_keys(field.default_factory, f"{prefix}{field.name}.")


def served(schema, field: str) -> Registry:
    """The registry that declared it serves `schema.field` (Registry.serves). Its module must have been imported:
    the validation layer imports every one (validation/pretrain.py, eval.py); a missing one is an error, never an
    option silently left unchecked."""
    registry = Registry.serving.get((schema, field))
    if registry is None:
        raise LookupError(f"{schema.__name__}.{field} names registered components, but no imported registry serves "
                          "it: import the module that calls serves() for it")
    return registry


def registry_problem(key: str, value, registry, extra: tuple, config) -> str | None:
    """The option names entries of `registry` (one, or a list cycled over the layers): each must exist, and each
    chosen entry is asked what it refuses in the whole `config` (the registry's `ask`)."""
    names = value if isinstance(value, list) else [value]
    if not names:
        return f"{key}={value!r} is invalid: name at least one {key.rsplit('.', 1)[-1]}"
    for name in names:
        if name not in registry and name not in extra:
            return f"{key}={name!r} is not a valid option; choose one of: {', '.join(sorted([*extra, *registry]))}"
    if registry.ask is None:
        return None
    return next((p for name in dict.fromkeys(names) if name in registry and (p := registry.ask(registry[name], config))),
                None)


def schema_problems(config, prefix: str = ""):
    """Every declared rule, then every registry-valued option, lazily: the first problem is what the user reads."""
    for key, value, rule in declared_rules(config, prefix):
        yield rule_problem(key, value, rule)
    for key, value, registry, extra in declared_registries(config, prefix):
        yield registry_problem(key, value, registry, extra, config)
