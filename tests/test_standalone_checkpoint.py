"""The shared registry lives outside the model folder (cramming/registry.py), yet every saved model folder stands
alone: its registry.py is the registry's own code, not the package's re-export, so Python without cramming loads it,
and a model loaded that way saves a folder that loads the same way."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import cramming.registry
from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM, auto_map_of
from cramming.model import registry as model_registry

SHARED = Path(cramming.registry.__file__)

# Python where `import cramming` fails, as on a machine that never installed it.
LOAD = """
import importlib.abc, json, sys, torch

class NoCramming(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cramming" or name.startswith("cramming."):
            raise ImportError(f"{{name}} is blocked: the checkpoint must load without cramming")
        return None

sys.meta_path.insert(0, NoCramming())
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

auto = {{"mlm": AutoModelForMaskedLM, "clm": AutoModelForCausalLM}}[{head!r}]
first = auto.from_pretrained({first!r}, trust_remote_code=True).eval()
ids = torch.load({first!r} + "/ids.pt")
logits = first(ids).logits
first.save_pretrained({second!r})  # a model loaded without cramming saves again
again = auto.from_pretrained({second!r}, trust_remote_code=True).eval()
# the second folder serves every Auto class it lists, not only the one it was loaded and saved as
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification
heads = [cls.from_pretrained({second!r}, trust_remote_code=True, num_labels=2).__class__.__name__
         for cls in (AutoModelForSequenceClassification, AutoModelForTokenClassification)]
print("RESULT " + json.dumps({{"same": torch.equal(again(ids).logits, logits),
                              # to rounding: this process may sum in another order (a T5 bias: 1e-7 apart)
                              "expected": torch.allclose(logits, torch.load({first!r} + "/logits.pt"), rtol=0,
                                                         atol=1e-6),
                              "heads": heads}}))
"""


def tiny(head):
    torch.manual_seed(0)
    config = CrammedConfig(objective="clm" if head is CrammedForCausalLM else "mlm", hidden_size=32, num_heads=4,
                           ffn_size=64, num_layers=2, vocab_size=97, position="rotary")
    model = head(config).eval()
    model.config.auto_map = auto_map_of(model)
    return model


def test_the_registry_is_one_object_under_both_names():
    """The model files' registry.py re-exports cramming/registry.py: one Registry class, not two copies."""
    assert model_registry.Registry is cramming.registry.Registry
    assert cramming.registry.Registry.__module__ == "cramming.registry"
    assert model_registry.invalid is cramming.registry.invalid


def test_save_pretrained_writes_the_registry_itself(tmp_path):
    """A user's own save_pretrained (no cramming checkpoint code involved) writes registry.py as the shared file,
    and no saved code file imports cramming."""
    tiny(CrammedForMaskedLM).save_pretrained(tmp_path)
    assert (tmp_path / "registry.py").read_bytes() == SHARED.read_bytes()
    for code in tmp_path.glob("*.py"):
        assert "from cramming" not in code.read_text() and "import cramming" not in code.read_text(), code.name


def test_save_pretrained_writes_every_module_its_auto_map_names(tmp_path):
    """transformers copies only the saved class's module; the folder lists the heads' too (heads.py)."""
    model = tiny(CrammedForMaskedLM)
    model.save_pretrained(tmp_path)
    modules = {name.split(".")[0] for name in json.loads((tmp_path / "config.json").read_text())["auto_map"].values()}
    assert "heads" in modules and all((tmp_path / f"{module}.py").is_file() for module in modules)


def test_save_pretrained_with_push_to_hub_pushes_a_standalone_folder(tmp_path, monkeypatch):
    """push_to_hub=True goes through push_to_hub, whose own save comes back through the registry copy."""
    pushed = {}

    def push(self, repo_id, **kwargs):
        pushed.update(repo_id=repo_id, **kwargs)
        self.save_pretrained(tmp_path / "upload")  # what push_to_hub does: save into a temporary folder
        return "url"

    monkeypatch.setattr(CrammedForMaskedLM, "push_to_hub", push)
    tiny(CrammedForMaskedLM).save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="me/tiny",
                                             commit_message="hello")
    assert pushed == {"repo_id": "me/tiny", "token": None, "commit_message": "hello"}
    for folder in ("local", "upload"):
        assert (tmp_path / folder / "registry.py").read_bytes() == SHARED.read_bytes()


@pytest.mark.slow  # a fresh interpreter per head
@pytest.mark.parametrize("head", [CrammedForMaskedLM, CrammedForCausalLM])
def test_a_saved_folder_loads_and_saves_again_where_cramming_cannot_be_imported(head, tmp_path):
    model = tiny(head)
    first, second = tmp_path / "first", tmp_path / "second"
    model.save_pretrained(first)
    ids = torch.randint(5, 97, (2, 12))
    torch.save(ids, first / "ids.pt")
    with torch.no_grad():
        torch.save(model(ids).logits, first / "logits.pt")
    code = LOAD.format(head="clm" if head is CrammedForCausalLM else "mlm", first=str(first), second=str(second))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.rpartition("RESULT ")[2].strip() == (
        '{"same": true, "expected": true, "heads": ["CrammedForSequenceClassification", "CrammedForTokenClassification"]}')
    assert (second / "registry.py").read_bytes() == SHARED.read_bytes()
