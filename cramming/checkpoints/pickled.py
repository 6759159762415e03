"""Reading a torch pickle someone else may have written (a step folder's state.pt and rng-<rank>.pt, a model
folder's pytorch_model.bin): tensors and plain data only, every tensor within the bytes its file stores."""

import pickle
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..untrusted import check_memory, size_text

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # NumPy 1
    from numpy.core.multiarray import _reconstruct


# NumPy's arrays, which step folders written before the RNG state was kept as tensors hold; under both of the
# names NumPy 1 and 2 pickle them with. Their contents load through the same restricted unpickler.
NUMPY_ARRAYS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), *((_reconstruct, f"{module}.multiarray._reconstruct")
                                       for module in ("numpy.core", "numpy._core"))]


def _allowed_name(entry) -> str:
    return entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"


def refuse_unsafe(path: Path) -> None:
    """One line, before anything else is done with it, when `path` would need more than weights_only allows:
    read from its pickle's names, nothing unpickled."""
    allowed = {_allowed_name(entry) for entry in NUMPY_ARRAYS}
    asks = [name for name in torch.serialization.get_unsafe_globals_in_checkpoint(path) if name not in allowed]
    if asks:
        raise UserError(f"{path} holds more than tensors and plain data (it asks for {', '.join(asks[:3])}), which "
                        "a step folder written by cramming never does; it was not loaded, as unpickling it could run "
                        "code: use a step folder you wrote, or the run's checkpoint/ folder")


def load_saved(path: Path) -> dict:
    """A step folder's state.pt or rng-<rank>.pt: tensors and plain data only (torch.load's weights_only), so a
    file from someone else cannot run code when it is read; every tensor within the bytes the file stores (a view
    that repeats a few bytes into gigabytes is refused before anything copies it). Anything else is one line
    naming the file."""
    path = Path(path)
    check_memory(path.stat().st_size, f"{path} ({size_text(path.stat().st_size)})", "resume it on a larger machine")
    refuse_unsafe(path)
    with torch.serialization.safe_globals(NUMPY_ARRAYS):
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:  # what the names did not show
            raise UserError(f"{path} could not be loaded with weights_only ({(str(err).splitlines() or [''])[0][:200]}); "
                            "use a step folder you wrote, or the run's checkpoint/ folder") from None
    if (found := strided_view(saved)) is not None:
        where, numel, stored = found
        raise UserError(f"{path}: {where} is a view of {numel:,} elements over {stored:,} stored bytes, which "
                        "cramming's saves never write; it was not used")
    return saved


def strided_view(saved, where: str = "state") -> tuple[str, int, int] | None:
    """(where, elements, stored bytes) of the first tensor of a loaded file whose elements do not fit in the bytes
    its storage holds (a zero-stride or overlapping view: small on disk, huge once anything copies it), or None.
    Walked with a stack of its own: a file may nest its containers deeper than Python's recursion allows."""
    todo = [(where, saved)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, torch.Tensor):
            stored = value.untyped_storage().nbytes()
            needed = (value.storage_offset() + value.numel()) * value.element_size()
            repeats = any(step == 0 for step, size in zip(value.stride(), value.shape, strict=True) if size > 1)
            if value.numel() and (needed > stored or repeats):
                return where, value.numel(), stored
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) \
            else ()
        todo += reversed([(f"{where}[{key!r}]" if len(where) < 200 else where, item) for key, item in items])
    return None
