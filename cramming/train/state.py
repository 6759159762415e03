"""Everything a run needs to continue exactly where it stopped, besides the model and optimizer tensors."""

import pickle
import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..untrusted import check_memory, size_text

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # NumPy 1
    from numpy.core.multiarray import _reconstruct


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    sequences: int = 0  # consumed from the training stream: the data position
    elapsed: float = 0.0  # budget seconds spent in the training loop, over all resumes
    compile_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    skipped: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    skipped_in_row: int = 0
    rollbacks: int = 0
    lr_scale: float = 1.0  # lowered by each rollback
    last_loss: float = float("nan")
    untrained: dict = field(default_factory=dict)  # validation metrics before the first step
    energy_joules: float | None = 0.0  # measured by the launches up to this state, all ranks; None = not measurable

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_saved(cls, saved, path: Path) -> "TrainState":
        """The state a step folder's state.pt holds: a key this cramming does not know (a newer one wrote it) or a
        value of the wrong kind is one line naming the file, never a traceback."""
        known = {f.name: f for f in fields(cls)}
        if not isinstance(saved, dict):
            raise UserError(f"{path}: its trainer state is a {type(saved).__name__}, not a table; not a step folder "
                            "cramming wrote")
        unknown = sorted(set(saved) - set(known))
        if unknown:
            raise UserError(f"{path}: its trainer state has keys this cramming does not know ({', '.join(map(str, unknown[:3]))}); "
                            "a newer cramming wrote it: resume it with that version")
        numbers = {name for name, f in known.items() if f.type in (int, float, "int", "float")}
        bad = [k for k in numbers & set(saved) if not isinstance(saved[k], int | float) or isinstance(saved[k], bool)]
        if bad:
            raise UserError(f"{path}: its trainer state's {bad[0]} is {type(saved[bad[0]]).__name__}, not a number; "
                            "not a step folder cramming wrote")
        return cls(**saved)


def capture_rng() -> dict:
    """Every random stream a step may draw from: Python, NumPy, torch (CPU and CUDA). Masks need none: they are
    seeded by their position in the data stream (masking.PositionalMasks). NumPy's key is kept as a tensor, so
    the file loads with weights_only=True."""
    kind, key, position, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(key.astype(np.int64)), position, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def rng_problem(saved) -> str | None:
    """What makes a saved random state one capture_rng did not write (None when it is one): its parts, and each
    array of the size this Python, NumPy and torch use, so that restoring it allocates nothing beyond that."""
    if not isinstance(saved, dict) or not {"python", "numpy", "torch"} <= set(saved):
        return "it is not a table of the python, numpy and torch random states"
    python, numpy, cpu = saved["python"], saved["numpy"], saved["torch"]
    if not (isinstance(python, tuple | list) and len(python) == 3 and len(python[1]) == len(random.getstate()[1])):
        return "its Python random state is not one Python's random module keeps"
    if not (isinstance(numpy, tuple | list) and len(numpy) == 5 and len(numpy[1]) == 624):
        return "its NumPy random state is not NumPy's (a key of 624 numbers)"
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.shape == torch.get_rng_state().shape):
        return "its torch random state is not torch's CPU generator state"
    return None


def restore_rng(saved: dict) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in saved["python"]))
    kind, key, *rest = saved["numpy"]
    np.random.set_state((kind, np.asarray(key).astype(np.uint32), *rest))  # a tensor, or an array (written before)
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


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
