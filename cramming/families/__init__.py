"""Transformers' own architectures a crammed checkpoint can be written as (`python -m cramming.export --as`), so
it loads with no remote code: Llama and GPT-NeoX for causal models, ModernBERT and BERT for masked LMs.

A family says which options of ours it can represent exactly (`rules`: the first one it cannot is the refusal),
the transformers config it builds, and where each of our tensors goes (`tensors`). Exactly means the in-library
model's logits equal ours within TOLERANCE in fp32 on a padded batch; the export checks that on every folder it
writes (export_families.py). A family is one file here plus its line in FAMILIES.
"""

from .bert import Bert
from .family import TOLERANCE, Family
from .gpt_neox import GPTNeoX
from .llama import Llama
from .modernbert import ModernBert

FAMILIES: dict[str, Family] = {family.name: family for family in (Llama(), GPTNeoX(), ModernBert(), Bert())}
__all__ = ["FAMILIES", "TOLERANCE", "Family"]
