"""The package's layers (pyproject's [tool.importlinter], drawn in docs/architecture.md): each module imports only from
the layers below its own, no modules import each other round a cycle, and an import inside a function is kept for a
heavy or optional dependency only, with its reason on the line."""

import ast
import subprocess
import sys

import pytest
from conftest import REPO

PACKAGE = REPO / "cramming"
MOST_INNER_IMPORTS = 20  # the bound: imports of the package's own modules inside functions


def test_the_import_linter_contracts_hold():
    pytest.importorskip("importlinter", reason="import-linter is not installed (the dev extras have it)")
    done = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def imports_between_modules() -> dict[str, set[str]]:
    """{module: the package's modules it imports}, read from the source (top-level and inside functions)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
                targets |= {f"{module}.{a.name}" for a in node.names} | {module}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("cramming")}
        graph[name] = targets
    modules = set(graph)
    # `from . import x` names the module x when there is one, not its package (which every submodule has imported)
    return {name: {t for t in targets if t in modules and t != name and not any(u.startswith(t + ".") for u in
                                                                              targets if u in modules)}
            for name, targets in graph.items()}


def test_no_modules_import_each_other_round_a_cycle():
    graph = imports_between_modules()
    seen, on_path, cycles = set(), [], []

    def visit(module):
        on_path.append(module)
        for target in sorted(graph[module]):
            if target in on_path:
                cycles.append(on_path[on_path.index(target):] + [target])
            elif target not in seen:
                visit(target)
        on_path.pop()
        seen.add(module)

    for module in sorted(graph):
        if module not in seen:
            visit(module)
    assert not cycles, " | ".join(" -> ".join(c) for c in cycles[:5])


def test_imports_inside_functions_are_few_and_say_why():
    """The package's own modules inside functions: fewer than the bound. Any import inside a function (ours, an
    optional extra's, a library's slow one) says on its line why it is not at the top of its file."""
    inner = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner += [(path, node) for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
    ours = [(p, n) for p, n in inner if isinstance(n, ast.ImportFrom) and n.level]
    assert len(ours) < MOST_INNER_IMPORTS, [f"{p.name}:{n.lineno}" for p, n in ours]
    silent = [f"{path.relative_to(REPO)}:{node.lineno}" for path, node in inner
              if not any("#" in line for line in path.read_text().splitlines()[node.lineno - 1:node.end_lineno])]
    assert not silent, f"imports inside functions without their reason on the line: {silent}"


def test_pretraining_imports_no_benchmark():
    """Every pretraining process (each torchrun rank too), its --help and its refusals start without eval's
    benchmarks, metrics and their libraries (importing them cost each 1.3-1.5 s), nor what only some sources need
    (datasets for the hub, BERT's model code for train.init_from, CPython's help texts for data=python-docs)."""
    code = ("import sys, cramming.commands, cramming.pretraining; from cramming.options_doc import help_lines; "
            "help_lines('pretrain', 'budget'); "  # a refused run's and --help's key lines
            "print(sorted(set(sys.modules) & {'cramming.eval.kinds', 'cramming.eval.finetune', 'sklearn', 'peft', "
            "'scipy.stats', 'datasets', 'transformers.models.bert.modeling_bert', 'pydoc_data.topics'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_importing_a_kernel_registers_nothing_and_impl_registers_the_kernels():
    """Kernels are named explicitly (kernels.register(), called by impl.py, the layer that chooses them): importing
    the kernels changes none of the model's registries."""
    code = ("import cramming.kernels.attention, cramming.kernels.rotary\n"
            "from cramming.model.attention import ATTENTION_KERNELS\nfrom cramming.model.rotary import ROTARY_IMPLS\n"
            "before = 'triton' in ATTENTION_KERNELS or 'triton' in ROTARY_IMPLS\nimport cramming.impl\n"
            "print(before, ATTENTION_KERNELS['triton'].__name__, ROTARY_IMPLS['triton'].__name__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stdout.split() == ["False", "flash_attention", "apply_rotary_triton"], done.stderr[-2000:]
