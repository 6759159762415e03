"""An export of ours to one of transformers' own architectures (export_families.py) is evaluated as the checkpoint
it was written from: its train_summary.json keeps that checkpoint's config, and its weights are read back into our
classes (families.Family.back), so eval.py gives the scores it gives on the original, seeds alike. A folder that
no longer fits (trained since as the in-library class: a zero it was given is not zero now) is evaluated with
transformers' own classes, said in one line."""

from pathlib import Path

import torch
from safetensors.torch import load_file

from .. import model as crammed
from ..checkpoints.model_folder import SUMMARY, is_our_summary
from ..errors import UserError
from ..families import FAMILIES, Family
from ..untrusted import inside, plain_data, read_json


def exported_family(checkpoint, saved: dict) -> Family | None:
    """The family `saved` (an in-library config.json) belongs to when the folder is an export of ours: its
    train_summary.json is a run's and says it was written as that class. None for any other folder."""
    family = next((f for f in FAMILIES.values() if f.model_type == saved.get("model_type")), None)
    if family is None or saved.get("architectures") != [family.model_class]:
        return None
    path = inside(checkpoint.path, SUMMARY, str(checkpoint.path))
    if not is_our_summary(path):
        return None
    summary = read_json(path, what=SUMMARY)
    if summary.get("exported_as") != family.model_class or not isinstance(summary.get("crammed_config"), dict):
        return None
    return family


def read_back(checkpoint, saved: dict) -> tuple[dict, dict] | None:
    """(the crammed config.json an export was written from, our head's tensors) from an export of ours, or None
    when the folder is none or its weights no longer fit ours (printed)."""
    family = exported_family(checkpoint, saved)
    if family is None or not (Path(checkpoint.path) / "model.safetensors").is_file():  # one file, as we export
        return None
    summary = read_json(inside(checkpoint.path, SUMMARY, str(checkpoint.path)), what=SUMMARY)
    original = summary["crammed_config"]
    plain_data(original, f"checkpoint {checkpoint.path}: {SUMMARY} crammed_config")
    config = crammed.CrammedConfig.from_dict({**original, "model_type": "crammed"})
    if (problem := family.misfit(config)) is not None:
        raise UserError(f"checkpoint {checkpoint.path}: {SUMMARY} describes a model {family.model_class} cannot "
                        f"hold ({problem.split(';')[0]}); not an export cramming wrote")
    head = crammed.CrammedForCausalLM if config.causal else crammed.CrammedForMaskedLM
    with torch.device("meta"):
        shapes = {key: tuple(value.shape) for key, value in head(config).state_dict().items()}
    ours = family.back(load_file(Path(checkpoint.path) / "model.safetensors"), config, shapes)
    if ours is None:
        print(f"{checkpoint.path}: its weights no longer fit the checkpoint it was exported from (trained since as "
              f"{family.model_class}?); evaluated with transformers' {family.model_class} classes", flush=True)
        return None
    return {**original, "model_type": "crammed"}, ours
