"""Every Python snippet of docs/huggingface.md runs as written, in a fresh directory, with `ckpt` a checkpoint of
the kind its first line names (an MLM checkpoint or a causal one): the page's promise for each tool."""

import re

import pytest
from conftest import REPO

PAGE = REPO / "docs" / "huggingface.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
NEEDS = {"peft": "peft", "sentence_transformers": "sentence-transformers"}


def test_the_page_has_a_snippet_for_each_tool():
    text = PAGE.read_text()
    for tool in ("pipeline(", "Trainer(", "get_peft_model", "SentenceTransformer", "torch.export.export",
                 "cramming.export --onnx", "lm_eval --model hf"):
        assert tool in text, tool
    assert all(s.splitlines()[0] in ("# an MLM checkpoint", "# a causal checkpoint") for s in SNIPPETS)


@pytest.mark.slow
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[re.search(r"(pipeline|Trainer|peft|sentence|export)", s).group(1)
                                                   + str(i) for i, s in enumerate(SNIPPETS)])
def test_each_snippet_runs_as_written(snippet, smoke_checkpoint, causal_checkpoint, tmp_path, monkeypatch):
    for module, package in NEEDS.items():
        if f"from {module}" in snippet:
            pytest.importorskip(module, reason=f"{package} is not installed (the dev extras have it)")
    monkeypatch.chdir(tmp_path)
    ckpt = str(causal_checkpoint if snippet.startswith("# a causal") else smoke_checkpoint)
    exec(compile(snippet, str(PAGE), "exec"), {"ckpt": ckpt, "__name__": "__docs__"})  # noqa: S102
