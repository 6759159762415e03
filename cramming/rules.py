"""The accepted values of a plain option, declared beside its field (a dataclass's RULES) and checked by
config.validate: a range like "> 0", "[0, 1)" or ">= 1 or null", "each [0, 1)" for a tuple, or a tuple of
choices. The requirement the user reads is the declaration itself ("must be in [0, 1)")."""

import dataclasses
import operator
import re

from .model.registry import invalid

SPEC = re.compile(r"(?P<each>each )?(?:(?P<op>>=|>) (?P<x>\S+)|(?P<lo>[\[(])(?P<a>\S+), (?P<b>\S+?)(?P<hi>[\])]))"
                  r"(?P<null> or null)?")
COMPARE = {">": operator.gt, ">=": operator.ge, "[": operator.ge, "(": operator.gt,
           "]": operator.le, ")": operator.lt}


def rule_problem(key: str, value, rule) -> str | None:
    """None when `value` obeys `rule`, else the one-line refusal naming key, value and requirement."""
    if isinstance(rule, tuple):  # choices; a list option names one choice per element
        bad = [v for v in (value if isinstance(value, list) else [value]) if v not in rule]
        return f"{key}={bad[0]!r} is not a valid option; choose one of: {', '.join(sorted(rule))}" if bad else None
    spec = SPEC.fullmatch(rule)
    if spec is None:
        raise ValueError(f"{key}: unreadable rule {rule!r}")
    if value is None and spec["null"]:
        return None
    values = value if spec["each"] else [value]
    if value is not None and all(within(v, spec) for v in values):
        return None
    core = rule.removeprefix("each ")
    requirement = f"must be {core}" if spec["op"] else f"must be in {core}"
    return invalid(key, value, f"each {requirement}" if spec["each"] else requirement)


def within(value, spec) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if spec["op"]:
        return COMPARE[spec["op"]](value, float(spec["x"]))
    return COMPARE[spec["lo"]](value, float(spec["a"])) and COMPARE[spec["hi"]](value, float(spec["b"]))


def declared_rules(config, prefix: str = ""):
    """(key, value, rule) for every rule a dataclass declares, sections included, in field order."""
    rules = getattr(type(config), "RULES", {})
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            yield from declared_rules(value, f"{prefix}{field.name}.")
        elif field.name in rules:
            yield f"{prefix}{field.name}", value, rules[field.name]
