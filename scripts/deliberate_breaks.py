"""Deliberate breaks: proof that the test suite catches real breakage (a mutation check).

A green suite says little until it has been seen to go red for the bugs it exists to stop. Each entry of BREAKS is
one small edit a developer could plausibly make (a mask on the wrong axis, a clip that is never applied, a field
not saved, a metric miscounted), paired with the few test files meant to catch it. For each break the repository
is copied to a temporary folder (its files as they are now: `git ls-files --cached --others --exclude-standard`,
so uncommitted work is included), the edit is applied there, and pytest runs the named tests in that copy with
PYTHONPATH set to it. Exit code 1 (tests failed) is *caught*, 0 is *missed*; anything else, or a copy whose
package no longer imports, is an error of the check itself. The repository itself is never changed.

    python scripts/deliberate_breaks.py            # every break; a markdown table; exit 0 only if all are caught
    python scripts/deliberate_breaks.py --list     # what each break is
    python scripts/deliberate_breaks.py --only 7   # one break (numbered as --list shows)
    python scripts/deliberate_breaks.py --baseline # the same tests unbroken: they must all pass

tests/test_deliberate_breaks.py keeps the list from rotting: every old text still occurs exactly once.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
TIMEOUT = 1800  # seconds for one break's tests


class Break(NamedTuple):
    file: str  # relative to the repository root
    old: str  # must occur exactly once in `file`
    new: str
    why: str  # one line: the bug
    tests: tuple[str, ...]  # test files (or file::test ids) meant to catch it


BREAKS = [
    Break("cramming/model/attention_masks.py",
          "visible = visible & padding[:, None, None, :].bool()",
          "visible = visible & padding[:, None, :, None].bool()",
          "attention masks padded queries instead of padded keys (the padding mask on the wrong axis)",
          ("tests/test_attention.py", "tests/test_model.py")),
    Break("cramming/engines/base.py",
          "clip_grad_norm_(model.parameters(), grad_clip or math.inf)",
          "clip_grad_norm_(model.parameters(), math.inf)",
          "the optimizer step measures the gradient norm but never clips it (train.grad_clip ignored)",
          ("tests/test_run.py",)),
    Break("cramming/train/checkpointing.py",
          "        if self.averaging is not None:  # every rank averages the same whole weights: rank 0's copy is saved\n"
          "            saved[\"averaging\"] = self.averaging.state_dict()\n",
          "",
          "a checkpoint no longer saves the weight average (EMA / LAWA), so a resumed run restarts it",
          ("tests/test_resume.py::test_resuming_gives_the_same_averaged_weights_bitwise",)),
    Break("cramming/eval/glue_metrics.py",
          'labels=[1], average="micro"',
          'labels=[0], average="micro"',
          "F1 scores the negative class instead of the positive one (MRPC / QQP scores wrong)",
          ("tests/test_glue_metrics.py",)),
    Break("cramming/train/masking.py",
          "math.ceil(round(exact, 9))",
          "math.ceil(exact)",
          "SpanBERT's mask count takes the ceiling of a float error (0.07 x 100 masks 8 tokens, not 7)",
          ("tests/test_masking_modes.py", "tests/test_masking.py")),
    Break("cramming/train/schedule.py",
          "return max(progress / warmup, WARMUP_FLOOR)",
          "return progress / warmup",
          "the warm-up starts at a learning rate of exactly 0, so the first optimizer step is a no-op",
          ("tests/test_schedule.py",)),
    Break("cramming/train/schedule.py",
          "(batch_size - microbatch_size) * fraction / ramp",
          "(batch_size - microbatch_size) * fraction * ramp",
          "the batch-size ramp multiplies by train.batch_ramp instead of dividing: it grows too slowly",
          ("tests/test_schedule.py",)),
    Break("cramming/model/rotary.py",
          "o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s",
          "o1, o2 = x1 * c + x2 * s, x2 * c - x1 * s",
          "rotary embeddings rotate by -angle (a sign slip in the rotation's formula)",
          ("tests/test_rotary_kernel.py",)),
    Break("cramming/model/losses.py",
          "loss = rows.sum() / (targets != -100).sum().clamp(min=1)",
          "loss = rows.mean()",
          "the plain per-token loss averages over every row, the ignored (-100) ones included",
          ("tests/test_fused_loss.py", "tests/test_token_dropping.py")),
    Break("cramming/data/tokenizer.py",
          'cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")',
          'cls, sep = tok.token_to_id("[SEP]"), tok.token_to_id("[CLS]")',
          "the trained tokenizer's template writes [SEP]'s id where [CLS] goes and the reverse",
          ("tests/test_data.py",)),
    Break("cramming/validation/pretrain.py",
          "yield None if a.hidden_size % a.num_heads == 0 else invalid(",
          "yield None if True else invalid(",
          "the rule that arch.num_heads divides arch.hidden_size is gone from config validation",
          ("tests/test_refusals.py",)),
    Break("cramming/model_code.py",
          "        if not is_ours(name, (Path(folder) / name).read_bytes()):\n            return name\n",
          "",
          "loading safety: a checkpoint's model code counts as ours by its file name alone, changed bytes and all",
          ("tests/test_loading_safety.py",)),
    Break("cramming/hub.py",
          "local_files_only=reason is not None",
          "local_files_only=False",
          "offline (HF_HUB_OFFLINE=1 or no connection) the hub is still asked instead of its local cache",
          ("tests/test_hub.py",)),
    Break("cramming/atomic.py",
          "        os.replace(tmp, path)\n    except BaseException:\n        with contextlib.suppress(OSError):\n"
          "            os.remove(tmp)\n        raise\n",
          "    finally:\n        os.replace(tmp, path)\n",
          "an atomic write is renamed over its target even when it failed halfway: readers see half a file",
          ("tests/test_atomic.py",)),
    Break("cramming/eval/zero_shot.py",
          "scores[j] / len(endings[j])",
          "scores[j] / len(DELIMITER + endings[j])",
          "the zero-shot scorer's acc_norm counts the ' ' delimiter in each ending's length (not lm-eval's rule)",
          ("tests/test_zero_shot.py",)),
    Break("cramming/eval/finetune.py",
          "        return model(**inputs, labels=labels).loss",
          "        return model(**inputs).logits.float().sum() * 0",
          "the heads' default fine-tuning loss never reads the labels: the classifier and multiple choice learn nothing",
          ("tests/test_predict.py",)),
    Break("cramming/eval/finetune.py",
          "        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)",
          "        torch.nn.utils.clip_grad_norm_(model.parameters(), float('inf'))",
          "fine-tuning unscales the gradients for eval.recipe.grad_clip but never clips them",
          ("tests/test_finetune.py",)),
    Break("cramming/eval/recipe.py",
          "task.train = random.Random(SUBSET_SEED).sample(task.train, e.max_train_examples)",
          "task.train = task.train[:e.max_train_examples]",
          "eval.max_train_examples keeps the file's first rows (often one label, sorted) instead of a random sample",
          ("tests/test_finetune.py",)),
]


class Outcome(NamedTuple):
    result: str  # caught, missed or error
    detail: str  # the first failing test, or what went wrong
    seconds: float


def file_of_test(test: str) -> str:
    """The file of a test file or a file::test id."""
    return test.split("::", 1)[0]


def repository_files() -> list[str]:
    """The files a checkout holds now: tracked ones that exist, and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True, text=True).stdout
    return sorted({name for name in listed.split("\0") if name and (REPO / name).is_file()})


def copy_repository(files: list[str], target: Path) -> None:
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)


def apply(brk: Break, root: Path, dry: bool = False) -> None:
    """Apply the edit in the copy at `root` (dry: only check it); the old text must occur exactly once."""
    path = root / brk.file
    text = path.read_text(encoding="utf-8")
    count = text.count(brk.old)
    if count != 1:
        raise ValueError(f"{brk.file}: the old text occurs {count} times, not once: {brk.old!r}")
    if not dry:
        path.write_text(text.replace(brk.old, brk.new), encoding="utf-8")


def environment(root: Path) -> dict:
    """The test environment (tests/conftest.py), with the copy first on the import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRITON_INTERPRET", "1"),
                       ("CRAMMING_SHARED", str(REPO.parent / "shared"))):
        env.setdefault(key, value)
    return env


def module_of(file: str) -> str:
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def import_problem(brk: Break, root: Path, env: dict) -> str | None:
    """Why the broken copy's module cannot be imported from the copy itself, or None."""
    code = (f"import cramming, {module_of(brk.file)} as m, pathlib; "
            f"assert pathlib.Path(m.__file__).resolve().is_relative_to({str(root.resolve())!r}), m.__file__")
    done = subprocess.run([python(), "-c", code], check=False, cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no output"])[-1]


def python() -> str:
    return str(PYTHON) if PYTHON.is_file() else sys.executable


def first_failure(output: str) -> str:
    """The first failing test pytest names, shortened to file::test."""
    found = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, re.MULTILINE)
    return found.group(1).removeprefix("tests/") if found else ""


def run_break(brk: Break, files: list[str], baseline: bool = False) -> Outcome:
    """Copy, break, import, test: caught when pytest exits 1, missed when it exits 0, error otherwise. baseline:
    the same tests on the unbroken copy, which must pass (result `clean`)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deliberate-break-") as tmp:
        root = Path(tmp)
        copy_repository(files, root)
        try:
            apply(brk, root, dry=baseline)
        except ValueError as err:
            return Outcome("error", str(err), time.perf_counter() - started)
        env = environment(root)
        if problem := import_problem(brk, root, env):
            return Outcome("error", f"the broken package does not import: {problem}", time.perf_counter() - started)
        command = [python(), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *brk.tests]
        try:
            done = subprocess.run(command, check=False, cwd=root, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return Outcome("error", f"pytest ran past {TIMEOUT} s", time.perf_counter() - started)
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    last = (output.strip().splitlines() or [""])[-1]
    if baseline and done.returncode in (0, 1):
        return Outcome("clean", last, seconds) if done.returncode == 0 else Outcome("fails", first_failure(output),
                                                                                    seconds)
    if done.returncode == 1:
        return Outcome("caught", first_failure(output), seconds)
    if done.returncode == 0:
        return Outcome("missed", last, seconds)
    tail = " / ".join(output.strip().splitlines()[-3:])
    return Outcome("error", f"pytest exited {done.returncode}: {tail}", seconds)


def table(rows: list[tuple[int, Break, Outcome]]) -> str:
    lines = ["| # | break | file | tests run | result | first failure | seconds |",
             "|---:|---|---|---|---|---|---:|"]
    for number, brk, outcome in rows:
        tests = ", ".join(t.removeprefix("tests/") for t in brk.tests)
        detail = outcome.detail.replace("|", "\\|")
        lines.append(f"| {number} | {brk.why} | {brk.file} | {tests} | {outcome.result} | {detail} | "
                     f"{outcome.seconds:.0f} |")
    return "\n".join(lines)


def list_breaks() -> None:
    for number, brk in enumerate(BREAKS, 1):
        print(f"{number:2d}. {brk.file}: {brk.why}\n    tests: {' '.join(brk.tests)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the breaks and exit")
    parser.add_argument("--only", type=int, metavar="N", help="run break N alone (1-based, as --list numbers them)")
    parser.add_argument("--baseline", action="store_true",
                        help="run each break's tests without its edit: they must pass, so a catch is the break's")
    args = parser.parse_args(argv)
    if args.list:
        list_breaks()
        return 0
    if args.only is not None and not 1 <= args.only <= len(BREAKS):
        parser.error(f"--only takes 1 to {len(BREAKS)}, not {args.only}")
    chosen = [args.only] if args.only is not None else range(1, len(BREAKS) + 1)
    files, started, rows = repository_files(), time.perf_counter(), []
    for number in chosen:
        brk = BREAKS[number - 1]
        print(f"[{number}/{len(BREAKS)}] {brk.file}: {brk.why}", file=sys.stderr, flush=True)
        rows.append((number, brk, run_break(brk, files, args.baseline)))
        print(f"    {rows[-1][2].result} in {rows[-1][2].seconds:.0f} s", file=sys.stderr, flush=True)
    print(table(rows))
    wanted = "clean" if args.baseline else "caught"
    good = sum(outcome.result == wanted for _, _, outcome in rows)
    what = "breaks' tests pass unbroken" if args.baseline else "breaks caught"
    print(f"\n{good} of {len(rows)} {what} in {time.perf_counter() - started:.0f} s")
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
