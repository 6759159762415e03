"""Fine-tuning heads beyond sequence classification: per-token labels, extractive question answering, multiple choice.

Each is the encoder plus one small layer, with Hugging Face's output classes and losses, so a checkpoint loads as
AutoModelForTokenClassification, AutoModelForQuestionAnswering or AutoModelForMultipleChoice
(trust_remote_code=True); the encoder's weights come from the checkpoint (base_model_prefix "encoder"), the head's
are new. A causal checkpoint's encoder stays causal here: each position sees only the tokens to its left.
Only relative imports: Hugging Face copies this folder flat for `trust_remote_code=True`.
"""

from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import MultipleChoiceModelOutput, QuestionAnsweringModelOutput, TokenClassifierOutput

from .configuration_crammed import CrammedConfig
from .modeling_crammed import (
    ClassificationHead,
    CrammedModel,
    CrammedPreTrainedModel,
    as_requested,
    encoder_outputs,
    pooled_token,
)
from .renamed import HEAD_KEYS, current_head_keys


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


class CrammedForMultipleChoice(CrammedPreTrainedModel):
    """Encoder + pooler (dense + tanh, as BERT's) + dropout + one score per choice (ClassificationHead, named
    `classifier`); the loss is cross-entropy over the choices. Inputs are (batch, choices, seq); each choice is encoded
    alone and pooled like the sequence classifier: the first token ([CLS]) of a bidirectional model, the last real
    token of a causal one."""

    def __init__(self, config: CrammedConfig):
        super().__init__(config)
        self.encoder = CrammedModel(config)
        self.classifier = ClassificationHead(config, 1)
        self._register_load_state_dict_pre_hook(current_head_keys)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, key_mapping: dict | None = None, **kwargs):
        return super().from_pretrained(*args, key_mapping={**HEAD_KEYS, **(key_mapping or {})}, **kwargs)

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
CrammedForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
CrammedForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
CrammedForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
