"""A checkpoint ships the model code its config uses: the default path's files, and of the variant files that
cramming/model/variants.py imports only those whose entries its architecture options name (gMLP blocks, structured
linears, rotary, T5's bias, the sparse attention patterns, muP). Its variants.py is written for it: nothing but
relative imports, trusted as ours when every file it imports is ours. Every registry holds every variant wherever
cramming reads it."""

import ast
import importlib
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from test_loading_safety import mock_hub
from test_standalone_checkpoint import LOAD

from cramming import hub
from cramming.errors import UserError
from cramming.model import CrammedConfig, CrammedForMaskedLM, auto_map_of
from cramming.model.blocks import STACKS
from cramming.model_code import PACKAGE, blob_id, closure, foreign_code, imports_only
from cramming.registry import Registry

MODEL = PACKAGE / "model"
# config keywords -> the variant files a checkpoint of it ships (a variant's own imports included)
VARIANTS = {
    "default": ({}, set()),
    "gmlp": ({"layout": ["attention", "gmlp"]}, {"gmlp.py"}),
    "btt": ({"linear": "btt"}, {"structured_linear.py", "linear_btt.py"}),
    "rotary": ({"position": "rotary"}, {"rotary.py"}),
    "rpe": ({"position": "rpe"}, {"relative_bias.py"}),
    "local": ({"attention": {"pattern": ["global", "local"]}}, {"sparse_patterns.py"}),
    "mup": ({"parametrization": "mup", "mup": {"base_width": 16}}, {"mup.py"}),
    "unet": ({"unet_skips": True}, {"unet.py"}),
    "token-dropping": ({"token_dropping": {"keep": 0.5}}, {"token_dropping.py"}),
    "several": ({"layout": ["gmlp", "attention"], "position": "rotary", "parametrization": "mup"},
                {"gmlp.py", "rotary.py", "mup.py"}),
}
EVERY_VARIANT = set().union(*(files for _, files in VARIANTS.values()))


def saved(folder, **arch):
    torch.manual_seed(0)
    config = CrammedConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=4, ffn_size=64, **arch)
    model = CrammedForMaskedLM(config).eval()
    model.config.auto_map = auto_map_of(model)
    model.save_pretrained(folder)
    return model


def variant_lines(folder) -> set[str]:
    return {line for line in (folder / "variants.py").read_text().splitlines() if line.startswith("from .")}


@pytest.mark.parametrize("name", VARIANTS)
def test_a_checkpoint_ships_the_variant_files_its_config_names_and_no_other(name, tmp_path):
    arch, expected = VARIANTS[name]
    saved(tmp_path, **arch)
    shipped = {path.name for path in tmp_path.glob("*.py")}
    assert shipped & EVERY_VARIANT == expected
    assert {"modeling_crammed.py", "heads.py", "variants.py", "registry.py"} <= shipped
    # its variants.py: this installation's, less the imports of what it does not use
    assert variant_lines(tmp_path) <= variant_lines(MODEL)
    files, missing = closure(tmp_path, ["modeling_crammed", "heads", "configuration_crammed"])
    assert missing is None and set(files) == shipped
    assert foreign_code(tmp_path) is None


def test_the_default_checkpoint_ships_far_less_code_than_every_variant(tmp_path):
    """The measure the issue names: lines of model code a default checkpoint ships, against all of cramming/model/
    that the same auto_map would reach with every variant."""
    saved(tmp_path)
    default = sum(len(path.read_text().splitlines()) for path in tmp_path.glob("*.py"))
    files, _ = closure(MODEL, ["modeling_crammed", "heads", "configuration_crammed"])
    everything = sum(len((MODEL / name).read_text().splitlines()) for name in files)
    assert default < 0.85 * everything, (default, everything)


def test_every_registered_model_entry_is_on_the_default_path_or_a_listed_variant(tmp_path):
    """A new variant file that variants.py does not import would never ship: a checkpoint using it could not load
    without cramming. Every entry an architecture option can name lives in a file every checkpoint ships (a default
    one's), or in one variants.py imports. Every file of cramming/model/ is imported first, so an entry whose file
    variants.py forgets is registered here and named."""
    for path in sorted(MODEL.glob("*.py")):
        importlib.import_module(f"cramming.model.{path.stem}")
    saved(tmp_path)
    core = [path.name for path in tmp_path.glob("*.py")]
    listed = {node.module + ".py" for node in ast.parse((MODEL / "variants.py").read_text()).body
              if isinstance(node, ast.ImportFrom)}
    registries = [(field, registry) for (schema, field), registry in Registry.serving.items()
                  if schema.__module__.startswith("cramming.model.")]
    for field, registry in [*registries, ("the stack", STACKS)]:
        for name, entry in registry.items():
            module = getattr(entry, "__module__", "")
            if module.startswith("cramming.model."):
                assert f"{module.rsplit('.', 1)[1]}.py" in set(core) | listed, (field, name, module)


def test_saving_removes_no_file_the_folder_held_before(tmp_path):
    (tmp_path / "gmlp.py").write_text("# the user's own\n")
    (tmp_path / "notes.py").write_text("# the user's own\n")
    saved(tmp_path)
    assert (tmp_path / "gmlp.py").is_file() and (tmp_path / "notes.py").read_text() == "# the user's own\n"
    assert not (tmp_path / "rotary.py").exists()  # what transformers' copy brought and the folder does not use


def test_a_process_that_is_not_the_main_one_writes_no_code(tmp_path):
    """save_pretrained(is_main_process=False), as each non-main rank of a distributed run calls it: transformers
    writes nothing there, and neither does the code copy (which would race the main process's)."""
    model = CrammedForMaskedLM(CrammedConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=4, ffn_size=64))
    model.config.auto_map = auto_map_of(model)
    model.save_pretrained(tmp_path, is_main_process=False)
    assert not list(tmp_path.glob("*.py"))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "modeling_crammed.py").is_file()


@pytest.mark.parametrize("text, trusted", [
    ('"""Doc."""\n\nfrom .gmlp import GMLPBlock  # noqa: F401\n', True),
    ("", True),
    ('"""Doc."""\nimport os\n', False),
    ('"""Doc."""\nfrom .gmlp import GMLPBlock\nGMLPBlock.forward = print\n', False),
    ("from .gmlp import GMLPBlock as Block\n", False),
    ("from .gmlp import *\n", False),
    ("from ..gmlp import GMLPBlock\n", False),
    ("from .gmlp.inner import GMLPBlock\n", False),
    ("from os import system\n", False),
    ('"""a"""\n"""b"""\n', False),
    ("from .gmlp import GMLPBlock\x00\n", False),
])
def test_a_variants_file_is_trusted_only_as_relative_imports(text, trusted, tmp_path):
    saved(tmp_path, layout=["gmlp"])
    (tmp_path / "variants.py").write_text(text)
    assert imports_only(text.encode()) is trusted
    assert foreign_code(tmp_path) == (None if trusted else "variants.py")


def test_a_variants_file_importing_code_that_is_not_ours_names_that_file(tmp_path):
    saved(tmp_path)
    (tmp_path / "evil.py").write_text("import os\nos.system('touch marker')\n")
    (tmp_path / "variants.py").write_text("from .evil import os\n")
    assert foreign_code(tmp_path) == "evil.py"
    (tmp_path / "variants.py").write_text("from .gmlp import GMLPBlock\n")  # ours by name, but not in the folder
    assert foreign_code(tmp_path) == "gmlp.py"


def test_a_hub_checkpoint_fetches_the_variant_files_its_variants_file_names(tmp_path, monkeypatch):
    snapshot = tmp_path / "repo"
    saved(snapshot, layout=["attention", "gmlp"], linear="btt")
    listed = {p.name: blob_id(p.read_bytes()) for p in snapshot.iterdir()}
    fetched = mock_hub(monkeypatch, snapshot, listed)
    folder = hub.model_folder("checkpoint", "someone/crammed")
    assert {"variants.py", "gmlp.py", "structured_linear.py", "linear_btt.py"} <= set(fetched)
    assert "rotary.py" not in fetched and foreign_code(folder) is None

    # a variants.py that names a file the hub does not hold as ours: refused before that file is fetched
    (snapshot / "evil.py").write_text("raise SystemExit('ran')\n")
    (snapshot / "variants.py").write_text("from .evil import x\n")
    listed.update({name: blob_id((snapshot / name).read_bytes()) for name in ("evil.py", "variants.py")})
    shutil.rmtree(tmp_path / "cache")
    fetched.clear()
    with pytest.raises(UserError, match="its model code on the hub is not this cramming's own"):
        hub.model_folder("checkpoint", "someone/crammed")
    assert "evil.py" not in fetched


CONSUMERS = ["cramming.train.schedule", "cramming.train.optim", "cramming.train.curriculum",
             "cramming.validation.across", "cramming.eval.squad", "cramming.model.modeling_crammed",
             "cramming.model.heads"]


def test_every_registry_holds_every_variant_wherever_cramming_reads_it():
    """The variant files register themselves when variants.py imports them (modeling_crammed.py does, last):
    each module of cramming that reads a registry with variants sees all of them, imported alone."""
    import cramming.model.modeling_crammed  # noqa: F401  (every variant registered here)

    model_registries = {registry.kind: sorted(registry) for (schema, _), registry in Registry.serving.items()
                        if schema.__module__.startswith("cramming.model.")}
    show = ("import json, sys, importlib; importlib.import_module(sys.argv[1]); from cramming.registry import "
            "Registry; print(json.dumps({r.kind: sorted(r) for r in Registry.serving.values()}))")
    for module in CONSUMERS:
        result = subprocess.run([sys.executable, "-c", show, module], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        for kind in ("block", "linear layer", "position", "attention pattern", "parametrization"):
            if kind in seen:
                assert seen[kind] == model_registries[kind], (module, kind)


@pytest.mark.slow  # a fresh interpreter
def test_variant_checkpoints_load_and_save_again_where_cramming_cannot_be_imported(tmp_path):
    """Each folder loads in a Python without cramming (transformers copies the files its variants.py names), gives
    the logits it was saved with, and saves again with the same files."""
    loads = []
    for name, (arch, _) in VARIANTS.items():
        first, second = tmp_path / name, tmp_path / f"{name}-again"
        model = saved(first, **arch)
        ids = torch.randint(5, 97, (2, 12))
        torch.save(ids, first / "ids.pt")
        with torch.no_grad():
            torch.save(model(ids).logits, first / "logits.pt")
        loads.append(LOAD.format(head="mlm", first=str(first), second=str(second)))
    result = subprocess.run([sys.executable, "-c", "\n".join(textwrap.dedent(code) for code in loads)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    results = [json.loads(line[len("RESULT "):]) for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert [(r["same"], r["expected"]) for r in results] == [(True, True)] * len(VARIANTS)
    for name in VARIANTS:
        first = {p.name for p in (tmp_path / name).glob("*.py")}
        assert {p.name for p in (tmp_path / f"{name}-again").glob("*.py")} == first, name


def test_a_hub_checkpoint_of_an_earlier_layout_is_fetched_by_its_own_imports(tmp_path, monkeypatch):
    """The hub fetch follows the repository's own files, not this installation's layout: a checkpoint saved by the
    cramming before variant files (its model code as git holds it at that commit: no blocks.py, no variants.py, every
    variant imported) is fetched whole and trusted without an opt-in, as a local folder of it is."""
    from conftest import REPO

    before = "15572a1"  # the last commit before variants.py
    listing = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", before, "cramming/model/"],
                             capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"this checkout has no git history reaching {before} (a shallow or exported copy)")
    snapshot = tmp_path / "repo"
    saved(snapshot)
    for name in [*(p for p in snapshot.glob("*.py"))]:
        name.unlink()
    for path in [*listing.stdout.split(), "cramming/registry.py"]:
        code = subprocess.run(["git", "-C", str(REPO), "show", f"{before}:{path}"], capture_output=True, check=True)
        (snapshot / path.rsplit("/", 1)[1]).write_bytes(code.stdout)
    listed = {p.name: blob_id(p.read_bytes()) for p in snapshot.iterdir()}
    fetched = mock_hub(monkeypatch, snapshot, listed)
    folder = hub.model_folder("checkpoint", "someone/old-crammed")
    assert {"gmlp.py", "unet.py", "positions.py"} <= set(fetched) and "blocks.py" not in fetched
    assert foreign_code(folder) is None
