"""A checkpoint behaves as an in-library transformers model: output_hidden_states, output_attentions and
return_dict, inputs_embeds, the cache under both names, shift_labels, full-sequence masked-LM logits, problem_type,
gradient checkpointing, export without a data-dependent branch, PEFT adapters and each objective's auto_map."""

import warnings

import pytest
import torch
from torch.nn import functional as F

from cramming.model import (
    CrammedConfig,
    CrammedForCausalLM,
    CrammedForMaskedLM,
    CrammedForMultipleChoice,
    CrammedForQuestionAnswering,
    CrammedForSequenceClassification,
    CrammedForTokenClassification,
    CrammedModel,
    auto_map_of,
)

TINY = {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "ffn_size": 64, "max_seq_length": 32}
HEADS = [CrammedModel, CrammedForMaskedLM, CrammedForSequenceClassification, CrammedForTokenClassification,
         CrammedForQuestionAnswering]


def build(cls, causal=False, seed=0, **overrides):
    torch.manual_seed(seed)
    config = CrammedConfig(**{**TINY, **overrides}, objective="clm" if causal else "mlm", causal=causal)
    return cls(config).eval()


def batch(rows=3, seq=10):
    ids = torch.randint(5, 97, (rows, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, seq - 3:] = 0
    return ids, mask


def first_output(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else \
        out.start_logits if hasattr(out, "start_logits") else out.logits


@pytest.mark.parametrize("causal", [False, True])
def test_hidden_states_are_the_embeddings_and_every_block_the_last_normalised(causal):
    model = build(CrammedForCausalLM if causal else CrammedForMaskedLM, causal)
    ids, mask = batch()
    seen = []
    hooks = [layer.register_forward_hook(lambda m, a, out: seen.append(out)) for layer in model.encoder.layers]
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    states = out.hidden_states
    assert len(states) == TINY["num_layers"] + 1
    torch.testing.assert_close(states[0], model.encoder.embed(ids, 0, None))
    torch.testing.assert_close(states[1], seen[0])  # each block's own output
    torch.testing.assert_close(states[-1], model.encoder.final_norm(seen[-1]))  # = last_hidden_state
    torch.testing.assert_close(states[-1], model.encoder(ids, attention_mask=mask).last_hidden_state)
    assert model(ids).hidden_states is None  # not asked: nothing kept
    model.config.output_hidden_states = True  # the config's default, as transformers reads it
    assert len(model(ids).hidden_states) == TINY["num_layers"] + 1


@pytest.mark.parametrize("causal", [False, True])
def test_attentions_are_the_probabilities_and_leave_the_output_alone(causal):
    model = build(CrammedForCausalLM if causal else CrammedForMaskedLM, causal)
    ids, mask = batch()
    plain = model(ids, attention_mask=mask).logits
    out = model(ids, attention_mask=mask, output_attentions=True)
    torch.testing.assert_close(out.logits, plain, rtol=1e-5, atol=1e-5)  # the eager formula, the same function
    assert len(out.attentions) == TINY["num_layers"]
    probs = out.attentions[0]
    assert probs.shape == (3, TINY["num_heads"], 10, 10)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, TINY["num_heads"], 10))
    assert probs[0, :, :, 7:].abs().max() == 0  # the padded keys get nothing
    if causal:
        assert torch.triu(probs[1], diagonal=1).abs().max() == 0  # nor the future
    # the first block's probabilities, by hand from its own projections
    attn = model.encoder.layers[0].attn
    x = model.encoder.layers[0].norm1(model.encoder.embed(ids, 0, None))
    q, k, _ = attn.qkv(x).view(3, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-2, -1)) / 8 ** 0.5
    visible = mask.bool()[:, None, None, :] & (torch.ones(10, 10).tril().bool() if causal else True)
    torch.testing.assert_close(probs, scores.masked_fill(~visible, float("-inf")).softmax(-1), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("cls", [*HEADS, CrammedForCausalLM, CrammedForMultipleChoice])
def test_return_dict_false_gives_the_tuple_and_inputs_embeds_the_same_outputs(cls):
    model = build(cls, causal=cls is CrammedForCausalLM)
    ids, mask = batch()
    if cls is CrammedForMultipleChoice:
        ids, mask = ids[None].expand(2, -1, -1), mask[None].expand(2, -1, -1)
    out = model(ids, attention_mask=mask)
    as_tuple = model(ids, attention_mask=mask, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], first_output(out))
    model.config.return_dict = False  # the config's default too
    assert isinstance(model(ids, attention_mask=mask), tuple)
    model.config.return_dict = True
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(first_output(model(inputs_embeds=embeds, attention_mask=mask)), first_output(out))
    with pytest.raises(ValueError, match="input_ids or inputs_embeds"):
        model(ids, inputs_embeds=embeds)


def test_the_masked_lm_gives_every_positions_logits_and_the_masked_loss():
    model = build(CrammedForMaskedLM)
    ids, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, 10, 97)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 97), labels.reshape(-1)))
    sparse = model(ids, attention_mask=mask, labels=labels, pretraining=True)  # the objective's forward
    assert sparse.logits.shape == (3, 97)
    torch.testing.assert_close(sparse.loss, out.loss)


def test_the_causal_lm_takes_shift_labels_and_both_cache_names():
    from transformers import DynamicCache

    model = build(CrammedForCausalLM, causal=True)
    ids, mask = batch()
    out = model(ids, labels=ids)
    shifted = F.pad(ids[:, 1:], (0, 1), value=-100)
    torch.testing.assert_close(model(ids, shift_labels=shifted).loss, out.loss)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1)))
    new = model(ids[:, :6], use_cache=True)
    cache_name = "cache" if hasattr(new, "cache") else "past_key_values"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = model(ids[:, :6], past_key_values=DynamicCache(config=model.config), use_cache=True)
    assert getattr(old, cache_name).get_seq_length() == getattr(new, cache_name).get_seq_length() == 6
    if cache_name == "cache":  # the installed transformers renamed it: the old name is said to be deprecated
        assert any("`past_key_values` is deprecated" in str(w.message) for w in caught)
    step = model(ids[:, 6:7], **{cache_name: getattr(new, cache_name)})
    torch.testing.assert_close(step.logits[:, -1], model(ids[:, :7]).logits[:, -1], rtol=1e-5, atol=1e-5)


def test_the_trainer_evaluates_a_causal_lm_whose_batches_carry_only_labels(tmp_path):
    """run_clm.py's batches hold `labels` only: the Trainer expects every forward argument named *label* in them
    (find_labels), and without all of them computes no eval_loss."""
    from transformers import Trainer, TrainingArguments
    from transformers.utils import find_labels

    assert find_labels(CrammedForCausalLM) == ["labels"]
    model = build(CrammedForCausalLM, causal=True)
    ids, _ = batch(rows=4)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True)
    metrics = Trainer(model=model, args=args, eval_dataset=data).evaluate()
    expected = model(ids, labels=ids).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-4)


def test_a_causal_checkpoint_names_its_tokenizers_bos_and_eos_in_both_configs(causal_checkpoint):
    """transformers' causal LMs name bos and eos in config.json; without them the Trainer given the checkpoint's
    tokenizer rewrites the config and generation config, with a warning."""
    import json
    from unittest import mock

    from transformers import AutoModelForCausalLM, AutoTokenizer, trainer_utils

    tok = AutoTokenizer.from_pretrained(causal_checkpoint)
    config = json.loads((causal_checkpoint / "config.json").read_text())
    generation = json.loads((causal_checkpoint / "generation_config.json").read_text())
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    assert ids == {"bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id}  # what training used
    assert {key: config.get(key) for key in ids} == ids
    assert {key: generation.get(key) for key in ids} == ids
    model = AutoModelForCausalLM.from_pretrained(causal_checkpoint, trust_remote_code=True)
    with mock.patch.object(trainer_utils.logger, "warning") as warned:
        trainer_utils.align_special_tokens(model, tok)  # what the Trainer does with processing_class=tok
    assert not warned.called, warned.call_args
    assert model.generation_config.eos_token_id == tok.eos_token_id


@pytest.mark.parametrize("problem, labels, loss", [
    ("multi_label_classification", torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
     lambda logits, labels: F.binary_cross_entropy_with_logits(logits, labels)),
    ("regression", torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, 0.0]]),
     lambda logits, labels: F.mse_loss(logits, labels)),
    ("single_label_classification", torch.tensor([2, 0]),
     lambda logits, labels: F.cross_entropy(logits, labels)),
    (None, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]),  # float multi-hot labels: multi-label, as transformers
     lambda logits, labels: F.binary_cross_entropy_with_logits(logits, labels)),
])
def test_problem_type_picks_transformers_loss(problem, labels, loss):
    model = build(CrammedForSequenceClassification, num_labels=3, problem_type=problem)
    ids, mask = batch(rows=2)
    out = model(ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(out.loss, loss(out.logits, labels))
    if problem == "multi_label_classification":  # zero logits: BCE's log 2, not a softmax's log 3
        with torch.no_grad():
            model.classifier.out_proj.weight.zero_(), model.classifier.out_proj.bias.zero_()
        assert model(ids, attention_mask=mask, labels=labels).loss.item() == pytest.approx(0.6931, abs=1e-4)


def test_gradient_checkpointing_enable_recomputes_and_gives_the_same_gradients():
    plain, checkpointed = build(CrammedForMaskedLM).train(), build(CrammedForMaskedLM).train()
    assert checkpointed.supports_gradient_checkpointing
    checkpointed.gradient_checkpointing_enable()
    assert all(block.gradient_checkpointing for block in checkpointed.encoder.layers)
    ids, _ = batch()
    calls = []
    checkpointed.encoder.layers[0].attn.register_forward_hook(lambda *a: calls.append(1))
    grads = []
    for model in (plain, checkpointed):
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert len(calls) == 2  # the block ran again in the backward pass
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [CrammedForMaskedLM, CrammedForCausalLM, CrammedForSequenceClassification])
def test_torch_export_takes_a_mask_and_dynamic_shapes(cls):
    model = build(cls, causal=cls is CrammedForCausalLM)
    ids, mask = batch()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=TINY["max_seq_length"])}
    program = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask},
                                  dynamic_shapes={"input_ids": dims, "attention_mask": dims}, strict=False)
    other, other_mask = batch(rows=5, seq=17)
    other_mask[3, 4:] = 0
    got = program.module()(input_ids=other, attention_mask=other_mask).logits
    torch.testing.assert_close(got, model(other, attention_mask=other_mask).logits, rtol=1e-5, atol=1e-5)


def test_each_objectives_checkpoint_lists_only_its_own_auto_classes():
    causal, masked = auto_map_of(build(CrammedForCausalLM, True)), auto_map_of(build(CrammedForMaskedLM))
    assert "AutoModelForCausalLM" in causal and "AutoModelForMaskedLM" not in causal
    assert "AutoModelForMaskedLM" in masked and "AutoModelForCausalLM" not in masked
    assert {"AutoConfig", "AutoModel", "AutoModelForSequenceClassification"} <= set(causal) & set(masked)


def test_a_classifier_saved_before_the_head_was_one_module_loads_the_same(tmp_path):
    """Its pooler was `pooler`, its output layer `classifier`: both read into ClassificationHead (renamed.HEAD_KEYS)."""
    from safetensors.torch import load_file, save_file

    model = build(CrammedForSequenceClassification, num_labels=2)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    old = {k.replace("classifier.dense.", "pooler.").replace("classifier.out_proj.", "classifier."): v
           for k, v in weights.items()}
    assert "pooler.weight" in old and "classifier.weight" in old
    save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids, mask = batch()
    loaded = CrammedForSequenceClassification.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits,
                               rtol=0, atol=0)
    again = build(CrammedForSequenceClassification, num_labels=2, seed=3)
    again.load_state_dict(old)  # a state dict under the old names, strictly
    torch.testing.assert_close(again(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_a_lora_adapter_reloads_with_the_trained_logits_head_included(tmp_path):
    """peft's defaults for a sequence classifier: target_modules "all-linear", modules_to_save (classifier, score)
    taking the whole head, pooler included, so a fresh base model gets back exactly what was trained."""
    peft = pytest.importorskip("peft")
    build(CrammedForMaskedLM).save_pretrained(tmp_path / "pretrained")

    def classifier(seed):  # the pretrained encoder, a new head drawn from `seed`
        torch.manual_seed(seed)
        return CrammedForSequenceClassification.from_pretrained(tmp_path / "pretrained", num_labels=2)

    base = classifier(0).train()
    assert "pooler" not in dict(base.named_children())  # the whole head is the module PEFT keeps, `classifier`
    model = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", target_modules="all-linear", r=4))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = batch()
    for _ in range(3):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.backward()
        optimizer.step(), optimizer.zero_grad()
    model.eval()
    trained = model(input_ids=ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path / "adapter")
    fresh = classifier(7)  # another draw of the new head
    assert not torch.equal(fresh.classifier.dense.weight, base.classifier.modules_to_save.default.dense.weight)
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).logits, trained, rtol=0, atol=0)


def test_fill_mask_refuses_a_causal_checkpoint_by_transformers_own_check(causal_checkpoint, smoke_checkpoint):
    """In a fresh interpreter, as a user meets it: transformers registers the classes of remote code it loads, so
    a process that loaded an MLM checkpoint's code before would see another registry (the order the suite's files
    run in must not decide this test)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        from transformers import pipeline
        try:
            pipeline("fill-mask", model={str(causal_checkpoint)!r}, trust_remote_code=True)
        except ValueError as err:
            assert "Unrecognized configuration class" in str(err), err
        else:
            raise SystemExit("fill-mask took a causal checkpoint")
        fill = pipeline("fill-mask", model={str(smoke_checkpoint)!r}, trust_remote_code=True)  # an MLM one fills
        assert len(fill(f"the {{fill.tokenizer.mask_token}} is")) == 5
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_after_an_mlm_checkpoint_a_causal_one_is_refused_as_a_masked_lm(causal_checkpoint, smoke_checkpoint):
    """Loading an MLM checkpoint registers our config class for masked LMs in that process: a causal checkpoint
    loaded next as one would get an untrained MLM head. CrammedForMaskedLM refuses a causal config in one line.
    A fresh interpreter, so the order the suite's files run in decides nothing."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        from transformers import AutoModelForMaskedLM, pipeline
        AutoModelForMaskedLM.from_pretrained({str(smoke_checkpoint)!r}, trust_remote_code=True)
        want = ("this checkpoint was trained with objective 'clm', whose attention is causal: it has no masked-LM "
                "head; load it with AutoModelForCausalLM")
        try:
            AutoModelForMaskedLM.from_pretrained({str(causal_checkpoint)!r}, trust_remote_code=True)
        except ValueError as err:
            assert str(err) == want, err
        else:
            raise SystemExit("AutoModelForMaskedLM took a causal checkpoint")
        try:
            pipeline("fill-mask", model={str(causal_checkpoint)!r}, trust_remote_code=True)
        except ValueError as err:
            assert want in str(err), err  # transformers' pipeline quotes the error of each class it tried
        else:
            raise SystemExit("fill-mask took a causal checkpoint")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
