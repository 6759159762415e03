"""Every benchmark `eval.kind` can name and every fine-tuning head, registered in one place: importing BENCHMARKS from
here (validation, the recipe, docs/options.md) sees them all. A new benchmark is a module that registers itself,
named in the line below (or in $CRAMMING_PLUGINS)."""

from . import candidates_head, harness, ner, span_head, squad, swag_race, zero_shot  # noqa: F401  each registers itself
from .benchmarks import BENCHMARKS

__all__ = ["BENCHMARKS"]
