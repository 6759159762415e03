"""docs/extending.md replayed: a new feed-forward activation and a new position scheme are each one file, and a
preset chooses them. The page's files (```python <path>``` and ```yaml <path>``` blocks) are written as it says;
in process, the names validate, compute their references' rules, train and appear on the options page; in a copy of
the checkout, each command block runs as written and `git status` shows the page's files and nothing else."""

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, needs_shared
from hydra import compose, initialize_config_dir
from torch.nn import functional as F

from cramming import impl as impl_
from cramming.data.tokenizer import SPECIAL_IDS
from cramming.errors import UserError
from cramming.plugins import VARIABLE, import_plugins, module_name

PAGE = REPO / "docs" / "extending.md"
BLOCKS = re.findall(r"```(\w+)(?: (\S+))?\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
FILES = {path: text for _, path, text in BLOCKS if path}
COMMANDS = [text for language, _, text in BLOCKS if language == "bash"]
PLUGINS = [path for path in FILES if path.endswith(".py")]
PRESET = next(Path(path).stem for path in FILES if path.startswith("conf/arch/"))
SMALL = ["arch.num_layers=1", "arch.hidden_size=32", "arch.num_heads=2", "arch.ffn_size=64", "impl=cpu",
         "data=sanity", "data.vocab_size=128", "data.seq_length=32"]


def test_the_page_adds_one_activation_one_position_scheme_and_a_preset():
    assert sorted(FILES) == ["conf/arch/crammed-bert-kerple.yaml", "ideas/gelu_tanh.py", "ideas/kerple.py"]
    assert len(COMMANDS) == 2 and all(f"{VARIABLE}=" in block for block in COMMANDS)


@pytest.fixture
def idea(tmp_path, monkeypatch):
    """The page's files written under tmp_path (conf/ a copy of ours plus the preset), its plugins imported as
    $CRAMMING_PLUGINS imports them; returns the conf folder. The names leave the registries afterwards."""
    from cramming.model.activations import ACTIVATIONS
    from cramming.model.positions import POSITIONS

    shutil.copytree(REPO / "conf", tmp_path / "conf")
    for path, text in FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    monkeypatch.setenv(VARIABLE, os.pathsep.join(str(tmp_path / path) for path in PLUGINS))
    import_plugins()
    yield tmp_path / "conf"
    ACTIVATIONS.pop("gelu-tanh", None)
    ACTIVATIONS.about.pop("gelu-tanh", None)
    POSITIONS.pop("kerple-log", None)
    for path in PLUGINS:
        sys.modules.pop(module_name(path), None)


def config_for(conf: Path, *overrides):
    from cramming.validation import load_config

    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=[f"arch={PRESET}", *SMALL, *overrides]))


def model_for(config):
    from cramming.run import build_model

    torch.manual_seed(0)
    return build_model(config.arch, 128, SPECIAL_IDS, impl_.resolve(config.impl, config.arch)).eval()


def test_gelu_tanh_is_gpt2s_formula(idea):
    """GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); within 1e-3 of the exact GELU, not equal."""
    from cramming.model.activations import ACTIVATIONS

    x = torch.linspace(-6, 6, 1201, dtype=torch.float64)
    reference = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(ACTIVATIONS["gelu-tanh"](x), reference)
    assert 1e-5 < (ACTIVATIONS["gelu-tanh"](x) - F.gelu(x)).abs().max() < 1e-3


def test_kerple_log_is_the_papers_bias(idea):
    """KERPLE's logarithmic variant: bias(i, j) = -r1 log(1 + r2 |i - j|) per head, r1, r2 > 0; the rows of a cached
    step (queries offset onwards) are the whole sequence's last rows; the model's scores read it."""
    model = model_for(config_for(idea))
    bias = model.encoder.score_bias
    with torch.no_grad():
        bias.r1.copy_(torch.tensor([0.5, 2.0]))
        bias.r2.copy_(torch.tensor([1.0, 3.0]))
    full = bias(6)
    assert full.shape == (1, 2, 6, 6)
    for h, (r1, r2) in enumerate(((0.5, 1.0), (2.0, 3.0))):
        for i in range(6):
            for j in range(6):
                assert math.isclose(full[0, h, i, j].item(), -r1 * math.log(1 + r2 * abs(i - j)), rel_tol=1e-6)
    torch.testing.assert_close(bias(2, offset=4), full[..., 4:, :])
    ids = torch.randint(5, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        bias.r1.mul_(3)
        assert not torch.allclose(model(ids).logits, before)  # the scores add the bias


def test_the_preset_composes_validates_and_trains(idea):
    from cramming.model.activations import ACTIVATIONS
    from cramming.run import build_run

    config = config_for(idea, "train.lr=3e-3")
    assert (config.arch.position, config.arch.activation) == ("kerple-log", "gelu-tanh")
    torch.manual_seed(0)
    run = build_run(config)
    assert run.model.encoder.layers[0].ffn.act is ACTIVATIONS["gelu-tanh"]
    assert type(run.model.encoder.score_bias).__name__ == "KerpleLogBias"
    ids = torch.randint(5, 128, (8, 32), generator=torch.Generator().manual_seed(1))
    losses = [run.step(ids, torch.Generator().manual_seed(2)).item() for _ in range(12)]
    assert losses[-1] < losses[0] - 0.5, losses  # one batch, the same masks: the loss must fall
    start = run.model.encoder.score_bias.r1.detach().clone()
    assert not torch.equal(start, torch.ones(2))  # the bias's own weights are trained


def test_the_names_are_checked_like_built_in_ones(idea):
    with pytest.raises(UserError, match=r"arch.position='kerple' is not a valid option; choose one of: .*kerple-log"):
        config_for(idea, "arch.position=kerple")
    with pytest.raises(UserError, match="not arch.position=kerple-log"):  # the trait it lacks: token_subsets
        config_for(idea, "arch.token_dropping.keep=0.5", "arch.num_layers=4")


def test_the_options_page_lists_both_names(idea):
    from cramming.options_doc import render

    page = render()
    assert re.search(r"\| `arch.activation` \|.*gelu-tanh", page)
    assert re.search(r"\| `arch.position` \|.*kerple-log", page)
    assert "- `gelu-tanh`: GELU's tanh approximation" in page
    assert "- `kerple-log`: KERPLE's logarithmic distance bias" in page


@pytest.mark.slow
def test_the_page_runs_as_written_in_a_copy_of_the_checkout(tmp_path, cache_dir):
    """Each command block in a copy of this checkout (tracked and new files, git-initialised) with the page's files
    written: the options page lists the names, pretraining trains and saves, eval fine-tunes (where the GLUE data
    is), and git sees the page's three files and nothing else."""
    copy = tmp_path / "checkout"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "checkout"]):
        subprocess.run([*git, *args], cwd=copy, check=True)
    # cramming.conf is conf/ (pyproject's package-dir): an editable install maps it to this checkout's; the copy's
    (copy / "cramming" / "conf").symlink_to("../conf")
    (copy / ".git" / "info" / "exclude").write_text("cramming/conf\n")
    for path, text in FILES.items():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text(text)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CRAMMING_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    env.pop(VARIABLE, None)
    trained = subprocess.run(["bash", "-e", "-c", COMMANDS[0]], cwd=copy, env=env, capture_output=True, text=True,
                             timeout=600, check=False)
    assert trained.returncode == 0, trained.stderr[-3000:]
    shown = trained.stdout
    for listed_line in ("- `gelu-tanh`: GELU's tanh", "- `kerple-log`: KERPLE's", "- `crammed-bert-kerple`: "):
        assert listed_line in shown, shown  # the registries' entries and the preset
    assert re.search(r"validation loss [\d.]+ \(untrained [\d.]+\)", shown), shown[-2000:]
    assert shown.strip().splitlines()[-1].startswith("checkpoint: "), shown[-2000:]
    if (REPO.parent / "shared" / "data" / "glue").is_dir() or os.environ.get("CRAMMING_SHARED"):
        env["GLUE_DIR"] = str(needs_shared("glue"))
        evaluated = subprocess.run(["bash", "-e", "-c", COMMANDS[1]], cwd=copy, env=env, capture_output=True,
                                   text=True, timeout=600, check=False)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        assert evaluated.stdout.strip().splitlines()[-1].startswith("results: "), evaluated.stdout[-2000:]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=copy, capture_output=True, text=True,
                            check=True).stdout
    assert sorted(status.splitlines()) == ["?? conf/arch/crammed-bert-kerple.yaml", "?? ideas/"], status
