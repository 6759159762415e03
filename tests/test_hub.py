"""Hub model ids where a folder is taken (eval.py's checkpoint, train.init_from): served from the hub client
(mocked here: no network in tests), and offline one line saying the hub is unreachable."""

import csv
import json

import pytest
from test_eval_cli import evaluate_in_process
from test_init_from import tiny_bert

from cramming.errors import UserError
from cramming.hub import model_folder


def test_an_unreachable_hub_id_is_one_line_before_any_request(monkeypatch, tmp_path):
    with pytest.raises(UserError, match=r"checkpoint='nobody/no-such-model': not a local folder, and the Hugging "
                                        r"Face hub is unreachable \(HF_HUB_OFFLINE=1 is set\)"):
        evaluate_in_process("checkpoint=nobody/no-such-model", "impl=cpu", tmp_path=tmp_path)
    with pytest.raises(UserError, match=r"no such folder \(nor a Hugging Face hub model id\)"):
        model_folder("checkpoint", str(tmp_path / "missing"))


def test_a_hub_id_is_fine_tuned_like_a_folder_with_its_baseline(monkeypatch, tmp_path):
    """bert-base-uncased stands for any hub encoder: the client hands back its snapshot folder (offline: from the
    cache, so local_files_only), and eval fine-tunes it and its random-init twin with the same recipe."""
    folder = tmp_path / "snapshot"
    tiny_bert(folder, [f"w{i}" for i in range(59)] + ["example"])
    asked = []

    def snapshot_download(repo_id, allow_patterns=None, local_files_only=False):
        asked.append((repo_id, local_files_only))
        return str(folder)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with open(tmp_path / "t.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([("text", "label"), *[(f"example w{i}", i % 2) for i in range(24)]])
    path = evaluate_in_process("checkpoint=bert-base-uncased", "eval=custom", f"eval.train_file={tmp_path}/t.csv",
                               f"eval.dev_file={tmp_path}/t.csv", "eval.baseline=random-init", "impl=cpu",
                               "eval.recipe.epochs=1", tmp_path=tmp_path)
    results = json.loads(path.read_text())
    assert asked == [("bert-base-uncased", True)]
    assert results["model_type"] == "bert" and results["checkpoint"] == str(folder)
    assert set(results["models"]) == {"pretrained", "random-init"}
