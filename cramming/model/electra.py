"""ELECTRA's replaced-token detection (Clark et al. 2020), `arch.objective=rtd`.

A small masked-LM generator fills the masked positions with tokens sampled from its own predictions; the
discriminator (this model's `encoder`, the one fine-tuning loads) reads the corrupted sequence and tells, at every
real token, whether it was replaced. Both train at once on
    loss = generator MLM loss + arch.rtd.weight x detection loss (binary cross-entropy, mean over real tokens).
The sampling is not differentiated through (ELECTRA's choice), so the detection loss trains the discriminator only.

The generator is a CrammedForMaskedLM of the same architecture, narrower: arch.rtd.generator_scale of the heads
(the head width stays, as ELECTRA's generators keep 64-wide heads) and of the FFN, arch.rtd.generator_layers deep.

Its embeddings are the discriminator's (arch.rtd.tie_embeddings, default true), as in google-research/electra,
whose default `untied_generator_embeddings=False` puts both models' embedding block (token and position
embeddings and their norm) in one variable scope, at the discriminator's width, also when the generator is narrower;
the paper reports this tied variant as better. The generator then projects the embeddings to its own width (the
reference's `embeddings_project`), and its MLM head maps back up (dense, activation, norm, as the reference's
`get_token_logits`) before the shared token matrix. arch.rtd.tie_embeddings=false gives the generator embeddings
(and a head) of its own width instead, as checkpoints saved before the option existed have.

Sampling draws one uniform per masked position, `replace_draws`, which the objective takes from the mask's
positional generator (train/objectives.py), so a resumed run and the validation set see the same replacements.
Only relative imports: Hugging Face copies this folder flat for `trust_remote_code=True`.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import ModelOutput

from .configuration_crammed import CrammedConfig
from .losses import head_logits
from .modeling_crammed import CrammedForMaskedLM, CrammedModel, _Activation
from .norms import build_norm
from .parametrization import mark_hidden
from .pretrained import CrammedPreTrainedModel

SHARED_EMBEDDINGS = ("tokens", "positions", "embedding_norm")  # the reference's "electra/embeddings" scope


def generator_config(config: CrammedConfig) -> CrammedConfig:
    """The discriminator's config with the generator's sizes and the plain MLM objective."""
    scale = config.rtd.generator_scale
    head_dim = config.hidden_size // config.num_heads
    heads = max(1, round(config.num_heads * scale))
    hidden = heads * head_dim
    sizes = {"num_heads": heads, "hidden_size": hidden, "ffn_size": max(1, round(config.ffn_size * hidden /
                                                                                 config.hidden_size)),
             "num_layers": config.rtd.generator_layers or config.num_layers, "objective": "mlm",
             "token_dropping": {"keep": None},  # the generator runs whole (arch.token_dropping refuses rtd anyway)
             # shared embeddings: the parent ties the generator's decoder to the discriminator's tokens instead
             "tie_embeddings": config.tie_embeddings and not config.rtd.tie_embeddings}
    return CrammedConfig(**{**config.to_dict(), **sizes})


@dataclass
class ReplacedTokenDetectionOutput(ModelOutput):
    """logits: the discriminator's, one per token (> 0: replaced); replaced: what it should say (with labels)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    replaced: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    detection_loss: torch.Tensor | None = None


class CrammedForReplacedTokenDetection(CrammedPreTrainedModel):
    """Discriminator (`encoder` + `detector`) and generator, trained jointly; see the module docstring."""

    _tied_weights_keys = {"generator.decoder.weight": "generator.encoder.tokens.weight"}
    # What checkpoint.py adds to config.json's auto_map for this head (AUTO_MAP holds the ones every model has).
    extra_auto_map = {"AutoModelForPreTraining": "electra.CrammedForReplacedTokenDetection"}

    def __init__(self, config: CrammedConfig):
        if config.objective != "rtd":
            raise ValueError(f"this checkpoint was trained with objective {config.objective!r}, not rtd: it has no "
                             "discriminator head; load it with AutoModelForMaskedLM")
        super().__init__(config)
        self.encoder = CrammedModel(config)
        self.detector = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias),
                                      _Activation(config.activation), nn.Linear(config.hidden_size, 1))
        mark_hidden(self.detector[0])
        self.generator = CrammedForMaskedLM(generator_config(config))
        if config.rtd.tie_embeddings:
            self.share_embeddings()
        self.post_init()

    def share_embeddings(self) -> None:
        """The generator reads through the discriminator's embedding block, projected to its width, and predicts
        through the shared token matrix from a head that maps back to the embedding width (module docstring)."""
        config, generator = self.config, self.generator
        width, own = config.hidden_size, generator.config.hidden_size
        tied = {"generator.decoder.weight": "encoder.tokens.weight"}
        for name in SHARED_EMBEDDINGS:
            module = getattr(self.encoder, name)
            setattr(generator.encoder, name, module)
            tied |= {f"generator.encoder.{name}.{key}": f"encoder.{name}.{key}"
                     for key, _ in (module.named_parameters() if module is not None else ())}
        if own != width:
            generator.encoder.embedding_project = nn.Linear(width, own, bias=config.bias)
        generator.transform = nn.Sequential(nn.Linear(own, width, bias=config.bias), _Activation(config.activation),
                                            build_norm(config))
        generator.decoder = nn.Linear(width, config.vocab_size, bias=config.bias)
        self._tied_weights_keys = tied  # saved once, under the discriminator's names

    def forward(self, input_ids, attention_mask=None, labels=None, replace_draws=None, return_dict=None,
                document_ids=None, pretraining: bool = True, **kwargs) -> ReplacedTokenDetectionOutput:
        """labels: MLM labels (the original ids at the masked positions, -100 elsewhere); without them, the
        discriminator's logits on input_ids as they are. replace_draws: uniforms shaped like input_ids, read at the
        masked positions (None: drawn from torch's generator). document_ids: both encoders' (CrammedModel's).
        pretraining: what the objective passes every head; this one only pretrains (its generator always decodes the
        masked positions alone)."""
        if labels is None:
            return ReplacedTokenDetectionOutput(logits=self.discriminate(input_ids, attention_mask, document_ids))
        generator_loss, sampled, selected = self.generate_replacements(input_ids, attention_mask, labels,
                                                                       replace_draws, document_ids)
        corrupted = input_ids.reshape(-1).masked_scatter(selected, sampled).reshape(input_ids.shape)
        replaced = corrupted != torch.where(labels == -100, input_ids, labels)
        logits = self.discriminate(corrupted, attention_mask, document_ids)
        per_token = F.binary_cross_entropy_with_logits(logits.float(), replaced.float(), reduction="none")
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(replaced)
        detection_loss = per_token[real].mean()
        loss = generator_loss + self.config.rtd.weight * detection_loss
        return ReplacedTokenDetectionOutput(loss=loss, logits=logits, replaced=replaced,
                                            generator_loss=generator_loss.detach(),
                                            detection_loss=detection_loss.detach())

    def discriminate(self, input_ids, attention_mask, document_ids=None) -> torch.Tensor:
        hidden = self.encoder(input_ids, attention_mask, document_ids=document_ids).last_hidden_state
        return self.detector(hidden).squeeze(-1)

    def generate_replacements(self, input_ids, attention_mask, labels, replace_draws, document_ids=None):
        """(generator MLM loss, a sampled token per masked position in row-major order, the flat masked mask)."""
        generator = self.generator
        hidden = generator.encoder(input_ids, attention_mask, document_ids=document_ids).last_hidden_state
        selected = labels.reshape(-1) != -100
        rows = generator.transform(hidden.reshape(-1, hidden.shape[-1])[selected])
        logits = head_logits(rows, generator.decoder, generator.config.logit_softcap, generator.logit_multiplier)
        loss = F.cross_entropy(logits.float(), labels.reshape(-1)[selected])
        with torch.no_grad():  # inverse-CDF sampling: one uniform per masked position
            draws = (torch.rand(selected.shape, device=input_ids.device) if replace_draws is None
                     else replace_draws.reshape(-1))[selected]
            cdf = torch.softmax(logits.float(), dim=-1).cumsum(-1)
            sampled = torch.searchsorted(cdf, draws[:, None].to(cdf.dtype)).squeeze(-1)
            sampled = sampled.clamp_(max=logits.shape[-1] - 1).to(input_ids.dtype)
        return loss, sampled, selected


CrammedForReplacedTokenDetection.register_for_auto_class("AutoModelForPreTraining")
