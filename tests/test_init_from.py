"""train.init_from: a new run from the weights of our checkpoints or of a Hugging Face BertForMaskedLM. The
validation loss before the new run's first step is the source's final one, printed as the init_from weights' (the
word untrained is kept for fresh runs; a resumed run's is from before its first step); BERT's weights, mapped, give
BERT's logits; anything that does not fit is one line naming the first tensor (or option) that does not."""

import json
from types import SimpleNamespace

import pytest
import torch
from test_resume import NAN_RUN, TINY, config_for, sigterm_at  # noqa: F401 (a fixture, by name)
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

from cramming import impl as impl_
from cramming import pretraining
from cramming.errors import RunStopped, UserError
from cramming.run import build_model
from cramming.train.init_from import load_source, open_source

TINY_BERT = ["arch=bert-base", "arch.num_layers=2", "arch.hidden_size=32", "arch.num_heads=2", "arch.ffn_size=64",
             "arch.max_seq_length=64"]


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("source")
    summary = pretraining.pretrain(config_for(*NAN_RUN, "name=source", "train.checkpoint_every_minutes=0.0001"), run_dir)
    return run_dir, summary


def test_a_run_from_our_checkpoint_starts_at_its_final_validation_loss(source_run, tmp_path, capsys):
    run_dir, source = source_run
    again = pretraining.pretrain(config_for(*NAN_RUN, "name=continued", f"train.init_from={run_dir / 'checkpoint'}",
                                            "train.max_steps=2"), tmp_path)
    assert again["untrained_val_loss"] == pytest.approx(source["val_loss"], abs=1e-5)
    assert again["steps"] == 2 and again["init_from"] == str(run_dir / "checkpoint")
    out = capsys.readouterr().out
    assert "init_from: the weights of" in out
    start = f"{again['untrained_val_loss']:.4f}"  # the loaded weights' loss: not called untrained
    assert f"\nvalidation loss of the init_from weights {start}\n" in out and "untrained" not in out
    assert f"validation loss {again['val_loss']:.4f} (init_from weights {start}), " in out


def test_a_resumed_run_names_its_first_loss_as_from_before_the_first_step(request, tmp_path, capsys):
    """The value is carried over from the first launch; the resumed weights are not untrained."""
    stop_at = request.getfixturevalue("sigterm_at")  # test_resume's: SIGTERM during the given training step
    run = [*NAN_RUN, "train.checkpoint_every_minutes=null"]
    stop_at.append(3)
    with pytest.raises(RunStopped):
        pretraining.pretrain(config_for(*run), tmp_path)
    first = capsys.readouterr().out
    stop_at.clear()
    resumed = pretraining.pretrain(config_for(*run), tmp_path)
    out = capsys.readouterr().out
    start = f"{resumed['untrained_val_loss']:.4f}"
    assert f"untrained validation loss {start}\n" in first  # the first launch: fresh weights
    assert "resuming from" in out and "untrained" not in out
    assert f"\nvalidation loss before the run's first step {start} (measured then, carried over by the resume)\n" in out
    assert f"validation loss {resumed['val_loss']:.4f} (before the first step {start}), " in out


def test_each_start_is_named_for_what_it_is():
    fresh, init_from = (SimpleNamespace(train=SimpleNamespace(init_from=source)) for source in (None, "/ckpt"))
    assert pretraining.start_names(fresh, resumed=False, carried=False) == ("untrained validation loss {loss}",
                                                                           "untrained")
    assert pretraining.start_names(init_from, resumed=False, carried=False)[1] == "init_from weights"
    line, short = pretraining.start_names(init_from, resumed=True, carried=True)
    assert short == "init_from weights" and "carried over by the resume" in line
    assert pretraining.start_names(fresh, resumed=True, carried=True)[1] == "before the first step"
    line, short = pretraining.start_names(fresh, resumed=True, carried=False)  # a checkpoint that kept no value
    assert short == "resumed weights" and line.startswith("validation loss of the resumed weights")


def test_a_run_from_an_intermediate_checkpoint_starts_at_its_weights(source_run, tmp_path):
    run_dir, _ = source_run
    step = max((run_dir / "checkpoints").glob("step-*"))
    assert (step / "tokenizer" / "tokenizer.json").is_file()  # every step folder carries the run's tokenizer
    saved = torch.load(step / "state.pt", weights_only=False)["model"]
    config = config_for(*NAN_RUN, f"train.init_from={step}")
    source = open_source(str(step))
    model = build_model(config.arch, len(source.tokenizer), {"pad": 0, "cls": 2, "sep": 3, "mask": 4},
                                    impl_.resolve(config.impl, config.arch))
    load_source(model, source, str(step), config.arch)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())


def test_a_different_arch_is_one_line_naming_the_first_tensor(source_run):
    run_dir, _ = source_run
    with pytest.raises(UserError, match=r"train.init_from=.*its tensor encoder.embedding_norm.weight is \(64,\), "
                                        r"this run's encoder.embedding_norm.weight is \(128,\)"):
        pretraining.pretrain(config_for(*NAN_RUN, "arch.hidden_size=128", f"train.init_from={run_dir / 'checkpoint'}"),
                             run_dir / "other")
    with pytest.raises(UserError, match=r"the source has arch.norm_position='pre', this run 'post'"):
        pretraining.pretrain(config_for(*NAN_RUN, "arch.norm_position=post",
                                        f"train.init_from={run_dir / 'checkpoint'}"), run_dir / "other")


def tiny_bert(folder, vocab_words):
    """A BertForMaskedLM with tiny sizes and a WordPiece vocabulary, saved as Hugging Face would."""
    torch.manual_seed(0)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *vocab_words]
    folder.mkdir(parents=True, exist_ok=True)
    BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)}).save_pretrained(folder)
    bert = BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64))
    with torch.no_grad():  # make every tensor matter: sharp attention, random biases, norms and token-type rows
        for name, p in bert.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.normal_(1.0, 0.1)
            elif "self.query" in name or "self.key" in name or "self.value" in name:
                p.normal_(0.0, 0.5)
            elif name.endswith("bias") or "token_type" in name or "LayerNorm" in name:
                p.normal_(0.0, 0.3)
    bert.save_pretrained(folder)
    return bert.eval()


def test_bert_weights_give_berts_logits(tmp_path):
    bert = tiny_bert(tmp_path / "bert", [f"w{i}" for i in range(59)])
    config = config_for(*TINY, *TINY_BERT)
    source = open_source(str(tmp_path / "bert"))
    model = build_model(config.arch, 64, {"pad": 0, "cls": 2, "sep": 3, "mask": 4},
                                    impl_.resolve(config.impl, config.arch)).eval()
    load_source(model, source, str(tmp_path / "bert"), config.arch)
    ids = torch.randint(5, 64, (3, 40))
    ids[:, 0] = 2
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    with torch.no_grad():
        theirs = bert(input_ids=ids, attention_mask=mask).logits
        ours = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-4), (ours[keep] - theirs[keep]).abs().max()


def test_a_bert_source_refuses_a_crammed_layout_naming_the_first_tensor(tmp_path):
    tiny_bert(tmp_path / "bert", [f"w{i}" for i in range(59)])
    config = config_for(*TINY, "arch.num_layers=2", "arch.hidden_size=32")
    source = open_source(str(tmp_path / "bert"))
    model = build_model(config.arch, 64, {"pad": 0, "cls": 2, "sep": 3, "mask": 4},
                                    impl_.resolve(config.impl, config.arch))
    with pytest.raises(UserError, match=r"its tensor bert.embeddings.position_embeddings.weight has no place in "
                                        r"this run's model .*arch=bert-base"):
        load_source(model, source, str(tmp_path / "bert"), config.arch)
    post = config_for(*TINY, *TINY_BERT, "arch.num_heads=4")
    model = build_model(post.arch, 64, {"pad": 0, "cls": 2, "sep": 3, "mask": 4},
                                    impl_.resolve(post.impl, post.arch))
    with pytest.raises(UserError, match=r"the source has arch.num_heads=2, this run 4"):
        load_source(model, source, str(tmp_path / "bert"), post.arch)


def test_a_run_from_bert_reads_its_text_with_berts_tokenizer(tmp_path):
    words = sorted({w.lower() for w in ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "cat", ".", "a", "of", "to", "in",
                             "is"]})
    tiny_bert(tmp_path / "bert", words + [f"w{i}" for i in range(64 - 5 - len(words))])
    summary = pretraining.pretrain(config_for(*NAN_RUN, *TINY_BERT, "train.max_steps=1",
                                              f"train.init_from={tmp_path / 'bert'}"), tmp_path / "run")
    assert summary["data"]["vocab_size"] == 64
    saved = json.loads((tmp_path / "run" / "checkpoint" / "tokenizer.json").read_text())["model"]["vocab"]
    assert list(saved)[:7] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words[:2]]


def test_an_unknown_folder_or_an_unreachable_hub_id_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"train.init_from='nobody/no-such-model'.*hub is unreachable \(HF_HUB_OFFLINE=1"):
        pretraining.pretrain(config_for(*NAN_RUN, "train.init_from=nobody/no-such-model"), tmp_path)
    with pytest.raises(UserError, match=r"not a model folder \(no config.json\)"):
        pretraining.pretrain(config_for(*NAN_RUN, f"train.init_from={tmp_path}"), tmp_path / "run")
