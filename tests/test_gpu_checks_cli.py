"""scripts/gpu_checks.sh's options and instructions, in seconds (the rehearsal itself is tests/test_gpu_checks.py,
slow): they are a user's (build the wheels, copy the checkout, run one command, read the results folder), not one
remote-run tool's; without --out the results go to a new dated folder in the checkout, which git ignores."""

import importlib.util
import os
import re
import subprocess

from conftest import REPO

spec = importlib.util.spec_from_file_location("gpu_checks", REPO / "scripts" / "gpu_checks.py")
gpu_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_checks)


def test_the_instructions_are_a_users_not_one_remote_run_tools():
    """What a user does (build the wheels, copy the checkout, run one command, read --out): no remote-run tool's
    call syntax, output variable or transfer limit in the docs or the scripts."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "scripts").rglob("*.py")),
             *sorted((REPO / "scripts").glob("*.sh"))]
    tool = re.compile(r"run\(command=|carry=|\$OUT\b|\$\{OUT\b|environ\.get\(\"OUT\"\)|64 MiB|device tool")
    found = [f"{path.relative_to(REPO)}: {match.group(0)}" for path in files
             for match in tool.finditer(path.read_text(encoding="utf-8"))]
    assert not found, found
    steps = " ".join((REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    for step in ("python scripts/fetch_wheels.py", ".glue/", "bash scripts/gpu_checks.sh",
                 "outputs/gpu_checks/<date>_<time>/", "--out <folder>", "summary.md"):
        assert step in steps, step


def test_without_out_the_results_go_to_a_new_folder_in_the_checkout(monkeypatch, tmp_path):
    """No --out: outputs/gpu_checks/<date>_<time>/ in the checkout, which git ignores; --out <folder> wins, a relative
    one taken from where gpu_checks.sh was run; the environment's OUT plays no part."""
    monkeypatch.setenv("OUT", str(tmp_path / "not-this"))
    monkeypatch.setenv("GPU_CHECKS_CALLER_DIR", str(tmp_path))
    out = gpu_checks.parse_args([]).out
    assert out.parent == REPO / "outputs" / "gpu_checks" and re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", out.name)
    ignored = subprocess.run(["git", "check-ignore", "-q", str(out.relative_to(REPO) / "summary.md")], cwd=REPO,
                             check=False)
    assert ignored.returncode == 0, "the default results folder must be git-ignored"
    assert gpu_checks.parse_args(["--out", "mine"]).out == tmp_path / "mine"
    assert gpu_checks.parse_args(["--out", str(REPO / "x")]).out == REPO / "x"
    assert gpu_checks.parse_args(["--rehearsal"]).rehearsal


def test_gpu_checks_sh_passes_its_arguments_through_from_the_checkout(tmp_path):
    """The shell wrapper adds nothing (no --out of its own: the python side's default holds), runs from the
    checkout's root and tells the python side where it was called from."""
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "$PWD|$GPU_CHECKS_CALLER_DIR|$GPU_CHECKS_REHEARSAL|$*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PY": str(fake)}
    env.pop("GPU_CHECKS_REHEARSAL", None)
    for args, rehearsal in (([], "0"), (["--rehearsal"], "1"), (["--out", "results"], "0")):
        done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_checks.sh"), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout.strip() == "|".join([str(REPO), str(tmp_path), rehearsal,
                                                " ".join(["scripts/gpu_checks.py", *args])])


def test_a_run_without_out_writes_its_summary_in_the_default_folder(monkeypatch, tmp_path, capsys):
    """main() end to end with the work stubbed out (the pre-flight fails at once): the summary and the logs land in
    a new dated folder of the default results folder, and the first line names it."""
    monkeypatch.setattr(gpu_checks, "DEFAULT_OUT", tmp_path / "outputs" / "gpu_checks")
    monkeypatch.setattr(gpu_checks, "install_wheels", lambda run: None)
    monkeypatch.setattr(gpu_checks, "preflight", lambda run: False)
    assert gpu_checks.main(["--rehearsal"]) == 2
    [folder] = (tmp_path / "outputs" / "gpu_checks").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["logs.tar.gz", "summary.md"]
    assert (folder / "summary.md").read_text().startswith("# GPU checks: complete")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"gpu_checks: results in {folder} ") and lines[-1].endswith(f"results in {folder}")
