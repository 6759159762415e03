"""Training objectives by name (`arch.objective`): the head each trains, how a batch of packed token ids becomes
(inputs, labels), and which logits score which targets. The model computes the loss; this only prepares its
inputs. The model itself reads the objective once, as `CrammedConfig.causal`."""

from dataclasses import dataclass

import torch

from ..model.modeling_crammed import CrammedForCausalLM, CrammedForMaskedLM
from ..model.registry import Registry
from .masking import mask_tokens

OBJECTIVES = Registry("objective")


@OBJECTIVES.register("mlm")
@dataclass
class MaskedLM:
    """BERT's masked language modelling: a fixed count of positions per sequence is masked and predicted."""

    mask_prob: float
    mask_token_share: float
    mask_id: int
    vocab_size: int
    special: torch.Tensor
    head = CrammedForMaskedLM  # the pretraining model (a class attribute, not a field)
    scores_masked_only = True  # the sparse head (arch.sparse_prediction) decodes only the masked positions

    def batch(self, ids: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_tokens(ids, self.mask_prob, self.mask_id, self.vocab_size, self.special,
                           self.mask_token_share, generator)

    @staticmethod
    def scored(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(predictions' logits, targets) over the masked positions. The sparse head returns only those rows."""
        selected = labels != -100
        return (logits[selected] if logits.dim() == 3 else logits), labels[selected]


@OBJECTIVES.register("clm")
@dataclass
class CausalLM:
    """Next-token prediction on every position; the model shifts the labels itself (as Hugging Face's do)."""

    mask_prob: float = 0.0
    mask_token_share: float = 0.0
    mask_id: int = 0
    vocab_size: int = 0
    special: torch.Tensor | None = None
    head = CrammedForCausalLM
    scores_masked_only = False

    def batch(self, ids: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
        return ids, ids

    @staticmethod
    def scored(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)


def build_objective(name: str, cfg_train, meta: dict, device):
    special = torch.tensor(list(meta["special_ids"].values()), device=device)
    return OBJECTIVES.get_or_explain(name)(cfg_train.mask_prob, cfg_train.mask_token_share,
                                           meta["special_ids"]["mask"], meta["vocab_size"], special)
