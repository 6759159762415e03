"""docs/options.md, generated from the schema: `python -m cramming.options_doc > docs/options.md`.

Each key's type and default come from its dataclass, what it accepts from the dataclass's RULES (cramming/rules.py)
or the registry that its name looks up (its dataclass's REGISTERED), and its one line of meaning from the comment beside
the field (a trailing `# ...`, else the comment lines right above it). Nothing here is written twice: `--help`
(cramming/cli.py) prints its key lines from the same functions, and tests/test_options_doc.py fails when
docs/options.md is stale.
"""

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import typing
from functools import cache

from omegaconf import OmegaConf

from .config import LATE_DEFAULTS, PretrainConfig
from .data.local_text import ENCODING_ERRORS
from .eval.config import EvalRunConfig
from .impl import COMPILE_MODES
from .plugins import import_plugins
from .registry import listed
from .rules import registry_keys
from .schema import CONF, defaults_node, group_options


@cache
def field_help(cls) -> dict[str, str]:
    """{field: the comment written beside it} for one dataclass, read with Python's tokenizer."""
    tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(inspect.getsource(cls))).readline)
    helps, above, name, depth = {}, [], None, 0
    previous = None
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.NAME and previous in (tokenize.INDENT, tokenize.NEWLINE, tokenize.DEDENT) \
                and tok.start[1] == 4 and name is None:
            name = tok.string
        elif tok.type == tokenize.COMMENT and tok.start[1] > 4 and name is not None and depth == 0:
            helps.setdefault(name, tok.string.lstrip("# ").strip())
        elif tok.type == tokenize.COMMENT and tok.start[1] == 4:
            above.append(tok.string.lstrip("# ").strip())
        elif tok.type == tokenize.NEWLINE:
            if name is not None and name not in helps and above:
                helps[name] = " ".join(above)
            name, above = None, [] if name is not None else above
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type
    return helps


def leaf_fields(cls, prefix: str = ""):
    """(dotted key, owning dataclass, field) for every option of a schema, sections expanded, in field order."""
    for f in dataclasses.fields(cls):
        section = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(section):
            yield from leaf_fields(section, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, cls, f


def type_name(annotation) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return text.replace("typing.", "").replace("NoneType", "None")


def value_text(value) -> str:
    """A default as it is typed on the command line (YAML/Hydra spelling)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def components() -> dict[str, tuple]:
    """{key: (registry, extra choices)} for every option that names entries of a registry: the ones the schema
    declares (REGISTERED, checked by the validation walk), and those checked where they are used (impl.py,
    data/local_text.py), and eval.tasks: every benchmark's task_table."""
    from .eval.kinds import BENCHMARKS  # heavy (every benchmark, scipy, peft): not for a help page's key lines
    from .validation import eval, pretrain  # noqa: F401  import every registry serving the schemas' options

    named = dict(registry_keys(PretrainConfig)) | dict(registry_keys(EvalRunConfig))
    return {**named, "impl.compile_mode": (COMPILE_MODES, ()),
            "data.encoding_errors": (ENCODING_ERRORS, ()),
            "eval.tasks": (benchmark_tasks(BENCHMARKS), ())}


def benchmark_tasks(benchmarks) -> dict[str, str]:
    """{task: the line saying which eval.kind runs it}, from each benchmark's task_table (None: names are free)."""
    kinds = {}
    for kind, benchmark in benchmarks.items():
        for task in benchmark.task_table or ():
            kinds.setdefault(task, []).append(kind)
    return {task: f"a task of eval={listed(sorted(names))}." for task, names in kinds.items()}


def accepts(key: str, cls, name: str, named: dict) -> str:
    """What a key accepts: its declared rule, or the registry's names (beyond them, e.g. auto)."""
    named = named.get(key)
    if named is not None:
        return ", ".join([*named[1], *sorted(named[0])]) + " (registry below)"  # sorted: not import order
    rule = getattr(cls, "RULES", {}).get(name)
    if isinstance(rule, tuple):
        return ", ".join("null" if choice is None else choice for choice in rule)
    return (rule or "").split(": ", 1)[0]  # the range; its why is for the error message


def meaning(key: str, cls, name: str) -> str:
    """The field's comment, after the component its section belongs to (arch.rotary.pct: `arch.position=rotary`)."""
    text = field_help(cls).get(name, "")
    belongs = getattr(cls, "COMPONENT", None)
    if belongs is None:
        return text
    field, names = belongs
    holder = key.rsplit(".", 2)[0] + "." if key.count(".") >= 2 else ""
    names = [names] if isinstance(names, str) else names
    return f"{holder}{field}={' or '.join(names)}: {text}"


def key_rows(schema, defaults: dict, named: dict, skip: tuple = ()):
    """(key, type, default, accepts, meaning) for every option of a schema; `named`: components()."""
    for key, cls, f in leaf_fields(schema):
        if key.startswith(skip):
            continue
        default = defaults
        for part in key.split("."):  # the plain node: an interpolation stays as written
            default = default[part]
        yield (key, type_name(typing.get_type_hints(cls).get(f.name, f.type)), value_text(default),
               accepts(key, cls, f.name, named), meaning(key, cls, f.name))


def entry_line(entry) -> str:
    """The first line of a registry entry's own docstring (one defined in cramming, not inherited); an entry given
    as text (eval.tasks: benchmark_tasks) is its own line."""
    if isinstance(entry, str):
        return entry
    owner = entry if inspect.isclass(entry) or callable(entry) and not hasattr(entry, "__dict__") else None
    owner = owner or (entry if inspect.isfunction(entry) or inspect.isclass(entry) else type(entry))
    doc = owner.__dict__.get("__doc__") if inspect.isclass(owner) else getattr(owner, "__doc__", None)
    if not doc or not getattr(owner, "__module__", "").startswith("cramming"):
        return ""
    paragraph = inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ")
    return re.split(r"\.\s+(?=[A-Z])", paragraph)[0].rstrip(".") + "."  # "et al. 2024" is no sentence end


def table(rows) -> list[str]:
    lines = ["| key | type | default | accepts | meaning |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append("| " + " | ".join(f"`{cell}`" if i in (0, 2) and cell else cell.replace("|", "\\|")
                                        for i, cell in enumerate(row)) + " |")
    return lines


def schema_defaults():
    """Both commands' schemas with their defaults as Hydra composes them (interpolations unresolved)."""
    return (PretrainConfig, defaults_node(PretrainConfig, LATE_DEFAULTS)), (EvalRunConfig, defaults_node(EvalRunConfig))


def pretrain_rows(named: dict):
    (schema, defaults), _ = schema_defaults()
    return list(key_rows(schema, defaults, named))


def eval_rows(named: dict):
    _, (schema, defaults) = schema_defaults()
    return list(key_rows(schema, defaults, named, skip=("impl.",)))


def registries() -> list[str]:
    lines = []
    for key, (registry, extra) in components().items():
        lines += ["", f"### `{key}`", ""]
        about = getattr(registry, "about", {})
        said = {name: about.get(name) or entry_line(registry[name]) for name in sorted(registry)}  # not import order
        lines += [f"- `{name}`: {line}" if line else f"- `{name}`" for name, line in said.items()]
        lines += [f"- `{name}`: chosen for the machine (see the key's meaning)" for name in extra]
    return lines


def presets() -> list[str]:
    """Each config group's presets and what they change, read from conf/."""
    lines = []
    for group in ("arch", "data", "train", "impl", "eval"):
        lines += ["", f"### `{group}=`", ""]
        for option in group_options(group):
            text = (CONF / group / f"{option}.yaml").read_text()
            about = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#")
                             and not line.startswith("# @package")).split(". ")[0].rstrip(".")
            node = OmegaConf.to_container(OmegaConf.create(text)) or {}
            parents = [d for d in node.pop("defaults", []) if d != "_self_"]
            changed = [f"`{k}={value_text(v)}`" for k, v in flat(node)]
            base = f"{group}={parents[0]} and " if parents else ""
            lines.append(f"- `{option}`: {about or 'see the file'}. Sets: {base}{', '.join(changed) or 'nothing'}")
    return lines


def flat(node: dict, prefix: str = ""):
    for k, v in node.items():
        yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(prefix + k, v)]


def render() -> str:
    lines = ["# Options", "", "Generated from the schema by `python -m cramming.options_doc > docs/options.md`; do not",
             "edit by hand. Defaults are the dataclasses' (cramming/config.py, cramming/model/arch.py,",
             "cramming/eval/config.py); a preset (`group=option`) changes only the keys listed under Presets.",
             "", "## pretrain.py", ""]
    named = components()
    lines += table(pretrain_rows(named))
    lines += ["", "## eval.py", "", "`impl.*` as for pretrain.py.", ""]
    lines += table(eval_rows(named))
    lines += ["", "## Registered names", "", "The options that name a component accept exactly these entries."]
    lines += registries()
    lines += ["", "## Presets"] + presets()
    return "\n".join(lines) + "\n"


def help_lines(command: str, *keys: str) -> str:
    """`${cramming_keys:pretrain,budget,...}` in a help template: those keys with their defaults, meanings and
    declared rules, from the schema (registries are left to docs/options.md: reading them imports torch)."""
    rows = {row[0]: row for row in (pretrain_rows({}) if command == "pretrain" else eval_rows({}))}
    out = []
    for key in keys:
        _, _, default, allowed, meaning = rows[key]
        out.append(f"  {f'{key}={default}'.ljust(30)} {meaning}" + (f" ({allowed})" if allowed else ""))
    return "\n".join(out).replace("$", "$$")  # Hydra fills the help template with string.Template


if __name__ == "__main__":
    import_plugins()  # $CRAMMING_PLUGINS' components are listed beside the package's (docs/extending.md)
    print(render(), end="")
