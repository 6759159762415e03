"""arch.objective=rtd (ELECTRA): the generator's size, how it corrupts the input, what each loss trains, what
validation scores, the checkpoint fine-tuning loads, exact resume and a refusal from the command line (each
refusal: the table in tests/test_refusals.py)."""

import pytest
import torch
from conftest import needs_shared, one_line_error, run_pretrain
from safetensors.torch import load_file
from test_resume import NAN_RUN, TINY, config_for, sigterm_at, whole_and_resumed  # noqa: F401  (sigterm_at: a fixture)

from cramming import pretraining
from cramming.model import CrammedConfig
from cramming.model.electra import CrammedForReplacedTokenDetection, generator_config
from cramming.train.flops import block_flops, forward_flops_per_token
from cramming.train.objectives import OBJECTIVES, build_objective

VOCAB = 50


def tiny(**extra) -> CrammedForReplacedTokenDetection:
    torch.manual_seed(0)
    config = CrammedConfig(objective="rtd", hidden_size=32, num_heads=4, ffn_size=64, num_layers=2, vocab_size=VOCAB,
                           **extra)
    return CrammedForReplacedTokenDetection(config)


def masked_batch(rows: int = 3, length: int = 12, seed: int = 0) -> dict:
    objective = build_objective("rtd", config_for(*TINY).train,
                                {"special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
                                 "vocab_size": VOCAB}, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, length), generator=generator)
    return objective.batch(ids, generator) | {"original": ids}


def test_the_generator_is_the_discriminator_narrowed():
    config = CrammedConfig(objective="rtd", hidden_size=768, num_heads=12, ffn_size=3072, num_layers=16)
    g = generator_config(config)
    assert (g.hidden_size, g.num_heads, g.ffn_size, g.num_layers, g.objective) == (192, 3, 768, 16, "mlm")
    config.rtd.generator_scale, config.rtd.generator_layers = 0.5, 4
    g = generator_config(config)
    assert (g.hidden_size, g.num_heads, g.ffn_size, g.num_layers) == (384, 6, 1536, 4)
    assert g.hidden_size // g.num_heads == 64  # the head width stays
    model = tiny()
    assert model.generator.config.hidden_size == 8 and model.encoder.config.hidden_size == 32


def test_only_masked_positions_are_replaced_and_the_targets_say_which_changed():
    model, batch = tiny(), masked_batch()
    out = model(**{k: batch[k] for k in ("input_ids", "labels", "replace_draws")})
    masked = batch["labels"] != -100
    assert not out.replaced[~masked].any()
    # the discriminator's input: the sampled token where masked, the original elsewhere; replaced where it differs
    seen = {}
    model.discriminate = lambda ids, mask, documents=None: seen.setdefault("ids", ids).float() * 0
    model(**{k: batch[k] for k in ("input_ids", "labels", "replace_draws")})
    corrupted = seen["ids"]
    assert torch.equal(corrupted[~masked], batch["input_ids"][~masked])
    assert torch.equal(out.replaced, corrupted != batch["original"])
    assert out.replaced[masked].any()  # an untrained generator rarely guesses right


def test_a_right_guess_counts_as_original():
    """Where the generator samples the original token (even at a position masking left unchanged or made random),
    the target is 'original'; every other masked position is 'replaced'."""
    model, batch = tiny(), masked_batch()
    labels, original = batch["labels"], batch["original"]
    masked = labels.reshape(-1) != -100
    truth = original.reshape(-1)[masked]
    guess = torch.where(torch.arange(len(truth)) % 2 == 0, truth, (truth + 1 - 5) % (VOCAB - 5) + 5)
    model.generate_replacements = lambda *args: (torch.zeros(()), guess, masked)
    out = model(**{k: batch[k] for k in ("input_ids", "labels", "replace_draws")})
    assert torch.equal(out.replaced.reshape(-1)[masked], torch.arange(len(truth)) % 2 == 1)
    assert not out.replaced.reshape(-1)[~masked].any()


def test_sampling_follows_the_generators_distribution_and_the_draws():
    model, batch = tiny(), masked_batch(rows=1, length=12)
    labels = batch["labels"]
    _, first, _ = model.generate_replacements(batch["input_ids"], None, labels, batch["replace_draws"])
    _, again, _ = model.generate_replacements(batch["input_ids"], None, labels, batch["replace_draws"])
    _, other, _ = model.generate_replacements(batch["input_ids"], None, labels, 1 - batch["replace_draws"])
    assert torch.equal(first, again) and not torch.equal(first, other)
    # many draws at one position: the tokens' frequencies are the generator's softmax
    one = torch.zeros_like(labels).fill_(-100)
    one[0, 3] = labels.reshape(-1)[labels.reshape(-1) != -100][0]
    ids = batch["input_ids"].expand(4000, -1)
    draws = torch.rand(4000, 12, generator=torch.Generator().manual_seed(1))
    _, sampled, _ = model.generate_replacements(ids, None, one.expand(4000, -1), draws)
    with torch.no_grad():
        hidden = model.generator.encoder(batch["input_ids"]).last_hidden_state[0, 3]
        probs = torch.softmax(model.generator.decoder(model.generator.transform(hidden)), -1)
    frequencies = torch.bincount(sampled, minlength=VOCAB) / 4000
    assert (frequencies - probs).abs().max() < 0.03


@pytest.mark.parametrize("tie", [True, False])
def test_the_detection_loss_trains_the_discriminator_only(tie):
    """The generator's gradient is its MLM loss's whatever arch.rtd.weight is; the discriminator's is weight x.
    Shared embeddings get both: the generator's part plus weight x the detection's."""
    grads = {}
    for weight in (0.0, 1.0, 10.0):
        model, batch = tiny(rtd={"weight": weight, "tie_embeddings": tie}), masked_batch()
        model(**{k: batch[k] for k in ("input_ids", "labels", "replace_draws")}).loss.backward()
        grads[weight] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    shared = [n for n in grads[1.0] if n.startswith(("encoder.tokens.", "encoder.positions.", "encoder.embedding_norm."))
              ] if tie else []
    generator = [n for n in grads[1.0] if n.startswith("generator.")]
    discriminator = [n for n in grads[1.0] if n.startswith(("encoder.", "detector.")) and n not in shared]
    assert generator and discriminator and all(n in grads[1.0] for n in shared)
    for name in generator:
        torch.testing.assert_close(grads[10.0][name], grads[1.0][name])
    for name in discriminator:
        torch.testing.assert_close(grads[10.0][name], 10 * grads[1.0][name], rtol=1e-4, atol=1e-7)
    for name in shared:
        assert grads[0.0][name].abs().sum() > 0  # the generator's loss alone reaches the shared embeddings
        torch.testing.assert_close(grads[10.0][name] - grads[0.0][name], 10 * (grads[1.0][name] - grads[0.0][name]),
                                   rtol=1e-3, atol=1e-6)


def test_the_generator_shares_the_discriminators_embeddings_by_default():
    """google-research/electra, configure_pretraining.py: `untied_generator_embeddings = False  # tie
    generator/discriminator`; modeling.py puts the embedding lookup, position embeddings and their layer norm in
    the "electra/embeddings" scope for both models, at the discriminator's width, and a narrower model adds
    `dense(embedding_output, hidden_size, name="embeddings_project")`; run_pretraining.get_token_logits maps the
    generator's output back to the embedding table's width (dense, activation, layer_norm) and multiplies by the
    table. So the generator's logits are norm(act(W h)) E^T with E the discriminator's token matrix."""
    model, batch = tiny(bias=True), masked_batch()
    generator, encoder = model.generator, model.encoder
    assert generator.encoder.tokens is encoder.tokens and generator.encoder.positions is encoder.positions
    assert generator.encoder.embedding_norm is encoder.embedding_norm
    assert generator.decoder.weight is encoder.tokens.weight and encoder.tokens.weight.shape == (VOCAB, 32)
    project = generator.encoder.embedding_project
    assert (project.in_features, project.out_features) == (32, 8)
    ids = batch["input_ids"]
    with torch.no_grad():
        embedded = encoder.embedding_norm(encoder.tokens(ids) + encoder.positions(ids.shape[1], 0))
        manual = generator.encoder.layers[0](project(embedded))  # the generator's first block
        hooked = {}
        generator.encoder.layers[0].register_forward_hook(lambda m, i, o: hooked.setdefault("out", o))
        hidden = generator.encoder(ids).last_hidden_state
        torch.testing.assert_close(hooked["out"], manual)
        dense, act, norm = generator.transform
        assert (dense.in_features, dense.out_features) == (8, 32)
        logits = model.generator(ids).logits
        torch.testing.assert_close(logits, norm(act(dense(hidden))) @ encoder.tokens.weight.T + generator.decoder.bias)
    # one matrix under two names: the optimizer sees it once
    names = [n for n, _ in model.named_parameters(remove_duplicate=False) if n.endswith("tokens.weight")]
    assert names == ["encoder.tokens.weight", "generator.encoder.tokens.weight"]
    assert sum(p is encoder.tokens.weight for p in model.parameters()) == 1


def test_untied_embeddings_are_the_generators_own():
    model = tiny(rtd={"tie_embeddings": False})
    generator = model.generator
    assert generator.encoder.tokens is not model.encoder.tokens and generator.encoder.tokens.weight.shape == (VOCAB, 8)
    assert generator.decoder.weight is generator.encoder.tokens.weight  # tied within the generator
    assert isinstance(generator.encoder.embedding_project, torch.nn.Identity)


@pytest.mark.parametrize("tie", [True, False])
def test_a_saved_model_loads_with_its_ties(tmp_path, tie):
    model = tiny(bias=True, rtd={"tie_embeddings": tie})
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert ("generator.encoder.tokens.weight" in saved) != tie and "encoder.tokens.weight" in saved
    loaded = CrammedForReplacedTokenDetection.from_pretrained(tmp_path)
    assert (loaded.generator.encoder.tokens is loaded.encoder.tokens) == tie
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_config_saved_before_the_option_reads_as_untied(tmp_path):
    """Checkpoints written before arch.rtd.tie_embeddings existed have generators with embeddings of their own."""
    import json

    tiny(rtd={"tie_embeddings": False}).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rtd"]["tie_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = CrammedForReplacedTokenDetection.from_pretrained(tmp_path)
    assert loaded.config.rtd.tie_embeddings is False and loaded.generator.encoder.tokens.weight.shape == (VOCAB, 8)
    assert CrammedConfig(objective="rtd").rtd.tie_embeddings is True  # a new model ties


def test_the_loss_is_mlm_plus_weighted_detection():
    model, batch = tiny(rtd={"weight": 7.0}), masked_batch()
    out = model(**{k: batch[k] for k in ("input_ids", "labels", "replace_draws")})
    torch.testing.assert_close(out.loss.detach(), out.generator_loss + 7.0 * out.detection_loss)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits.float(), out.replaced.float())
    torch.testing.assert_close(out.detection_loss, expected.detach())


def test_validation_scores_the_detection():
    model, batch = tiny(), masked_batch()
    inputs = {k: batch[k] for k in ("input_ids", "labels", "replace_draws")}
    out = model(**inputs)
    predicted, targets = OBJECTIVES["rtd"].scored(out, inputs)
    assert predicted.shape == targets.shape == (batch["input_ids"].numel(),)
    assert torch.equal(predicted, (out.logits > 0).reshape(-1)) and torch.equal(targets, out.replaced.reshape(-1))


def test_the_objective_draws_masks_then_replacements_from_the_position():
    first, again, other = masked_batch(seed=5), masked_batch(seed=5), masked_batch(seed=6)
    assert all(torch.equal(first[k], again[k]) for k in first if torch.is_tensor(first[k]))
    assert not torch.equal(first["replace_draws"], other["replace_draws"])
    mlm = OBJECTIVES["mlm"](0.25, 0.8, 4, VOCAB, torch.tensor([0, 1, 2, 3, 4]))
    generator = torch.Generator().manual_seed(5)
    torch.randint(5, VOCAB, first["original"].shape, generator=generator)  # as masked_batch drew the ids
    plain = mlm.batch(first["original"], generator)  # the same masks as MLM's
    assert torch.equal(plain["labels"], first["labels"]) and torch.equal(plain["input_ids"], first["input_ids"])


def test_flops_count_the_detector_and_the_generator():
    model = tiny()
    discriminator = sum(block_flops(block, 12) for block in model.encoder.layers)
    detector = 2 * 32 * 32 + 2 * 32
    assert forward_flops_per_token(model, 12, 0.25) == int(
        discriminator + detector + forward_flops_per_token(model.generator, 12, 0.25))
    generator = sum(block_flops(block, 12) for block in model.generator.encoder.layers)
    project, transform, head = 2 * 32 * 8, 2 * 8 * 32 * 0.25, 2 * 32 * VOCAB * 0.25  # tied: to and from width 32
    assert forward_flops_per_token(model.generator, 12, 0.25) == int(generator + project + transform + head)


def test_a_checkpoint_fine_tunes_the_discriminator(tmp_path):
    """The saved folder loads as AutoModelForPreTraining (the whole ELECTRA) and as a classifier whose encoder is
    the discriminator's; an MLM checkpoint's config names no pretraining head."""
    from transformers import AutoModelForPreTraining, AutoModelForSequenceClassification

    summary = pretraining.pretrain(config_for(*NAN_RUN, "arch.objective=rtd", "train.max_steps=2"), tmp_path / "rtd")
    folder = tmp_path / "rtd" / "checkpoint"
    assert summary["val_accuracy"] > 0 and summary["checkpoint"] == str(folder.resolve())
    whole = AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True)
    assert type(whole).__name__ == "CrammedForReplacedTokenDetection"
    classifier = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=2)
    weights = load_file(folder / "model.safetensors")
    for name, tensor in classifier.encoder.state_dict().items():
        assert torch.equal(tensor, weights[f"encoder.{name}"]), name
    assert any(name.startswith("generator.") for name in weights)
    import json
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForPreTraining"] == \
        "electra.CrammedForReplacedTokenDetection"
    with pytest.raises(ValueError, match="objective 'mlm', not rtd"):
        CrammedForReplacedTokenDetection(CrammedConfig(objective="mlm"))


def test_resuming_is_bitwise_identical(sigterm_at, tmp_path):  # noqa: F811
    """The replacements come from the data position, so a stop at step 2 of 6 and a resume give the uninterrupted
    run's weights exactly (generator and discriminator)."""
    whole_and_resumed([*NAN_RUN, "arch.objective=rtd", "train.checkpoint_every_minutes=null"], sigterm_at, tmp_path)
    want, got = (load_file(tmp_path / d / "checkpoint" / "model.safetensors") for d in ("whole", "stopped"))
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_the_cli_trains_rtd_and_refuses_bad_values(tmp_path):
    bad = run_pretrain(*TINY, "arch.objective=rtd", "arch.rtd.weight=-1", run_dir=tmp_path / "bad", in_process=True)
    one_line_error(bad, "arch.rtd.weight=-1.0 is invalid")
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()
    good = run_pretrain(*NAN_RUN, "arch.objective=rtd", "train.max_steps=3", run_dir=tmp_path / "good",
                        in_process=True)
    assert good.returncode == 0, good.stderr[-2000:]
    assert (tmp_path / "good" / "checkpoint" / "model.safetensors").is_file()


def test_the_preset_pretrains_both_arms_and_fine_tunes_them(tmp_path):
    """`+experiment=electra` at smoke scale: an mlm and an rtd job, each checkpointed and evaluated on GLUE."""
    import json

    from conftest import run_pretrain
    from test_experiments import SMOKE

    glue = needs_shared("glue")
    evals = f'eval_overrides=["eval.tasks=[rte]","eval.max_train_examples=32","eval.data_dir={glue}",' \
            '"eval.recipe.epochs=1","eval.recipe.batch_size=16","impl=cpu"]'
    result = run_pretrain("-m", "+experiment=electra", *SMOKE, evals, f"hydra.sweep.dir={tmp_path}", in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for job, objective in (("0_mlm", "mlm"), ("1_rtd", "rtd")):
        summary = json.loads((tmp_path / job / "checkpoint" / "train_summary.json").read_text())
        assert summary["config"]["arch"]["objective"] == objective and summary["steps"] == 1
        results = json.loads((tmp_path / job / "eval" / "results.json").read_text())
        assert "rte" in json.dumps(results).lower()
