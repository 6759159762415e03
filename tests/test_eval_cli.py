"""`python eval.py` end to end: GLUE subsets, the user's own task, lookup by run name, and bad input."""

import csv
import json
import shutil
import statistics

import pytest
from conftest import REPO, last_line_path, needs_shared, one_line_error, run_eval

from cramming.errors import UserError

FAST = ["impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=16"]
MIN_PRETRAIN_STEPS = 20  # below this the real pretraining fixture (a busy machine) has taught nothing measurable


def evaluate_in_process(*overrides, tmp_path):
    """The same config path as eval.py, without a new interpreter: for the many bad-input cases."""
    from hydra import compose, initialize_config_dir

    from cramming.eval.recipe import evaluate
    from cramming.validation.eval import load_eval_config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="eval", overrides=[*overrides, f"eval.results_table={tmp_path}/results.csv"])
    return evaluate(load_eval_config(cfg), tmp_path / "eval")


def test_glue_subset_end_to_end(real_pretrain_run, tmp_path):
    glue = needs_shared("glue")
    run_dir, _ = real_pretrain_run
    result = run_eval(f"checkpoint={run_dir / 'checkpoint'}", f"eval.data_dir={glue}", "eval.tasks=[sst2,stsb]",
                      "eval.seeds=2", "eval.max_train_examples=300", *FAST, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    path = last_line_path(result, "results: ")
    results = json.loads(path.read_text())
    assert results["complete"] is True and results["comparable"] is False
    assert results["not_comparable_because"]["max_train_examples"] == 300
    assert len(results["checkpoint_sha256"]) == 64
    pretrained = results["models"]["pretrained"]
    for task, metric in (("sst2", "accuracy"), ("stsb", "pearson")):
        entry = pretrained["tasks"][task]
        assert entry["main_metric"] == metric and entry["train_examples"] == 300
        assert len(entry["runs"]) == 2 and len(entry["runs"][0]["curve"]) == 1
        stats = entry["summary"]["dev"]
        per_seed = [run["final"]["dev"][metric] for run in entry["runs"]]
        assert stats["values"] == per_seed and stats["median"] == statistics.median(per_seed)
        assert (stats["min"], stats["max"]) == (min(per_seed), max(per_seed))
    assert set(pretrained["scores"]) == {"sst2", "stsb"}
    assert set(pretrained["glue"]["tasks_counted"]) == {"sst2", "stsb"}
    assert "| model | SST-2 | STS-B | avg |" in result.stdout and "not comparable" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 1 and rows[0]["model"] == "pretrained" and float(rows[0]["sst2"]) > 0


def test_pretrained_beats_the_majority_class_on_sst2(real_pretrain_run, tmp_path):
    """Fine-tuning from a minute-old checkpoint learns SST-2, and the random-init twin really is another model.
    Same fine-tuning budget for both (1,500 SST-2 examples, 3 epochs, seed 0, lr 2e-4: a tiny model at Cramming's
    4e-5 often stays on one class for this few steps). The pretrained model must beat the dev set's majority-class
    rate (computed here from the file), which a model stuck on one class scores, by two points; the twin must
    differ from it (see also test_eval_checks). What pretraining buys over the twin at a real budget is the record
    run's question, not a one-minute test's. On a machine busy with other work the minute may give only a few
    optimizer steps: then there is nothing to measure, and the test skips saying so."""
    glue = needs_shared("glue")
    run_dir, _ = real_pretrain_run
    result = run_eval(f"checkpoint={run_dir / 'checkpoint'}", f"eval.data_dir={glue}", "eval.tasks=[sst2]",
                      "eval.max_train_examples=1500", "eval.baseline=random-init", "impl=cpu",
                      "eval.recipe.epochs=3", "eval.recipe.lr=2e-4", tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| random-init |" in result.stdout
    results = json.loads(last_line_path(result, "results: ").read_text())
    curves = [results["models"][m]["tasks"]["sst2"]["runs"][0]["curve"] for m in ("pretrained", "random-init")]
    assert curves[0][0]["train_loss"] != curves[1][0]["train_loss"], curves
    steps = json.loads((run_dir / "checkpoint" / "train_summary.json").read_text())["steps"]
    if steps < MIN_PRETRAIN_STEPS:
        pytest.skip(f"the pretraining fixture got {steps} optimizer steps in its minute (a busy machine), fewer "
                    f"than the {MIN_PRETRAIN_STEPS} this test needs")
    pretrained = results["models"]["pretrained"]["scores"]["sst2"]
    baseline = results["models"]["random-init"]["scores"]["sst2"]
    labels = [line.rsplit("\t", 1)[1] for line in (glue / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    majority = 100 * max(labels.count("0"), labels.count("1")) / len(labels)
    print(f"SST-2 accuracy: pretrained {pretrained:.2f}, random-init {baseline:.2f}, majority class {majority:.2f}")
    assert pretrained > majority + 2, (pretrained, majority)


def test_custom_task_csv_and_lookup_by_name(smoke_checkpoint, tmp_path):
    rows = [("a fine and lovely film", "pos"), ("dull and far too long", "neg")] * 20
    for name, part in (("train.csv", rows), ("dev.csv", rows[:10])):
        with open(tmp_path / name, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["review", "sentiment"])
            writer.writerows(part)
    runs = tmp_path / "runs"
    shutil.copytree(smoke_checkpoint, runs / "mine" / "2026-01-01_00-00-00" / "checkpoint")
    result = run_eval("name=mine", f"runs_dir={runs}", "eval=custom", f"eval.train_file={tmp_path}/train.csv",
                      f"eval.dev_file={tmp_path}/dev.csv", "eval.text_fields=[review]", "eval.label_field=sentiment",
                      "eval.seeds=3", *FAST, tmp_path=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    task = results["models"]["pretrained"]["tasks"]["custom"]
    per_seed = [run["final"]["dev"]["accuracy"] for run in task["runs"]]
    assert task["main_metric"] == "accuracy" and task["summary"]["dev"]["median"] == statistics.median(per_seed)
    assert len(per_seed) == 3 and all(round(a / 10, 9).is_integer() for a in per_seed)  # 10 dev rows
    assert results["checkpoint"].endswith("mine/2026-01-01_00-00-00/checkpoint")
    assert "| model | custom | avg |" in result.stdout


def test_custom_regression_is_inferred(smoke_checkpoint, tmp_path):
    lines = ["text\tscore"] + [f"sentence number {i}\t{(i % 9) / 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    result = run_eval(f"checkpoint={smoke_checkpoint}", "eval=custom", f"eval.train_file={tmp_path}/train.tsv",
                      f"eval.dev_file={tmp_path}/train.tsv", "eval.label_field=score", *FAST, tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    assert results["models"]["pretrained"]["tasks"]["custom"]["main_metric"] == "pearson"


def test_any_hugging_face_encoder_folder(smoke_checkpoint, tmp_path):
    """A plain BERT checkpoint (not ours) evaluates the same way."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(smoke_checkpoint, trust_remote_code=True)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=128)).save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    rows = ["text,label"] + [f"example {i},{i % 2}" for i in range(30)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    result = run_eval(f"checkpoint={tmp_path / 'bert'}", "eval=custom", f"eval.train_file={tmp_path}/t.csv",
                      f"eval.dev_file={tmp_path}/t.csv", *FAST, tmp_path=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(last_line_path(result, "results: ").read_text())["model_type"] == "bert"


def test_bad_checkpoints(smoke_checkpoint, tmp_path):
    # through the CLI once: the exit code and the single error line
    one_line_error(run_eval(f"checkpoint={tmp_path}/nothing", *FAST, tmp_path=tmp_path, in_process=True), "no such folder")
    broken = tmp_path / "broken"
    shutil.copytree(smoke_checkpoint, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(UserError, match="has no weights"):
        evaluate_in_process(f"checkpoint={broken}", *FAST, tmp_path=tmp_path)
    mismatched = tmp_path / "mismatched"
    shutil.copytree(smoke_checkpoint, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    config["vocab_size"] = 50
    (mismatched / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="config.json does not match its weights: .* the config does not belong"):
        evaluate_in_process(f"checkpoint={mismatched}", *FAST, tmp_path=tmp_path)
    with pytest.raises(UserError, match="no complete checkpoint"):
        evaluate_in_process("name=never-ran", f"runs_dir={tmp_path}", *FAST, tmp_path=tmp_path)


def test_bad_task_data_fails_before_training(smoke_checkpoint, tmp_path):
    glue = needs_shared("glue")
    with pytest.raises(UserError, match="QNLI.*train.tsv"):
        evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", "eval.tasks=[sst2,qnli]",
                            *FAST, tmp_path=tmp_path)
    assert not (tmp_path / "eval" / "results.json").exists()
    data = tmp_path / "glue_data" / "RTE"
    data.mkdir(parents=True)
    (data / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tmaybe\n")
    (data / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(UserError, match="train.tsv.*3.*maybe"):
        evaluate_in_process(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={tmp_path / 'glue_data'}",
                            "eval.tasks=[rte]", *FAST, tmp_path=tmp_path)


def test_skip_missing_names_what_it_skipped(smoke_checkpoint, tmp_path):
    glue = needs_shared("glue")
    result = run_eval(f"checkpoint={smoke_checkpoint}", f"eval.data_dir={glue}", "eval.tasks=[rte,qnli]",
                      "eval.skip_missing=true", "eval.max_train_examples=64", *FAST, tmp_path=tmp_path,
                      in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(last_line_path(result, "results: ").read_text())
    assert set(results["models"]["pretrained"]["tasks"]) == {"rte"}
    assert "train.tsv" in results["skipped"]["qnli"] and "(skipped qnli:" in result.stdout
    assert results["comparable"] is False and results["not_comparable_because"]["skipped_tasks"] == ["qnli"]
    # offline with no local folder: every task is skipped, and that is an error, not an empty result
    with pytest.raises(UserError, match="no task could be loaded.*eval.data_dir"):
        evaluate_in_process(f"checkpoint={smoke_checkpoint}", "eval.data_dir=null", "eval.tasks=[rte,cola]",
                            "eval.skip_missing=true", *FAST, tmp_path=tmp_path / "offline")


def test_an_unreachable_hub_id_is_one_line(tmp_path):
    one_line_error(run_eval("checkpoint=nobody/no-such-model", *FAST, tmp_path=tmp_path, in_process=True),
                   "hub is unreachable")
