import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

# Under pytest-xdist (scripts/test.sh runs two workers), each worker gets one core: torch's threads and those of
# the runs it starts would otherwise oversubscribe the machine and slow both.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CRAMMING_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"


def needs_shared(sub: str = "") -> Path:
    """The shared real-data folder, or skip the test saying why."""
    path = SHARED_DATA / sub
    if not path.exists():
        pytest.skip(f"real data not found at {path} (set CRAMMING_SHARED to the folder holding data/)")
    return path


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch  # after the thread variables above; collection imports it anyway
        torch.set_num_threads(1)


def built_once(tmp_path_factory, name: str, build):
    """What a session fixture builds, built once for the whole run: pytest-xdist's workers share the parent of
    their temporary folders, and the first to take the lock builds into it while the others wait, then read it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / f"once-{name}"
    with FileLock(str(folder) + ".lock"):
        done = folder / "built.json"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            done.write_text(json.dumps(build(folder)))
        return json.loads(done.read_text())


@pytest.fixture
def tmp_path(tmp_path) -> Path:
    """Each test's folder, one level down: with train.resume=auto a run resumes an unfinished sibling run of the
    same name and config, and pytest's own folders sit side by side (one worker runs the files in any order)."""
    path = tmp_path / "test"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One data cache for the whole session, as sweeps share one (a cache is safe to share across processes)."""
    return Path(built_once(tmp_path_factory, "cache", lambda folder: str(folder)))


@pytest.fixture(autouse=True)
def _cache_env(cache_dir, monkeypatch):
    monkeypatch.setenv("CRAMMING_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def run_pretrain(*overrides: str, run_dir: Path | None = None, timeout: int = 300, env: dict | None = None,
                 in_process: bool = False) -> subprocess.CompletedProcess:
    """Run `python pretrain.py` as a user would, from the repository root; `env` replaces the environment;
    `in_process`: run in this process (run_command), without a new interpreter's 5 s of imports."""
    args = [*overrides, *([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])]
    if in_process:
        return run_command("pretrain.py", args)
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / "pretrain.py"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_eval(*overrides: str, tmp_path: Path, timeout: int = 600, env: dict | None = None, in_process: bool = False):
    """Run `python eval.py` as a user would, its Hydra folder and results table under `tmp_path`; `env` replaces
    the environment; `in_process` as for run_pretrain. Each eval CLI test file binds its preset and fast recipe
    (functools.partial)."""
    args = [*overrides, f"hydra.run.dir={tmp_path}/eval", f"eval.results_table={tmp_path}/results.csv"]
    if in_process:
        return run_command("eval.py", args)
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / "eval.py"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_command(script: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python <script> <args>` in this process: the command's own entry function with sys.argv set, from the
    repository root, its exit code and output caught. A new interpreter's imports cost about 5 s, most of a
    refusal's or a small evaluation's time; test_cli_errors keeps the entry points' contract in real subprocesses,
    and each command keeps one end-to-end test in one (test_eval_cli, test_pretrain_cli)."""
    import torch
    import transformers

    from cramming.commands import eval_command, pretrain_command

    entry = {"pretrain.py": pretrain_command, "eval.py": eval_command}[script]
    out, err, argv, code = io.StringIO(), io.StringIO(), sys.argv, 0
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # Hydra sets up the job's logging: undone after
    verbosity, bars = transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled()
    sys.argv = [str(REPO / script), *args]
    try:
        with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            entry(script)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        sys.argv = argv
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        transformers.logging.set_verbosity(verbosity)  # eval quiets transformers for its own run only
        torch.set_flush_denormal(False)  # pretraining and eval turn it on for their run; a new process has it off
        (transformers.logging.enable_progress_bar if bars else transformers.logging.disable_progress_bar)()
    return subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())


def last_line_path(result, prefix: str) -> Path:
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(prefix), result.stdout[-2000:] + result.stderr[-3000:]
    return Path(lines[-1].removeprefix(prefix))


@pytest.fixture(scope="session")
def real_pretrain_run(tmp_path_factory):
    """One ~minute pretraining run on real English, shared by the pretraining and eval tests. The text is the
    SST-2 training sentences without their labels (in-domain text, so a minute of MLM already helps SST-2)."""
    sst2 = needs_shared("glue/SST-2") / "train.tsv"

    def build(folder: Path) -> dict:
        corpus = folder / "sst2-sentences.txt"
        rows = sst2.read_text(encoding="utf-8").splitlines()[1:]
        corpus.write_text("\n\n".join(row.split("\t")[0] for row in rows), encoding="utf-8")
        run_dir = folder / "runs" / "real" / "2026-01-01_00-00-00"
        result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "name=real",
                              "data=local-text", f"data.path={corpus}", "data.vocab_size=4096", "budget=0.015",
                              f"data.cache_dir={folder / 'cache'}", run_dir=run_dir)
        assert result.returncode == 0, result.stderr[-3000:]
        return {"run_dir": str(run_dir), "stdout": result.stdout, "stderr": result.stderr}

    built = built_once(tmp_path_factory, "real-run", build)
    result = subprocess.CompletedProcess([], 0, built["stdout"], built["stderr"])
    return Path(built["run_dir"]), result


@pytest.fixture(scope="session")
def smoke_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint from two steps on the sanity source: fast, and needs no shared data."""
    def build(folder: Path) -> str:
        result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity",
                              "train.max_steps=2", "name=smoke", run_dir=folder / "run", in_process=True)
        assert result.returncode == 0, result.stderr[-3000:]
        return str(last_line_path(result, "checkpoint: "))

    return Path(built_once(tmp_path_factory, "smoke-checkpoint", build))


@pytest.fixture(scope="session")
def causal_checkpoint(tmp_path_factory) -> Path:
    """A causal (gpt-tiny, clm) checkpoint from two steps on the sanity source, for zero-shot scoring."""
    def build(folder: Path) -> str:
        result = run_pretrain("arch=gpt-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity", "train.max_steps=2",
                              "name=causal", run_dir=folder / "run", in_process=True)
        assert result.returncode == 0, result.stderr[-3000:]
        return str(last_line_path(result, "checkpoint: "))

    return Path(built_once(tmp_path_factory, "causal-checkpoint", build))


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> Path:
    """A tiny run folder of the module's own (its tests may change it): step folders 2 and 3 and the checkpoint,
    name=source, on the TINY config of test_resume. What the loading-safety and border tests attack copies of."""
    from test_resume import TINY, config_for

    from cramming import pretraining

    run_dir = tmp_path_factory.mktemp("source")
    pretraining.pretrain(config_for(*TINY, "train.max_steps=3", "name=source", "train.checkpoint_every_minutes=0.0001"),
                         run_dir)
    return run_dir


def glue_folder(root: Path, train: int = 48, dev: int = 16) -> Path:
    """A glue_data/ folder holding a small RTE in the original layout (header, tab-separated, string labels)."""
    rte = root / "glue" / "RTE"
    rte.mkdir(parents=True)
    for split, rows in (("train", train), ("dev", dev)):
        lines = ["index\tsentence1\tsentence2\tlabel"] + [
            f"{i}\tThe cat number {i} sat on the mat.\tA cat sat.\t{'entailment' if i % 2 else 'not_entailment'}"
            for i in range(rows)]
        (rte / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root / "glue"


def one_line_error(result, *fragments):
    """The bad-input contract: exit code 2, no traceback, exactly one `error:` line holding each fragment."""
    assert result.returncode == 2, (result.stdout[-1500:], result.stderr[-1500:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-1500:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


# The slow tier: every subprocess pretrain/eval, torchrun, DeepSpeed, Optuna, bench smoke and AOT compile, the
# record run's smoke mode, the Triton interpreter's kernel checks, and the longest in-process training runs.
# `pytest -m "not slow"` is the loop to run while developing; .ci/run runs everything.
SLOW_MODULES = {"test_eval_cli", "test_bench_original", "test_deepspeed", "test_distributed", "test_optuna", "test_bench",
                "test_bench_kernels", "test_gpu_checks", "test_aot", "test_experiments", "test_pretrain_cli",
                "test_sweep", "test_cli_errors", "test_help", "test_output", "test_eval_checks",
                "test_checkpoint_tokenizer", "test_superglue_cli", "test_ner_cli", "test_squad_cli",
                "test_zero_shot_cli",
                # the Triton interpreter's kernel checks: each kernel call is a Python-level simulation
                "test_attention_kernel", "test_opcheck", "test_kernel_wiring"}
SLOW_TESTS = {"test_sigterm_then_resume_is_bitwise_identical_to_an_uninterrupted_run",
              "test_a_stop_signal_checkpoints_and_exits_75",
              "test_a_stop_signal_after_the_last_step_lets_the_run_finish",
              "test_pretrain_with_the_triton_kernels_matches_sdpa",
              "test_compiled_model_keeps_the_triton_ops_in_one_graph", "test_cli_error_for_triton_without_a_gpu",
              "test_compile_on_cpu", "test_two_ranks_update_as_one_process_over_the_whole_batch",
              "test_peak_memory_does_not_grow_with_the_corpus",
              "test_concurrent_builds_share_one_cache", "test_hf_round_trip_in_a_fresh_interpreter",
              "test_causal_checkpoint_generates_in_a_fresh_interpreter",
              # whole in-process training runs, each several seconds
              "test_compiling_twice_caches_no_traced_table", "test_recipe_runs_with",
              "test_sigkill_while_writing_leaves_the_previous_checkpoint",
              "test_a_run_switches_length_and_keeps_tokens_per_step", "test_offline_run_logs_the_config_and_every_scalar",
              "test_report_end_to_end", "test_periodic_validation_pauses_the_budget_clock",
              "test_every_block_option_trains_for_both_objectives",
              "test_the_command_line_refusal_is_one_line_with_exit_2",
              "test_a_run_follows_the_window_schedule_and_resumes_it_exactly", "test_speedrun_smoke_run",
              # weight averaging and energy: whole runs (a resumed pair, eval's loader, a subprocess bad value)
              "test_resuming_gives_the_same_averaged_weights_bitwise", "test_a_bad_value_exits_2_before_any_work",
              "test_the_averaged_checkpoint_is_saved_loads_in_eval_and_differs_from_the_last",
              "test_a_real_run_reports_the_energy_of_its_training",
              "test_eval_after_evaluates_the_last_and_the_averaged_weights",
              "test_ddp_averages_what_one_process_averages", "test_a_resumed_run_adds_the_energy_of_the_launch_before",
              "test_a_rollback_takes_the_average_back_too",
              # ELECTRA: a resumed pair and the command line
              "test_resuming_is_bitwise_identical", "test_the_cli_trains_rtd_and_refuses_bad_values",
              "test_resume_under_auto_bf16_is_bitwise_and_its_marker_says_bf16",
              "test_the_preset_pretrains_both_arms_and_fine_tunes_them",
              # token dropping: a resumed pair of whole runs, and a CLI run
              "test_resuming_gives_the_same_weights_and_importance_bitwise", "test_a_cli_run_drops_tokens_end_to_end",
              # a subprocess refusal, and lm-eval's task loading (seconds of imports and task indexing)
              "test_the_cli_refuses_fp8_on_cpu_in_one_line_before_any_work",
              "test_lm_eval_task_problems_are_one_line_before_any_model"}


# A test that needs a checkpoint from a pretraining subprocess is slow whatever its module.
SLOW_FIXTURES = {"smoke_checkpoint", "causal_checkpoint", "real_pretrain_run"}


# Tests of our tooling rather than of the product: the benchmark, GPU-check and record scripts, the declared layers,
# the deliberate-breaks list and transformers' common tests harness. `-m "not tooling"` leaves them out.
TOOLING_MODULES = {"test_bench", "test_bench_kernels", "test_bench_original", "test_gpu_checks", "test_gpu_checks_cli",
                   "test_record", "test_layers", "test_deliberate_breaks", "test_hf_common"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in TOOLING_MODULES:
            item.add_marker(pytest.mark.tooling)
        if (item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES or item.originalname in SLOW_TESTS
                or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
