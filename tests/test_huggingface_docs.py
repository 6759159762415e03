"""Every Python snippet of docs/huggingface.md runs as written, in a fresh directory, with `ckpt` a checkpoint of
the kind its first line names (an MLM checkpoint or a causal one): the page's promise for each tool. The snippets
for an exported folder (`python -m cramming.export ... --as modernbert|llama`) run in a fresh interpreter where
cramming cannot be imported, with no trust_remote_code: the promise that the folder needs neither."""

import re
import subprocess
import sys

import pytest
from conftest import REPO, built_once
from test_export_families import export, preset_checkpoint

PAGE = REPO / "docs" / "huggingface.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
# What a snippet needs beyond the core (the dev extras have each), by what it shows: {words: {module: package}}.
NEEDS = {"from peft": {"peft": "peft"}, "from sentence_transformers": {"sentence_transformers": "sentence-transformers"},
         "torch.onnx.export": {"onnx": "onnx", "onnxscript": "onnxscript", "onnxruntime": "onnxruntime"}}
KINDS = {"# an MLM checkpoint": None, "# a causal checkpoint": None,  # the fixture each exported kind runs on
         "# an exported masked LM": "exported_masked_lm", "# an exported causal LM": "exported_causal_lm"}
EXPORTED = [s for s in SNIPPETS if KINDS.get(s.splitlines()[0])]
CRAMMED = [s for s in SNIPPETS if s not in EXPORTED]
# Each tool the exported folders are promised to, and the kinds whose snippets show it.
EXPORTED_TOOLS = {"pipeline(": ("masked", "causal"), ".generate(": ("causal",), "Trainer(": ("masked", "causal"),
                  "get_peft_model": ("masked", "causal"), "SentenceTransformer": ("masked",),
                  "torch.onnx.export": ("masked",)}


def tool(snippet: str) -> str:
    """Which tool an exported folder's snippet shows, for its test id."""
    for word, name in (("sentence_transformers", "sentence-transformers"), ("peft", "peft"), ("onnx", "onnx"),
                       ("Trainer", "trainer"), ("pipeline", "pipeline")):
        if word in snippet:
            return name
    raise AssertionError(f"a snippet of {PAGE.name} shows none of the tools:\n{snippet}")


def test_the_page_has_a_snippet_for_each_tool():
    text = PAGE.read_text()
    for name in ("pipeline(", "Trainer(", "get_peft_model", "SentenceTransformer", "torch.export.export",
                 "cramming.export --onnx", "lm_eval --model hf"):
        assert name in text, name
    assert all(s.splitlines()[0] in KINDS for s in SNIPPETS)
    for name, kinds in EXPORTED_TOOLS.items():
        for kind in kinds:
            assert any(s.startswith(f"# an exported {kind} LM") and name in s for s in EXPORTED), (name, kind)
    assert not [s for s in EXPORTED if "trust_remote_code" in s]


def skip_without_its_tools(snippet):
    for words, modules in NEEDS.items():
        for module, package in modules.items() if words in snippet else ():
            pytest.importorskip(module, reason=f"{package} is not installed (the dev extras have it)")


@pytest.mark.slow
@pytest.mark.parametrize("snippet", CRAMMED, ids=[re.search(r"(pipeline|Trainer|peft|sentence|export)", s).group(1)
                                                   + str(i) for i, s in enumerate(CRAMMED)])
def test_each_snippet_runs_as_written(snippet, smoke_checkpoint, causal_checkpoint, tmp_path, monkeypatch):
    skip_without_its_tools(snippet)
    monkeypatch.chdir(tmp_path)
    ckpt = str(causal_checkpoint if snippet.startswith("# a causal") else smoke_checkpoint)
    exec(compile(snippet, str(PAGE), "exec"), {"ckpt": ckpt, "__name__": "__docs__"})  # noqa: S102


def exported_folder(tmp_path_factory, preset: str, family: str) -> str:
    """The preset's two-step checkpoint (test_export_families builds the same one) exported --as family."""
    checkpoint = preset_checkpoint(tmp_path_factory, preset)

    def build(folder):
        result = export(checkpoint, folder / "out", "--as", family)
        assert result.returncode == 0, result.stderr[-3000:]
        return str(folder / "out")

    return built_once(tmp_path_factory, f"exported-{family}", build)


@pytest.fixture(scope="module")
def exported_masked_lm(tmp_path_factory) -> str:
    return exported_folder(tmp_path_factory, "modernbert-tiny", "modernbert")


@pytest.fixture(scope="module")
def exported_causal_lm(tmp_path_factory) -> str:
    return exported_folder(tmp_path_factory, "llama-tiny", "llama")


# The fresh interpreter: cramming cannot be imported (as if uninstalled) before anything else runs, then the snippet.
FRESH = """
import sys
sys.modules["cramming"] = None
ckpt, snippet, page = sys.argv[1:]
exec(compile(snippet, page, "exec"), {"ckpt": ckpt, "__name__": "__docs__"})
"""


@pytest.mark.slow
@pytest.mark.parametrize("snippet", EXPORTED, ids=[f"exported-{s.split()[3]}-{tool(s)}" for s in EXPORTED])
def test_each_exported_snippet_runs_without_cramming(snippet, request, tmp_path):
    skip_without_its_tools(snippet)
    ckpt = request.getfixturevalue(KINDS[snippet.splitlines()[0]])
    text = PAGE.read_text()
    lines = "\n" * text[:text.index(snippet)].count("\n")  # a traceback names the page's own line
    result = subprocess.run([sys.executable, "-c", FRESH, ckpt, lines + snippet, str(PAGE)], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
