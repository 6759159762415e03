"""The model files' door to the shared registry (cramming/registry.py).

Hugging Face copies this folder flat for `trust_remote_code`, and the model files import one another only
relatively, so they import the registry from here. A saved folder holds cramming/registry.py itself in this file's
place (`copy_into`): a checkpoint never needs the cramming package to load.
"""

from cramming.registry import FOREIGN, Registry, copy_into, invalid, listed, own_problem  # noqa: F401
