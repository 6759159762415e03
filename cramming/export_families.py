"""A crammed checkpoint written as one of transformers' own architectures (`python -m cramming.export <folder>
<out> --as <family>`; families/): a plain model folder, with no auto_map and no code, that loads wherever
transformers does, remote code or not. `--families` says which families a checkpoint fits, or the first option
each cannot represent. The folder is written only once the in-library model's logits are checked equal to ours
(families.TOLERANCE, fp32, a padded batch); it keeps the card and train_summary.json of the checkpoint."""

import json
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from .card import write_card
from .checkpoints.model_folder import SUMMARY, claim_model_folder, is_our_summary, no_shard_bar
from .checkpoints.step_folder import MARKER
from .data.tokenizer import for_generation
from .errors import UserError
from .eval.checkpoint import check_checkpoint
from .eval.finetune import Checkpoint, auto_model
from .families import FAMILIES, TOLERANCE, Family
from .outputs import remove, replace_folder, temp_folder, writing
from .untrusted import inside, read_json


def source_model(folder: Path, step_model):
    """(our model in fp32 eval mode, its tokenizer, its train summary) from a step folder (step_model: export.py's
    builder) or one of our model folders (checked as eval.py checks one: nothing of it runs)."""
    folder = Path(folder)
    if (folder / MARKER).is_file():
        model, tokenizer, summary = step_model(folder)
        return model.eval(), tokenizer, summary
    checkpoint = Checkpoint(folder)
    tokenizer, config = check_checkpoint(checkpoint)
    if config.model_type != "crammed":
        raise UserError(f"{folder} is a {config.model_type} model folder, already transformers' own; --as exports "
                        "crammed checkpoints (a run's checkpoint/ or a step folder)")
    summary_path = inside(folder, SUMMARY, str(folder))
    if not is_our_summary(summary_path):
        raise UserError(f"{folder}: no {SUMMARY} of a run beside its weights; export a run's checkpoint/ or a step "
                        "folder")
    if config.objective not in ("mlm", "clm"):
        raise UserError(f"{folder}: arch.objective={config.objective!r} has no family in transformers (the families "
                        "export mlm and clm checkpoints)")
    head = AutoModelForCausalLM if config.causal else AutoModelForMaskedLM
    model = auto_model(head, checkpoint, random_init=False)
    return model.float().eval(), tokenizer, read_json(summary_path, what=SUMMARY)


def fits(config) -> dict[str, str | None]:
    """Each family's misfit (families.Family.misfit) for this config: None where it exports."""
    return {name: family.misfit(config) for name, family in FAMILIES.items()}


def special_ids(tokenizer) -> dict:
    """The tokenizer's special ids the families' configs carry; bos and eos are [CLS] and [SEP] where it names none
    (a document starts with [CLS] and ends with [SEP] in training)."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    return {"pad": tokenizer.pad_token_id, "cls": cls, "sep": sep, "mask": tokenizer.mask_token_id,
            "bos": tokenizer.bos_token_id if tokenizer.bos_token_id is not None else cls,
            "eos": tokenizer.eos_token_id if tokenizer.eos_token_id is not None else sep}


def converted(model, family: Family, tokenizer):
    """transformers' model of `family` holding our model's weights (every tensor of theirs from one of ours)."""
    config = family.config(model.config, special_ids(tokenizer))
    theirs = getattr(transformers, family.model_class)(config).float().eval()
    state = {key: value.detach().float() for key, value in model.state_dict().items()}
    missing, unexpected = theirs.load_state_dict(family.tensors(state, model.config), strict=False)
    missing = [key for key in missing if key not in tied_keys(theirs)]
    if missing or unexpected:  # a family file out of step with transformers: ours to fix, not the user's
        raise RuntimeError(f"{family.model_class}: tensors not filled {missing[:5]}, unknown {unexpected[:5]}")
    return theirs


def tied_keys(model) -> set[str]:
    """The tensors transformers fills by tying (the LM head from the embeddings when tied)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if model.config.tie_word_embeddings else set()


@torch.no_grad()
def logits_difference(ours, theirs, vocab_size: int, seed: int = 0) -> float:
    """The largest |logit difference| at the real tokens of a padded batch (rows of 3 lengths, right-padded)."""
    generator = torch.Generator().manual_seed(seed)
    seq = min(24, ours.config.max_seq_length)
    ids = torch.randint(5, vocab_size, (3, seq), generator=generator)
    mask = torch.ones_like(ids)
    for row, length in enumerate((seq, seq - seq // 3, max(1, seq // 4))):
        mask[row, length:] = 0
        ids[row, length:] = ours.config.pad_token_id
    ours_logits = ours(input_ids=ids, attention_mask=mask).logits.float()
    their_logits = theirs(input_ids=ids, attention_mask=mask).logits.float()
    return (ours_logits - their_logits).abs()[mask.bool()].max().item()


def export_as(folder: Path, out: Path | None, family_name: str, step_model) -> tuple[Path, float]:
    """Write `folder` (a step or model folder) as `family_name`'s model into `out` (default: beside it,
    <name>-<family>); returns the folder and the logits difference checked."""
    if family_name not in FAMILIES:
        raise UserError(f"--as {family_name!r}: not a family; choose one of {', '.join(FAMILIES)}")
    family = FAMILIES[family_name]
    folder = Path(folder)
    with no_shard_bar():
        return write_as(folder, out, family, step_model)


def write_as(folder: Path, out: Path | None, family: Family, step_model) -> tuple[Path, float]:
    model, tokenizer, summary = source_model(folder, step_model)
    if (problem := family.misfit(model.config)) is not None:
        raise UserError(f"{folder}: {problem}")
    if out is None:  # a step folder's beside the run's other exports, a model folder's beside it
        stepped = (folder / MARKER).is_file()
        out = (folder.parent.parent / "exported" if stepped else folder.parent) / f"{folder.name}-{family.name}"
    claim_model_folder(out)
    theirs = converted(model, family, tokenizer)
    difference = logits_difference(model, theirs, model.config.vocab_size)
    if not difference <= TOLERANCE:
        raise UserError(f"{folder}: {family.model_class}'s logits differ from ours by {difference:.2e} (more than "
                        f"{TOLERANCE:g}); nothing was written. Please report it with the checkpoint's config.json")
    original = {key: value for key, value in model.config.to_dict().items() if key not in ("auto_map", "_name_or_path")}
    summary = {**summary, "exported_as": family.model_class, "exported_from": str(folder.resolve()),
               "crammed_config": original}  # what eval.py reads it back as (eval/exported.py)
    with writing(out.absolute().parent, f"the model folder {out.name}"):
        tmp = temp_folder(out.absolute().parent, out.name)
        try:
            write_family_folder(theirs, tokenizer, summary, type(model), family.causal, tmp)
            replace_folder(tmp, out.absolute())
        except BaseException:
            remove(tmp)
            raise
    return out.resolve(), difference


def write_family_folder(theirs, tokenizer, summary: dict, head, causal: bool, tmp: Path) -> None:
    """The weights and config, a plain fast tokenizer, the card, and train_summary.json last."""
    theirs.save_pretrained(tmp, safe_serialization=True)
    if causal:
        tokenizer = for_generation(tokenizer)  # prompts without a closing [SEP], as our causal folders ship
    tokenizer.save_pretrained(tmp)
    settings = tmp / "tokenizer_config.json"
    saved = json.loads(settings.read_text())
    if saved.pop("auto_map", None) is not None:  # a plain tokenizer: nothing that names code
        settings.write_text(json.dumps(saved, indent=2))
    write_card(tmp, summary, head)
    (tmp / SUMMARY).write_text(json.dumps(summary, indent=2))


def fits_lines(folder: Path, step_model) -> list[str]:
    """--families: one line per family, `fits` or why not (a model folder's config is enough: no model is built)."""
    folder = Path(folder)
    with no_shard_bar():
        if (folder / MARKER).is_file():
            config = step_model(folder)[0].config
        else:
            _, config = check_checkpoint(Checkpoint(folder))
            if config.model_type != "crammed":
                raise UserError(f"{folder} is a {config.model_type} model folder, already transformers' own")
    return [f"{name}: " + ("fits (--as " + name + f", {FAMILIES[name].model_class})" if problem is None else problem)
            for name, problem in fits(config).items()]
