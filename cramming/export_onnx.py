"""`python -m cramming.export --onnx <model folder> [<out.onnx>]`: a checkpoint as an ONNX graph, through torch.onnx's
dynamo exporter (torch.export underneath), with dynamic batch and sequence axes and the attention mask as an input,
then checked: onnxruntime's logits on a padded batch of other shapes than the export's example must be those of
PyTorch (within 1e-4), else nothing is left looking complete. Needs onnx and onnxscript (the `export` extra;
onnxruntime for the check)."""

import contextlib
import importlib.util
import io
import logging
import os
import re
import tempfile
import warnings
from pathlib import Path

import torch
import transformers

from . import model as crammed
from .checkpoints.model_folder import check_crammed_config, check_sizes, check_weights
from .errors import UserError
from .model_code import foreign_code
from .outputs import writing
from .untrusted import read_json_object, refuse_links_outside

TOLERANCE = 1e-4  # onnxruntime against PyTorch, on the real tokens of a padded batch
MORE_MEMORY = "export it on a machine with more memory"


def load_for_export(folder: Path, trust_remote_code: bool = False):
    """The folder's pretraining head (config.json's architectures), built from this cramming's own model classes, or
    with trust_remote_code from the code that came with it; a model that is not a crammed one is refused."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise UserError(f"{folder}: not a model folder (no config.json); give a run's checkpoint/ or an exported step")
    refuse_links_outside(folder, "the ONNX export")
    saved = read_json_object(config_path, what="config.json")
    if saved.get("model_type") != "crammed":
        raise UserError(f"{folder} holds a {saved.get('model_type')!r} model, not a crammed one; this exports "
                        "cramming's checkpoints (transformers' own models export with torch.onnx.export directly)")
    head = (saved.get("architectures") or ["CrammedForMaskedLM"])[0]
    if head not in crammed.CLASSES:
        raise UserError(f"{folder}: config.json names {head!r}, which is no class of cramming's "
                        f"({', '.join(crammed.CLASSES)})")
    transformers.logging.disable_progress_bar()  # the one-line contract holds for loading too
    tensors = check_weights(folder)
    if (name := foreign_code(folder)) is None:
        config = crammed.CrammedConfig.from_pretrained(folder)
        check_crammed_config(folder, config)
        check_sizes(folder, config, tensors, False, MORE_MEMORY)
        return getattr(crammed, head).from_pretrained(folder, config=config).eval()
    if not trust_remote_code:
        raise UserError(f"{folder / name} is not this cramming's own model code (an altered folder, or one written "
                        "by another version); export it with the code it came with, if you trust it: "
                        "--trust-remote-code")
    auto = {v.rsplit(".", 1)[1]: k for k, v in saved.get("auto_map", {}).items()}.get(head, "AutoModel")
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    check_sizes(folder, config, tensors, True, MORE_MEMORY)
    return getattr(transformers, auto).from_pretrained(folder, config=config, trust_remote_code=True).eval()


def example(config, batch: int, seq: int, padded_rows: int = 1, seed: int = 0) -> dict:
    """input_ids and an attention mask, the first `padded_rows` rows padded on the right to half their length."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (batch, seq), generator=generator)  # past the specials
    mask = torch.ones_like(ids)
    mask[:padded_rows, seq // 2:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, config.pad_token_id), "attention_mask": mask}


def export_onnx(folder: Path, out: Path | None = None, trust_remote_code: bool = False) -> tuple[Path, float | None]:
    """Write the ONNX graph (default <folder>/model.onnx) and return it with the check's largest difference (None
    without onnxruntime)."""
    folder = Path(folder)
    for package in ("onnx", "onnxscript"):
        if importlib.util.find_spec(package) is None:
            raise UserError(f"--onnx needs the {package} package: pip install 'cramming[export]'")
    default = folder / "model.onnx"  # the model folder's own graph: an earlier export's is replaced
    out = Path(out) if out is not None else default
    if (out.exists() or out.is_symlink()) and out.absolute() != default.absolute():
        raise UserError(f"{out} already exists; it was left as it is: give a new file name for the ONNX graph")
    model = load_for_export(folder, trust_remote_code)
    longest = model.config.max_seq_length
    seq = min(16, longest)
    inputs = example(model.config, 2, seq)
    axes = {"input_ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", max=longest)}}
    axes["attention_mask"] = axes["input_ids"]
    with writing(out.parent, out.name):
        tmp = Path(tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")[1])
    try:
        with quiet():  # the exporter's progress lines and, on failure, its graph dumps: the one line says it
            program = torch.onnx.export(model, (), kwargs=inputs, dynamo=True, dynamic_shapes=axes,
                                        input_names=list(inputs), output_names=["logits"], verbose=False)
            with writing(out.parent, out.name, made=[tmp]):
                program.save(str(tmp))
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001  the exporter fails in many types; each means the same here
        tmp.unlink(missing_ok=True)
        raise UserError(f"{folder}: torch.onnx could not export this model ({root_cause(err)})") from None
    difference = check_onnx(tmp, model, min(longest, seq + 4))
    if difference is not None and difference > TOLERANCE:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{folder}: the exported graph's logits differ from PyTorch's by {difference:.2e} (more than "
                        f"{TOLERANCE:g}) on a padded batch; not written")
    os.replace(tmp, out)
    return out.resolve(), difference


def root_cause(err: BaseException) -> str:
    """The innermost cause of an exporter's error, in one line: its type and first line, colour codes removed."""
    while err.__cause__ is not None:
        err = err.__cause__
    line = re.sub(r"\x1b\[[0-9;]*m", "", (str(err).strip().splitlines() or [""])[0])[:300]
    return f"{type(err).__name__}: {line}"


@contextlib.contextmanager
def quiet():
    """What torch.export and torch.onnx print (to stdout, stderr and torch's loggers) kept off the console."""
    loggers = [logging.getLogger(name) for name in ("torch", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR + 10)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def check_onnx(path: Path, model, seq: int) -> float | None:
    """The largest |onnxruntime - PyTorch| over the real tokens of a 3-row batch of another length than the
    export's example, two rows padded; None when onnxruntime is not installed."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime  # optional (the [onnx] extra): its absence was checked just above

    inputs = example(model.config, 3, seq, padded_rows=2, seed=1)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(["logits"], {k: v.numpy() for k, v in inputs.items()})[0])
    with torch.no_grad():
        want = model(**inputs).logits
    real = inputs["attention_mask"].bool()
    return (got - want).abs()[real].max().item()
