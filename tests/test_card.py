"""Every checkpoint/ holds a Hugging Face model card (README.md with YAML front matter) saying what made it;
eval.py adds its scores; `python -m cramming.push` uploads the folder (huggingface_hub mocked: no network)."""

import csv
import json

import pytest
import yaml
from test_eval_cli import evaluate_in_process
from test_resume import NAN_RUN, config_for

from cramming import pretraining
from cramming.card import without_paths
from cramming.push import main as push_main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("carded")
    pretraining.pretrain(config_for(*NAN_RUN, "name=carded"), run_dir)
    return run_dir / "checkpoint"


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_the_checkpoint_has_a_card_saying_what_made_it(checkpoint):
    summary = json.loads((checkpoint / "train_summary.json").read_text())
    card = (checkpoint / "README.md").read_text()
    meta = front_matter(card)
    assert meta["pipeline_tag"] == "fill-mask" and meta["library_name"] == "transformers"
    for fact in (f"| parameters | {summary['parameters']:,} |", "1 layers x 64 wide, 2 heads",
                 f"| tokens seen | {summary['tokens']:,} in 6 steps |", f"{summary['val_loss']:.4f}",
                 "sanity: ", f"vocabulary {summary['data']['vocab_size']:,}", "Not evaluated yet",
                 without_paths(summary["command"])):
        assert fact in card, fact


def test_eval_adds_its_scores_to_the_card(checkpoint, tmp_path):
    (tmp_path / "parity-words").mkdir()
    with open(tmp_path / "parity-words" / "t.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([("text", "label"), *[(f"word number {i}", i % 2) for i in range(20)]])
    data = tmp_path / "parity-words"
    evaluate_in_process(f"checkpoint={checkpoint}", "eval=custom", f"eval.train_file={data}/t.csv",
                        f"eval.dev_file={data}/t.csv", "impl=cpu", "eval.recipe.epochs=1", tmp_path=tmp_path)
    card = (checkpoint / "README.md").read_text()
    scores = json.loads((checkpoint / "eval_results.json").read_text())[-1]["scores"]
    assert "Not evaluated yet" not in card and "| custom |" in card
    assert f"| {scores['custom']:.1f} |" in card
    front_matter(card)  # still a valid card
    # what was evaluated, by what it is: the kind, the data's folder by its name (never the path) and its files, the
    # metric, comparability
    assert "### your own task (`eval=custom`), 1 seed(s), median" in card and "GLUE" not in card
    assert "- custom: parity-words (train=t.csv, dev=t.csv), metric accuracy" in card
    assert "- comparable to published scores: no" in card
    assert str(tmp_path) not in card


def test_a_second_evaluation_is_added_to_the_card_beside_the_first(checkpoint, tmp_path):
    """add_evaluation appends: eval_results.json keeps every eval.py run, oldest first, and the card shows a section
    for each, so evaluating a folder again never loses the scores it had."""
    from cramming.card import EVALUATIONS, add_evaluation

    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("train_summary.json", "README.md"):
        (folder / name).write_bytes((checkpoint / name).read_bytes())
    runs = [{"benchmark": "GLUE", "seeds": 5, "scores": {"rte": 55.5}, "comparable": True,
             "finished_at": "2024-01-02T03:04:05"},
            {"benchmark": "SuperGLUE", "seeds": 1, "scores": {"boolq": 66.6}, "comparable": False,
             "finished_at": "2024-02-03T04:05:06"}]
    for run in runs:
        assert add_evaluation(folder, run, head_of=lambda objective: None)
    assert json.loads((folder / EVALUATIONS).read_text()) == runs
    card = (folder / "README.md").read_text()
    first, second = card.index("### GLUE, 5 seed(s), median, 2024-01-02"), card.index("### SuperGLUE, 1 seed(s)")
    assert first < second and "| 55.5 |" in card and "| 66.6 |" in card and "Not evaluated yet" not in card


def test_the_card_names_data_never_by_an_absolute_path(checkpoint):
    from cramming.card import card_text, without_paths

    summary = json.loads((checkpoint / "train_summary.json").read_text())
    summary["config"]["data"].update(source="local-text", path="/home/someone/corpora/my-text.txt")
    summary["init_from"] = "/home/someone/runs/base/checkpoint"
    summary["command"] = "python pretrain.py data=local-text data.path=/home/someone/corpora/my-text.txt name=x"
    card = card_text(summary, [{"benchmark": "GLUE", "kind": "glue", "seeds": 1, "comparable": True,
                                "data": {"rte": without_paths("/home/someone/glue_data/RTE")},
                                "metrics": {"rte": "accuracy"}, "scores": {"rte": 55.0},
                                "finished_at": "2026-12-05T00:00:00"}])
    assert "/home/someone" not in card
    assert "local-text (my-text.txt)" in card and "`checkpoint`" in card and "data.path=my-text.txt" in card
    assert "- rte: RTE, metric accuracy" in card and "- comparable to published scores: yes" in card
    assert without_paths("hub:aps/super_glue/boolq and nyu-mll/glue") == "hub:aps/super_glue/boolq and nyu-mll/glue"
    assert without_paths("lm-eval hellaswag (~/tasks/x)") == "lm-eval hellaswag (x)"


def test_push_uploads_the_folder_with_its_card(checkpoint, monkeypatch, capsys):
    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create", repo_id, kwargs["private"]))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, folder_path, repo_id, **kwargs):
            calls.append(("upload", repo_id, sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir())))

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    push_main([str(checkpoint), "me/tiny-crammed", "--private"])
    assert calls[0] == ("create", "me/tiny-crammed", True)
    assert calls[1][0] == "upload" and {"README.md", "model.safetensors", "config.json"} <= set(calls[1][2])
    assert capsys.readouterr().out.strip() == "pushed: https://huggingface.co/me/tiny-crammed"


@pytest.mark.parametrize("args, fragment", [(["{tmp}/none", "me/x"], "no such folder"),
                                            (["{tmp}", "me/x"], "not a complete checkpoint"),
                                            (["{ckpt}", "no-slash"], "repo id 'no-slash' is invalid")])
def test_push_refuses_in_one_line(checkpoint, tmp_path, capsys, args, fragment):
    with pytest.raises(SystemExit) as stop:
        push_main([a.format(tmp=tmp_path, ckpt=checkpoint) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and fragment in err[0], err


@pytest.mark.parametrize("objective, pipeline, loader", [
    ("mlm", "fill-mask", "AutoModelForMaskedLM"),
    ("clm", "text-generation", "AutoModelForCausalLM"),
    ("rtd", None, "AutoModelForPreTraining"),
    ("a-plugin-not-loaded", None, "AutoModel"),
])
def test_the_card_asks_the_objectives_head_how_the_hub_shows_and_loads_it(checkpoint, objective, pipeline, loader):
    """pipeline_tag and the Auto class come from the head the objective pretrains, not from a table of names."""
    from cramming.card import card_text
    from cramming.eval.recipe import objective_head

    summary = json.loads((checkpoint / "train_summary.json").read_text())
    summary["config"]["arch"]["objective"] = objective
    card = card_text(summary, head=objective_head(objective))
    assert front_matter(card).get("pipeline_tag") == pipeline
    assert f"from transformers import AutoTokenizer, {loader}\n" in card
    assert f"model = {loader}.from_pretrained(path, trust_remote_code=True)" in card
