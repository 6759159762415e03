"""transformers' common model tests against cramming's classes, through a BERT-style model tester: the module
scripts/hf_common_tests.py runs beside the `tests` package of transformers' source distribution (not part of this
project). Each class below is what a contributor of an in-library model writes: the model tester and the classes
to test, for an MLM and for a causal configuration; no test of the mixins is opted out."""

import unittest

from tests.generation.test_utils import GenerationTesterMixin
from tests.test_configuration_common import ConfigTester
from tests.test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from transformers.models.auto import modeling_auto

from cramming.model import (
    CrammedConfig,
    CrammedForCausalLM,
    CrammedForMaskedLM,
    CrammedForMultipleChoice,
    CrammedForQuestionAnswering,
    CrammedForSequenceClassification,
    CrammedForTokenClassification,
    CrammedModel,
)

# What an in-library model gets by being listed in transformers' mappings (the mixins read them by class name).
AUTO = [(AutoModel, "MODEL_MAPPING_NAMES", CrammedModel),
        (AutoModelForMaskedLM, "MODEL_FOR_MASKED_LM_MAPPING_NAMES", CrammedForMaskedLM),
        (AutoModelForCausalLM, None, CrammedForCausalLM),
        (AutoModelForSequenceClassification, "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
         CrammedForSequenceClassification),
        (AutoModelForTokenClassification, "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
         CrammedForTokenClassification),
        (AutoModelForQuestionAnswering, "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", CrammedForQuestionAnswering),
        (AutoModelForMultipleChoice, "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", CrammedForMultipleChoice)]
AutoConfig.register("crammed", CrammedConfig, exist_ok=True)
for auto, names, cls in AUTO:
    auto.register(CrammedConfig, cls, exist_ok=True)
    if names is not None:
        getattr(modeling_auto, names)["crammed"] = cls.__name__
modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["crammed-causal"] = CrammedForCausalLM.__name__


class CrammedModelTester:
    """BERT's tester's sizes (its intermediate size made even: our default FFN is a GLU, which halves it)."""

    def __init__(self, parent, causal=False, batch_size=13, seq_length=7, vocab_size=99, hidden_size=32,
                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=36, num_labels=3, num_choices=4):
        self.parent, self.causal = parent, causal
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads, self.intermediate_size = num_attention_heads, intermediate_size
        self.num_labels, self.num_choices = num_labels, num_choices
        self.is_training = True

    def get_config(self):
        return CrammedConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                             num_layers=self.num_hidden_layers, num_heads=self.num_attention_heads,
                             ffn_size=self.intermediate_size, max_seq_length=512, hidden_dropout=0.1,
                             attention_dropout=0.1, num_labels=self.num_labels,
                             objective="clm" if self.causal else "mlm", causal=self.causal)

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        mask = random_attention_mask([self.batch_size, self.seq_length])
        return self.get_config(), {"input_ids": input_ids, "attention_mask": mask}


class CrammedMaskedModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (CrammedModel, CrammedForMaskedLM, CrammedForSequenceClassification,
                         CrammedForTokenClassification, CrammedForQuestionAnswering, CrammedForMultipleChoice)

    def setUp(self):
        self.model_tester = CrammedModelTester(self)
        self.config_tester = ConfigTester(self, config_class=CrammedConfig, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class CrammedCausalModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (CrammedModel, CrammedForCausalLM, CrammedForSequenceClassification)

    def setUp(self):
        self.model_tester = CrammedModelTester(self, causal=True)
        self.config_tester = ConfigTester(self, config_class=CrammedConfig, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()
