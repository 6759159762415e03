"""The variant files a model folder holds: importing one registers its entries at its extension point
(docs/extending.md). modeling_crammed.py imports this file last, so a variant imports the extension points it
extends (blocks.py, linear.py, positions.py, ...), never modeling_crammed.py.

This installation's copy imports every variant. A saved checkpoint's copy imports only the files its config names
(pretrained.py writes it), and the checkpoint ships only those. The file holds nothing but relative imports, so
model_code.py trusts a checkpoint's copy when every file it imports is ours.
"""

from .gmlp import GMLPBlock  # noqa: F401
from .mup import Mup  # noqa: F401
from .relative_bias import T5RelativeBias  # noqa: F401
from .rotary import Rotary  # noqa: F401
from .sparse_patterns import Local  # noqa: F401
from .structured_linear import LowRank  # noqa: F401
from .token_dropping import DroppingStack  # noqa: F401
from .unet import UNetStack  # noqa: F401
