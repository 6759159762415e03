"""Training objectives by name (`arch.objective`): the head each trains, how a batch of packed token ids becomes
the model's keyword arguments (input_ids, labels and what else the head reads), and which predictions score which
targets in validation. The model computes the loss; this only prepares its inputs. The model never reads the
objective's name: the config built for it says `causal` (its trait), and config.json keeps it."""

from dataclasses import dataclass
from typing import Protocol

import torch

from ..data.tokenizer import word_starts
from ..model.arch import ArchConfig
from ..model.electra import CrammedForReplacedTokenDetection
from ..model.modeling_crammed import CrammedForCausalLM, CrammedForMaskedLM
from ..model.parametrization import PARAMETRIZATIONS
from ..registry import Registry, invalid
from .masking import MASKINGS, MaskContext, mask_tokens

OBJECTIVES = Registry("objective", traits={
    "masks_tokens": "its batches mask tokens for the model to predict (train.masking chooses which)",
    "causal": "its model attends causally (the config built for it says causal=true, and keeps it)",
    "scores_masked_only": "validation scores the masked positions only (the sparse head decodes only those)",
})
OBJECTIVES.serves(ArchConfig, "objective")


class Objective(Protocol):
    """What the loop and validation ask of an objective."""

    def batch(self, ids: torch.Tensor, generator) -> dict:
        """The model's keyword arguments for a batch of packed ids, masks drawn from `generator`."""

    def scored(self, out, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictions and the targets they score against (validation accuracy)."""


@OBJECTIVES.register("mlm")
@dataclass
class MaskedLM:
    """BERT's masked language modelling: a fixed count of positions per sequence is masked and predicted."""

    mask_prob: float
    mask_token_share: float
    mask_id: int
    vocab_size: int
    special: torch.Tensor
    masking: str = "token"  # train.masking
    context: MaskContext | None = None  # what the masking reads besides the ids (word starts, span parameters)
    document_sep: int | None = None  # data.document_masking: the id closing each packed document; None = off
    head = CrammedForMaskedLM  # the pretraining model (a class attribute, not a field)
    masks_tokens = True
    scores_masked_only = True  # the sparse head (arch.sparse_prediction) decodes only the masked positions

    def batch(self, ids: torch.Tensor, generator) -> dict:
        inputs, labels = mask_tokens(ids, self.mask_prob, self.mask_id, self.vocab_size, self.special,
                                     self.mask_token_share, generator, self.masking, self.context)
        # pretraining: the head's sparse prediction (arch.sparse_prediction) and token dropping apply
        return {"input_ids": inputs, "labels": labels, "pretraining": True, **documents_of(ids, self.document_sep)}

    @staticmethod
    def scored(out, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(predicted ids, targets) over the masked positions. The sparse head returns only those rows."""
        logits, labels = out.logits, inputs["labels"]
        selected = labels != -100
        return (logits[selected] if logits.dim() == 3 else logits).argmax(-1), labels[selected]


@OBJECTIVES.register("clm")
@dataclass
class CausalLM:
    """Next-token prediction on every position; the model shifts the labels itself (as Hugging Face's do)."""

    mask_prob: float = 0.0
    mask_token_share: float = 0.0
    mask_id: int = 0
    vocab_size: int = 0
    special: torch.Tensor | None = None
    masking: str = "token"
    context: MaskContext | None = None
    document_sep: int | None = None
    head = CrammedForCausalLM
    causal = True

    def batch(self, ids: torch.Tensor, generator) -> dict:
        return {"input_ids": ids, "labels": ids, **documents_of(ids, self.document_sep)}

    @staticmethod
    def scored(out, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return out.logits[:, :-1].argmax(-1).reshape(-1), inputs["labels"][:, 1:].reshape(-1)


@OBJECTIVES.register("rtd")
@dataclass
class ReplacedTokenDetection(MaskedLM):
    """ELECTRA (model/electra.py): MLM's masks for the generator, and one uniform per position for sampling its
    replacements, drawn after the masks from the same positional generator. Validation scores the discriminator:
    val_accuracy is the share of tokens it classifies right (replaced or original); val_loss is the training loss
    (generator MLM loss + arch.rtd.weight x detection loss)."""

    head = CrammedForReplacedTokenDetection
    scores_masked_only = True  # the generator decodes only the masked positions

    def batch(self, ids: torch.Tensor, generator) -> dict:
        inputs = super().batch(ids, generator)
        return {**inputs, "replace_draws": torch.rand(ids.shape, generator=generator, device=ids.device)}

    @staticmethod
    def scored(out, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return (out.logits > 0).reshape(-1), out.replaced.reshape(-1)

    @staticmethod
    def problem(config) -> str | None:
        """What the generator's narrower copy of the architecture cannot be (config: a PretrainConfig)."""
        if PARAMETRIZATIONS.trait(config.arch.parametrization, "width_relative"):
            return invalid("arch.parametrization", config.arch.parametrization, "arch.objective=rtd trains a "
                           "generator of another width, which muP would scale by the discriminator's; use "
                           f"{PARAMETRIZATIONS.choices('width_relative', has=False)}")
        if config.arch.rtd.tie_embeddings and not config.arch.tie_embeddings:
            return invalid("arch.rtd.tie_embeddings", True, "the generator would predict through the shared token "
                           "embeddings, which arch.tie_embeddings=false unties from every head; set "
                           "arch.rtd.tie_embeddings=false (or arch.tie_embeddings=true)")
        return None


def documents_of(ids: torch.Tensor, sep: int | None) -> dict:
    """{"document_ids": ...} for the model when documents are kept apart (sep: the id that closes each document in
    the packed stream, data/prepare.py), else {}. A separator belongs to the document it closes; the ids are read
    before any masking, so a masked separator still ends its document."""
    if sep is None:
        return {}
    closes = ids == sep
    return {"document_ids": closes.cumsum(-1) - closes.long()}


def build_objective(name: str, cfg_train, meta: dict, device, tokenizer=None, documents: bool = False):
    """The objective `name` masking as cfg_train says; train.masking=whole-word reads the word starts from
    `tokenizer` (the data folder's); documents (data.document_masking) gives the model each row's document ids."""
    special = torch.tensor(list(meta["special_ids"].values()), device=device)
    context = MaskContext(special, span_p=cfg_train.span.p, span_max_length=cfg_train.span.max_length)
    if MASKINGS.trait(cfg_train.masking, "reads_words") and OBJECTIVES.trait(name, "masks_tokens"):
        if tokenizer is None:
            raise ValueError("train.masking=whole-word needs the tokenizer to find word starts")
        size = max(meta["vocab_size"], len(tokenizer))
        context.starts_word = word_starts(tokenizer, size).to(device)
    return OBJECTIVES.get_or_explain(name)(cfg_train.mask_prob, cfg_train.mask_token_share,
                                           meta["special_ids"]["mask"], meta["vocab_size"], special,
                                           cfg_train.masking, context,
                                           meta["special_ids"]["sep"] if documents else None)

