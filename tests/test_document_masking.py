"""data.document_masking: the documents packed into one row are kept apart. No token attends to another document's
tokens, and positions restart at each document, so every document of a packed row is computed as if it were the
row's only content (ModernBERT's unpadding, the speedruns' per-document masks). The rule is tested as that property,
for every position scheme, attention pattern, kernel and objective, and in the gMLP block's spatial mixing."""

import pytest
import torch

from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM
from cramming.model.attention import ATTENTION_KERNELS, attention_kernel, kernel_problem
from cramming.model.context import document_positions
from cramming.model.patterns import PATTERNS
from cramming.model.positions import POSITIONS
from cramming.train.objectives import build_objective, documents_of

SEP = 3
TINY = dict(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, ffn_size=64, max_seq_length=32, init_std=0.2,
            rpe_buckets=8, rpe_max_distance=16, rotary_pct=0.5, attention_window=3, attention_topk=3)
LENGTHS = (7, 5, 9)  # documents of a 21-token row, each closed by SEP (stepped blocks of 3 do not align with them)


def tiny(objective: str, position: str, pattern: str = "global", kernel: str = "sdpa", **overrides):
    options = dict(TINY, objective=objective, position=position, attention_pattern=[pattern], **overrides)
    if kernel_problem(ATTENTION_KERNELS[kernel], CrammedConfig(**options), documents=True) is not None:
        kernel = "eager"  # top-k keeps each query's largest scores, which only the eager kernel holds
    torch.manual_seed(0)
    head = CrammedForCausalLM if objective == "clm" else CrammedForMaskedLM
    return head(CrammedConfig(**options, attention_impl=kernel)).eval()


def documents(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(5, 97, (n - 1,), generator=g), torch.tensor([SEP])]) for n in LENGTHS]


def logits(model, row: torch.Tensor, apart: bool = True) -> torch.Tensor:
    extra = documents_of(row[None], SEP) if apart else {}
    with torch.no_grad():
        return model(row[None], **extra).logits[0]


def spans():
    starts = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]
    return [slice(s, s + n) for s, n in zip(starts, LENGTHS)]


def assert_each_document_as_alone(model):
    """Each document's logits inside the packed row equal its logits as a row of its own."""
    docs = documents()
    packed = logits(model, torch.cat(docs))
    for span, doc in zip(spans(), docs):
        torch.testing.assert_close(packed[span], logits(model, doc, apart=False), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("position", sorted(POSITIONS))
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_a_packed_document_is_computed_as_if_alone(objective, position):
    """Every position scheme: tables and rotary read the restarted positions, biases count in-document distances."""
    assert_each_document_as_alone(tiny(objective, position))


@pytest.mark.parametrize("pattern", sorted(set(PATTERNS) - {"global"}))
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_every_attention_pattern_keeps_documents_apart(objective, pattern):
    """Windows count in-document distances; stepped blocks start at each document's first token."""
    assert_each_document_as_alone(tiny(objective, "rotary", pattern))


@pytest.mark.slow
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("position", sorted(POSITIONS))
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_every_position_scheme_with_every_pattern(objective, position, pattern):
    assert_each_document_as_alone(tiny(objective, position, pattern))


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_changing_one_document_leaves_every_other_documents_logits_unchanged(kernel):
    """The issue's check, on both CPU kernels; without document masking the same change reaches the others."""
    model = tiny("mlm", "rotary", kernel=kernel)
    docs = documents()
    changed = [docs[0], torch.cat([torch.randint(5, 97, (LENGTHS[1] - 1,)), torch.tensor([SEP])]), docs[2]]
    first, second = spans()[0], spans()[2]
    for apart in (True, False):
        before, after = logits(model, torch.cat(docs), apart), logits(model, torch.cat(changed), apart)
        same = torch.allclose(before[first], after[first], atol=1e-5) and torch.allclose(before[second],
                                                                                         after[second], atol=1e-5)
        assert same == apart


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_gmlp_blocks_mix_each_document_only_within_itself(objective):
    """The spatial gate's weights between two documents are zeroed, and each document reads its own rows."""
    assert_each_document_as_alone(tiny(objective, "learned", layout=["gmlp", "attention"], gmlp_attn_dim=8))


def test_positions_restart_at_each_document():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 1, 2, 3, 3, 3, 3, 3, 4]])
    assert document_positions(ids).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 0, 0, 0, 1, 2, 3, 4, 0]]


def test_a_separator_closes_its_document_even_when_masked():
    """Document ids come from the unmasked row: the separator belongs to the document it ends."""
    ids = torch.tensor([[2, 8, 9, SEP, 10, SEP, 11, 12]])
    assert documents_of(ids, SEP)["document_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 2, 2]]
    assert documents_of(ids, None) == {}


@pytest.mark.parametrize("objective", ["mlm", "clm", "rtd"])
def test_every_objective_hands_the_model_document_ids_only_when_asked(objective):
    from test_resume import config_for

    config = config_for("arch=crammed-bert-tiny", "train=cpu-smoke")
    meta = {"special_ids": {"pad": 0, "cls": 2, "sep": SEP, "mask": 4}, "vocab_size": 97}
    ids = torch.tensor([[2, 8, 9, SEP, 10, 11, SEP, 12]])
    generator = torch.Generator().manual_seed(0)
    on = build_objective(objective, config.train, meta, torch.device("cpu"), documents=True).batch(ids, generator)
    off = build_objective(objective, config.train, meta, torch.device("cpu")).batch(ids, generator)
    assert on["document_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 2]]
    assert "document_ids" not in off


def test_a_kernel_without_document_masking_is_refused():
    from cramming import impl
    from cramming.errors import UserError

    @attention_kernel("no-documents", serves=set())
    def plain(q, k, v, spec):
        raise AssertionError("never called")

    try:
        config = CrammedConfig(**TINY)
        assert kernel_problem(plain, config) is None
        assert "document masking (data.document_masking=true)" in kernel_problem(plain, config, documents=True)
        with pytest.raises(UserError, match="impl.attention=no-documents cannot serve this run: it has no document"):
            impl.resolve_kernels("no-documents", "torch", config, torch.device("cpu"), documents=True)
    finally:
        ATTENTION_KERNELS.pop("no-documents")  # registered by the decorator: leave the registry as it was


def test_generating_with_document_ids_is_refused():
    model = tiny("clm", "rotary")
    row = torch.cat(documents())[None]
    with pytest.raises(ValueError, match="not for generating with a KV cache"):
        model(row, use_cache=True, **documents_of(row, SEP))


def test_training_passes_the_gradient_only_within_documents():
    """Backward too: the loss of one document gives no gradient to another document's input embeddings."""
    model = tiny("clm", "rotary").train()
    row = torch.cat(documents())[None]
    embeddings = model.encoder.tokens(row).detach().requires_grad_(True)
    model.encoder.tokens = torch.nn.Identity()  # feed the embeddings themselves, to read their gradient
    labels = torch.full_like(row, -100)  # the next-token targets within the last document only: position t
    last = spans()[2]  # predicts labels[t + 1], so the document's first token is no target (the one before would be)
    labels[0, last.start + 1:last.stop] = row[0, last.start + 1:last.stop]
    model(embeddings, labels=labels, **documents_of(row, SEP)).loss.backward()
    grad = embeddings.grad[0].abs().sum(-1)
    assert grad[spans()[0]].max() == 0 and grad[spans()[1]].max() == 0
    assert grad[spans()[2]][:-1].min() > 0  # its closing separator predicts nothing and no earlier token reads it


@pytest.mark.slow
def test_the_option_reaches_the_model_from_the_command_line(tmp_path):
    """Two three-step runs from one seed on the same rows (sanity documents span 50-300 words, so many rows hold a
    boundary): the weights differ only if the document ids reached the attention; a bad value is one line."""
    from conftest import one_line_error, run_pretrain
    from safetensors.torch import load_file

    weights = {}
    for on in ("true", "false"):
        result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity",
                              "train.max_steps=3", f"data.document_masking={on}", "name=docs",
                              run_dir=tmp_path / on, in_process=True)
        assert result.returncode == 0, result.stderr[-3000:]
        weights[on] = load_file(tmp_path / on / "checkpoint" / "model.safetensors")
    assert any(not torch.equal(weights["true"][k], weights["false"][k]) for k in weights["true"])
    one_line_error(run_pretrain("data.document_masking=sometimes", run_dir=tmp_path / "bad", in_process=True),
                   "data.document_masking")
