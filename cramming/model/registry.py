"""A name -> class table, so that every config option maps to exactly one implementation.

Lives in the model folder because Hugging Face's remote-code loader copies this folder flat:
the model files may only import each other relatively.
"""


class Registry(dict):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str):
        def add(obj):
            if name in self:
                raise KeyError(f"{self.kind} {name!r} registered twice")
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


def invalid(key: str, value, requirement: str) -> str:
    """The one-line message of a refused setting, worded as config.check words it (a `problem` returns this)."""
    return f"{key}={value!r} is invalid: {requirement}"
