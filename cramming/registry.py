"""A name -> entry table, so that every config option maps to exactly one implementation, and the helpers that word
what an entry refuses.

Every component's registry is one of these. The model files reach it through model/registry.py, which re-exports
it: Hugging Face copies the model folder flat for `trust_remote_code`, where relative imports within the folder are
all the code may have. A saved model folder therefore holds this file itself as its registry.py (`copy_into`, run
by every save), so a checkpoint loads in a Python without cramming. This file imports only the standard library.

Traits. What other components ask an entry (does this block take a KV cache? does this optimizer read whole
matrices?) is a trait its registry declares, `Registry(kind, traits={"kv_cache": "its forward takes a cache"})`,
and asks, `BLOCKS.trait("attention", "kv_cache")`. Traits are opt-in: an entry has one when it says so, as a
class attribute (`kv_cache = True`) or at registration (`register(name, kv_cache=True)`, for functions), and reads
False otherwise. A trait name the registry does not declare raises KeyError at once, when registering and when
reading, so a mistyped trait cannot read as false; so does an entry with a yes/no class attribute its registry
does not declare (`kv_cahce = True`: a trait misspelt, or one the registry should declare). Messages that list who
has a trait ask `having(trait)`.
"""

import dataclasses
import shutil
from pathlib import Path

# The modules whose classes' attributes are not the entry's word (an nn.Module's `dump_patches`, say).
FOREIGN = ("builtins", "torch", "transformers", "abc", "typing", "functools")


def own_problem(entry, config) -> str | None:
    """What a registered entry refuses in a run config: its `problem(config)`, or None when it has none."""
    problem = getattr(entry, "problem", None)
    return problem(config) if problem is not None else None


class Registry(dict):
    serving = {}  # (schema dataclass, field) -> the registry whose names that option takes (serves)

    def __init__(self, kind: str, ask=own_problem, traits: dict[str, str] | None = None):
        """ask(entry, run_config) -> str | None: how config validation asks a chosen entry what it refuses (None:
        it is not asked there; cramming/rules.py). traits: {name: what an entry having it means}, the only
        traits its entries may carry or be asked (all opt-in: False unless the entry says so)."""
        super().__init__()
        self.kind = kind
        self.ask = ask
        self.traits = dict(traits or {})
        self.about = {}  # name -> its one line for docs/options.md, where the entry has no docstring of its own

    def serves(self, schema, field: str) -> None:
        """Declare that the option `field` of the dataclass `schema` names entries of this registry: the config
        walk checks its values against them and asks the chosen entries (rules.py), and docs/options.md lists them.
        The schema marks the field in its REGISTERED; a field it does not mark raises KeyError here."""
        if field not in getattr(schema, "REGISTERED", {}):
            raise KeyError(f"{schema.__name__}.{field} is not in {schema.__name__}.REGISTERED: the schema does not "
                           f"say it names a {self.kind}")
        Registry.serving[(schema, field)] = self

    def declared(self, trait: str) -> str:
        """The trait's name, if this registry declares it; else KeyError naming the registry and its traits."""
        if trait not in self.traits:
            have = ", ".join(sorted(self.traits)) or "none"
            raise KeyError(f"the {self.kind} registry declares no trait {trait!r} (its traits: {have})")
        return trait

    def register(self, name: str, problem=None, about: str | None = None, **traits):
        """The one way entries are added (register_one goes through it). problem(run_config) -> str | None: what
        the entry refuses, for entries (functions) that cannot carry a `problem` of their own; about: the entry's
        one line for docs/options.md, for entries without a docstring of their own (torch's functions, instances
        of one class); traits: declared traits the entry has, set as its attributes (a function cannot declare
        class attributes). An undeclared trait raises here, before anything is added."""
        for trait in traits:
            self.declared(trait)

        def add(obj):
            if name in self:
                raise KeyError(f"{self.kind} {name!r} registered twice")
            if stray := self.undeclared(obj):
                raise KeyError(f"{self.kind} {name!r} sets {', '.join(stray)}, which the {self.kind} registry does "
                               f"not declare as traits (its traits: {', '.join(sorted(self.traits)) or 'none'})")
            if problem is not None:
                obj.problem = problem
            for key, value in traits.items():
                setattr(obj, key, value)
            if about is not None:
                self.about[name] = about
            self[name] = obj
            return obj

        return add

    def register_one(self, name: str, about: str | None = None, **traits):
        """Register one instance of the decorated class: for options whose objects carry the behaviour."""
        register = self.register(name, about=about, **traits)  # traits are checked here, before the class exists

        def add(cls):
            register(cls())
            return cls

        return add

    def undeclared(self, obj) -> list[str]:
        """The entry's yes/no attributes (its own classes' and its instance's, dataclass fields aside: those are
        data) that this registry does not declare as traits."""
        owner = obj if isinstance(obj, type) else type(obj)
        fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
        spaces = [vars(c) for c in owner.__mro__ if c.__module__.split(".")[0] not in FOREIGN]
        if not isinstance(obj, type):
            spaces.append(getattr(obj, "__dict__", {}))
        found = {key for space in spaces for key, value in space.items() if isinstance(value, bool)}
        return sorted(key for key in found - fields - set(self.traits) if not key.startswith("_"))

    def trait(self, entry, trait: str):
        """What `entry` (a registered object, or its name) has for a declared `trait`: its attribute of that name
        (a class attribute counts), False when it has none; an unknown name has no traits (validation names it)."""
        self.declared(trait)
        if isinstance(entry, str):
            entry = self.get(entry)
        return getattr(entry, trait, False)

    def get_or_explain(self, name: str):
        """Look a name up; an unknown one raises ValueError listing the valid choices."""
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self))}")
        return self[name]

    def having(self, trait: str) -> list[str]:
        """The sorted names of the entries that have the declared `trait`: for messages that list who would do."""
        return sorted(name for name, entry in self.items() if self.trait(entry, trait))

    def lacking(self, trait: str) -> list[str]:
        """The sorted names of the entries without the declared `trait`."""
        return sorted(name for name, entry in self.items() if not self.trait(entry, trait))

    def choices(self, trait: str, has: bool = True) -> str:
        """having(trait) (or lacking it, has=False) as words for a message: "a, b or c"."""
        return listed(self.having(trait) if has else self.lacking(trait))


def listed(names, conjunction: str = "or") -> str:
    """Names as words for a message: "a", "a or b", "a, b or c"."""
    names = list(names)
    return f" {conjunction} ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def invalid(key: str, value, requirement: str) -> str:
    """The one-line message of a refused setting, worded as config.check words it (a `problem` returns this)."""
    return f"{key}={value!r} is invalid: {requirement}"


def copy_into(folder) -> None:
    """Write this file as `folder`/registry.py, over the package's re-export: the saved model code then stands alone.
    Run after every save_pretrained of a crammed model or config. In a model
    loaded from a checkpoint, this file is that checkpoint's own copy, so saving it again writes the same code."""
    shutil.copyfile(__file__, Path(folder) / "registry.py")
