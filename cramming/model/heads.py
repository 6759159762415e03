"""The fine-tuning heads: sequence classification (GLUE), per-token labels, extractive question answering and multiple
choice (ELECTRA's pretraining head, replaced-token detection, is electra.py).

Each fine-tuning head is the encoder plus a small layer, with Hugging Face's output classes and losses, so a
checkpoint loads as AutoModelForSequenceClassification, AutoModelForTokenClassification,
AutoModelForQuestionAnswering or AutoModelForMultipleChoice (trust_remote_code=True); the encoder's weights come from
the checkpoint (base_model_prefix "encoder"), the head's are new. A causal checkpoint's encoder stays causal here:
each position sees only the tokens to its left.
Only relative imports: Hugging Face copies this folder flat for `trust_remote_code=True`.
"""


import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import (
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .configuration_crammed import HEAD_KEYS, CrammedConfig, current_head_keys
from .modeling_crammed import CrammedModel, as_requested, encoder_outputs
from .pretrained import CrammedPreTrainedModel


def pooled_token(hidden, attention_mask, causal: bool):
    """The one position a sequence-level head reads: the first ([CLS]) of a bidirectional model; of a causal model
    the last real one (padding on the right), the only token that saw the whole sequence."""
    if not causal:
        return hidden[:, 0]
    if attention_mask is None:
        last = torch.full((hidden.shape[0],), hidden.shape[1] - 1, device=hidden.device)
    else:
        last = attention_mask.sum(1) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class ClassificationHead(nn.Module):
    """BERT's pooler (dense + tanh) on the pooled token, dropout, then the output layer, as one module named
    `classifier`: tools that keep a head's new weights by that name (PEFT's default modules_to_save) keep all of them.
    Heads saved before it held the pooler as `pooler` and the output layer as `classifier` (configuration_crammed.HEAD_KEYS)."""

    def __init__(self, config, outputs: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.out_proj = nn.Linear(config.hidden_size, outputs)

    def forward(self, pooled):
        return self.out_proj(self.dropout(torch.tanh(self.dense(pooled))))


def classification_loss(logits, labels, config, num_labels: int):
    """The loss transformers' sequence classifiers take, by config.problem_type, or when it is unset: regression
    for one label, single-label (cross-entropy) for integer labels, multi-label (a sigmoid per label, labels
    multi-hot) for float ones."""
    problem = config.problem_type
    if problem is None:
        integer = labels.dtype in (torch.long, torch.int)
        problem = "regression" if num_labels == 1 else "single_label_classification" if integer else \
            "multi_label_classification"
    if problem == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(-1).float(), labels.squeeze(-1).float() if labels.dim() > 1
                              else labels.float())
        return F.mse_loss(logits.float(), labels.float())
    if problem == "single_label_classification":
        return F.cross_entropy(logits.float().reshape(-1, num_labels), labels.reshape(-1))
    if problem == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    raise ValueError(f"config.problem_type={problem!r}: choose regression, single_label_classification or "
                     "multi_label_classification")


class PooledHead(CrammedPreTrainedModel):
    """A head whose classifier is a ClassificationHead: one saved before that held the pooler as `pooler` and the
    output layer as `classifier`, and still loads (configuration_crammed.HEAD_KEYS, from a folder or a state dict)."""

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self._register_load_state_dict_pre_hook(current_head_keys)

    @classmethod
    def from_pretrained(cls, *args, key_mapping: dict | None = None, **kwargs):
        return super().from_pretrained(*args, key_mapping={**HEAD_KEYS, **(key_mapping or {})}, **kwargs)


class CrammedForSequenceClassification(PooledHead):
    """Encoder + pooler (dense + tanh) + classifier (ClassificationHead); config.problem_type picks the loss as in
    transformers (one label: regression, STS-B). The pooled token is the first ([CLS]) for bidirectional models and
    the last real one for causal models, the only one that saw all."""

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.encoder = CrammedModel(config)
        self.classifier = ClassificationHead(config, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        out = self.encoder(input_ids, attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
                           output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                           return_dict=True)
        logits = self.classifier(pooled_token(out.last_hidden_state, attention_mask, self.config.causal))
        loss = None if labels is None else classification_loss(logits, labels, self.config, self.num_labels)
        return as_requested(SequenceClassifierOutput(loss=loss, logits=logits, **encoder_outputs(out)), return_dict,
                            self.config)


class CrammedForTokenClassification(CrammedPreTrainedModel):
    """Encoder + dropout + linear classifier on every token (NER, POS tagging); labels of -100 count for nothing.

    For a causal checkpoint each token's logits read only that token and the ones before it (its left context), so
    a tag that depends on the words after it is harder than for a bidirectional (MLM) checkpoint.
    """

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.encoder = CrammedModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs) -> TokenClassifierOutput:
        out = self.encoder(input_ids, attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
                           output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                           return_dict=True)
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return as_requested(TokenClassifierOutput(loss=loss, logits=logits, **encoder_outputs(out)), return_dict,
                            self.config)


class CrammedForQuestionAnswering(CrammedPreTrainedModel):
    """Encoder + linear layer to two scores per token: where the answer span starts and where it ends (SQuAD).

    The loss is BERT's: the mean of the start and end cross-entropies, with positions outside the sequence clamped
    to its length and ignored (an answer truncated away teaches nothing). A causal checkpoint scores each token from
    its left context only.
    """

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.encoder = CrammedModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, start_positions=None, end_positions=None,
                position_ids=None, inputs_embeds=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs) -> QuestionAnsweringModelOutput:
        out = self.encoder(input_ids, attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
                           output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                           return_dict=True)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]  # one past the last position: where out-of-sequence answers go
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)) / 2
        output = QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                              **encoder_outputs(out))
        return as_requested(output, return_dict, self.config)


class CrammedForMultipleChoice(PooledHead):
    """Encoder + pooler (dense + tanh, as BERT's) + dropout + one score per choice (ClassificationHead, named
    `classifier`); the loss is cross-entropy over the choices. Inputs are (batch, choices, seq); each choice is encoded
    alone and pooled like the sequence classifier: the first token ([CLS]) of a bidirectional model, the last real
    token of a causal one."""

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.encoder = CrammedModel(config)
        self.classifier = ClassificationHead(config, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> MultipleChoiceModelOutput:
        given = input_ids if input_ids is not None else inputs_embeds
        batch, choices, seq = given.shape[:3]

        def flat(t):  # (batch, choices, seq, ...) -> (batch * choices, seq, ...)
            return None if t is None else t.reshape(batch * choices, seq, *t.shape[3:])

        flat_mask = flat(attention_mask)
        out = self.encoder(flat(input_ids), flat_mask, position_ids=flat(position_ids),
                           inputs_embeds=flat(inputs_embeds), output_attentions=output_attentions,
                           output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.classifier(pooled_token(out.last_hidden_state, flat_mask, self.config.causal))
        logits = logits.reshape(batch, choices)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels)
        return as_requested(MultipleChoiceModelOutput(loss=loss, logits=logits, **encoder_outputs(out)), return_dict,
                            self.config)


# Saved checkpoints name these classes in config.json's auto_map (cramming.model.AUTO_MAP).
CrammedForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
CrammedForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
CrammedForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
CrammedForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
