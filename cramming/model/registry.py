"""A name -> class table, so that every config option maps to exactly one implementation.

Lives in the model folder because Hugging Face's remote-code loader copies this folder flat:
the model files may only import each other relatively.
"""


def own_problem(entry, config) -> str | None:
    """What a registered entry refuses in a run config: its `problem(config)`, or None when it has none."""
    problem = getattr(entry, "problem", None)
    return problem(config) if problem is not None else None


class Registry(dict):
    def __init__(self, kind: str, ask=own_problem):
        """ask(entry, run_config) -> str | None: how config validation asks a chosen entry what it refuses (None:
        it is not asked there; cramming/rules.py)."""
        super().__init__()
        self.kind = kind
        self.ask = ask

    def register(self, name: str, problem=None, **traits):
        """problem(run_config) -> str | None: what the entry refuses, for entries (functions) that cannot carry a
        `problem` of their own; traits: attributes the entry carries for the code that asks (a function cannot
        declare class attributes)."""
        def add(obj):
            if name in self:
                raise KeyError(f"{self.kind} {name!r} registered twice")
            if problem is not None:
                obj.problem = problem
            for key, value in traits.items():
                setattr(obj, key, value)
            self[name] = obj
            return obj

        return add

    def register_one(self, name: str):
        """Register one instance of the decorated class: for options whose objects carry the behaviour."""
        def add(cls):
            self.register(name)(cls())
            return cls

        return add

    def get_or_explain(self, name: str):
        """Look a name up; an unknown one raises ValueError listing the valid choices."""
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self))}")
        return self[name]

    def having(self, trait: str) -> list[str]:
        """The sorted names of the entries whose `trait` attribute is true (missing counts as false)."""
        return sorted(name for name, entry in self.items() if getattr(entry, trait, False))


def invalid(key: str, value, requirement: str) -> str:
    """The one-line message of a refused setting, worded as config.check words it (a `problem` returns this)."""
    return f"{key}={value!r} is invalid: {requirement}"
