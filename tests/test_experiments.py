"""The experiment presets (conf/experiment/): every job of every preset's sweep composes and passes the config
checks, at CPU scale and with the GPU-scale overrides written at the top of its file; `pretrain.py -m
+experiment=...` launches exactly those jobs; and one preset trains for real at smoke scale."""

import functools
import json
import shlex
import subprocess
from dataclasses import replace

import pytest
from conftest import REPO, run_pretrain
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from cramming.validation import load_config

EXPERIMENTS = REPO / "conf" / "experiment"
PRESETS = sorted(path.stem for path in EXPERIMENTS.glob("*.yaml"))
# The same tiny sizes for every real run here (and in test_optuna.py), so they share one data cache build.
SMOKE = ["data=sanity", "data.max_chars=300000", "data.vocab_size=512", "train.max_steps=1", "train.batch_size=8",
         "impl.microbatch_size=8", "train.validation_sequences=8", "train.checkpoint_every_minutes=null"]


def gpu_overrides(preset: str) -> list[str]:
    """The `# gpu: ...` line at the top of a preset: the overrides that run it at GPU scale."""
    lines = [line for line in (EXPERIMENTS / f"{preset}.yaml").read_text().splitlines() if line.startswith("# gpu:")]
    assert len(lines) == 1, f"{preset}.yaml needs one '# gpu: <overrides>' line"
    return shlex.split(lines[0].removeprefix("# gpu:"))


@functools.cache
def _sweep_jobs(preset: str, extra: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Each job's overrides, as Hydra's basic sweeper builds them: the preset's hydra.sweeper.params first, then
    the command line, a command-line key replacing the same key of the params."""
    parser = OverridesParser.create()
    fixed = [o.input_line for o in parser.parse_overrides(extra) if not o.is_sweep_override()]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("pretrain", overrides=[f"+experiment={preset}", *fixed], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + [f"+experiment={preset}", *extra]
    overrides = parser.parse_overrides(arguments)
    (jobs,) = BasicSweeper.split_arguments(overrides, None)
    return tuple(map(tuple, jobs))


def sweep_jobs(preset: str, extra: list[str]) -> list[list[str]]:
    return [list(job) for job in _sweep_jobs(preset, tuple(extra))]


def validated(overrides: list[str]):
    return _validated(tuple(overrides))


@functools.cache
def _validated(overrides: tuple[str, ...]):
    """The checked config (a fresh compose is about 50 ms; the tests ask for the same jobs more than once)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("pretrain", overrides=list(overrides))  # without the hydra node
    return load_config(cfg)


def test_the_presets_are_there():
    assert set(PRESETS) >= {"rotary-pct", "shortformer", "local-attention", "gmlp-hybrid", "positions",
                            "topk-attention", "structured-linear", "scaling-law"}


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_composes_and_validates(preset, scale):
    extra = gpu_overrides(preset) if scale == "gpu" else []
    jobs = sweep_jobs(preset, extra)
    assert len(jobs) >= 2, jobs
    configs = [validated(job) for job in jobs]
    assert all(c.name == preset for c in configs)
    # The jobs differ: no variant is silently overridden by the preset's own keys.
    distinct = {json.dumps(OmegaConf.to_container(OmegaConf.structured(c)), sort_keys=True) for c in configs}
    assert len(distinct) == len(jobs)
    for c in configs:
        if scale == "cpu":
            short = c.budget <= 0.05 or (c.train.max_steps or 10**9) <= 500  # minutes: by the clock or by steps
            assert (c.impl.device, short) == ("cpu", True)
        else:
            assert c.impl.device == "cuda" and c.train.batch_size == 8192 and c.arch.num_layers >= 12


def expect(preset: str, **checks):
    """{variant: {dotted key: value}} against the configs of the preset's CPU jobs, by variant name."""
    jobs = sweep_jobs(preset, [])
    key = f"experiment/{preset}@_global_"
    by_variant = {}
    for job in jobs:
        variant = next(o.split("=", 1)[1] for o in job if o.startswith(key + "="))
        by_variant.setdefault(variant, []).append(OmegaConf.structured(validated(job)))
    assert set(by_variant) == set(checks), by_variant.keys()
    for variant, wanted in checks.items():
        for config in by_variant[variant]:
            for dotted, value in wanted.items():
                assert OmegaConf.select(config, dotted) == value, (preset, variant, dotted)


def test_variants_set_what_they_say():
    expect("rotary-pct",
           **{"learned": {"arch.position": "learned"},
              "rotary-25": {"arch.position": "rotary", "arch.rotary.pct": 0.25, "arch.rotary.every": 1},
              "rotary-50": {"arch.position": "rotary", "arch.rotary.pct": 0.5},
              "rotary-100": {"arch.position": "rotary", "arch.rotary.pct": 1.0},
              "rotary-25-every2": {"arch.position": "rotary", "arch.rotary.pct": 0.25, "arch.rotary.every": 2}})
    expect("shortformer", **{"short-then-long": {"train.seq_schedule": [[0.9, 128], [0.1, 512]]},
                             "long": {"train.seq_schedule": [[1.0, 512]], "arch.position": "rotary"}})
    expect("local-attention", **{p: {"arch.attention.pattern": [p]} for p in ("global", "local", "stepped")})
    expect("gmlp-hybrid", hybrid={"arch.layout": ["gmlp", "gmlp", "gmlp", "attention"], "arch.num_layers": 4,
                                  "arch.attention.pattern": ["local"]},
           attention={"arch.layout": ["attention"], "arch.attention.pattern": ["global"]})
    expect("positions", learned={"arch.position": "learned"}, rotary={"arch.position": "rotary"},
           rpe={"arch.position": "rpe", "arch.rpe.cache": True},
           **{"rpe-nocache": {"arch.position": "rpe", "arch.rpe.cache": False}})
    expect("topk-attention", **{p: {"arch.attention.pattern": [p]} for p in ("topk", "global")})
    expect("structured-linear", **{k: {"arch.linear": k} for k in
                                   ("dense", "lowrank", "kronecker", "monarch", "btt", "btt-moe")})
    expect("electra", mlm={"arch.objective": "mlm", "eval_after": True},
           rtd={"arch.objective": "rtd", "eval_after": True, "arch.rtd.generator_scale": 0.25})
    expect("scaling-law", **{f"w{h}": {"arch.hidden_size": h, "arch.ffn_size": 4 * h} for h in (64, 128, 256)})
    expect("token-dropping", full={"arch.token_dropping.keep": None, "arch.num_layers": 8},
           keep50={"arch.token_dropping.keep": 0.5, "arch.num_layers": 8})


def test_mup_width_cpu_grid_is_step_bounded():
    """Every CPU job ends on the same step count, its schedule fed step / max_steps: a loaded machine slows the
    jobs but cannot give them unequal steps (the budget only backs the steps up)."""
    from cramming.train.schedule import SCHEDULES

    configs = [validated(job) for job in sweep_jobs("mup-width", [])]
    grid = {(c.arch.hidden_size, c.arch.parametrization, c.train.lr) for c in configs}
    assert grid == {(w, p, lr) for w in (64, 256) for p in ("standard", "mup") for lr in (3e-3, 1e-2, 3e-2)}
    assert {c.train.max_steps for c in configs} == {400}
    assert all(SCHEDULES[c.train.schedule].by_steps and c.budget * 3600 >= 30 * 60 for c in configs)


def test_scaling_law_is_a_grid():
    jobs = sweep_jobs("scaling-law", [])
    grid = {(c.arch.hidden_size, c.budget) for c in map(validated, jobs)}
    assert grid == {(h, b) for h in (64, 128, 256) for b in (0.01, 0.02)}


def test_a_command_line_value_narrows_the_sweep():
    assert len(sweep_jobs("scaling-law", ["budget=0.05"])) == 3
    jobs = sweep_jobs("rotary-pct", ["experiment/rotary-pct@_global_=learned,rotary-50", "arch.num_layers=3"])
    assert [validated(job).arch.num_layers for job in jobs] == [3, 3]


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_structured_linear_at_equal_block_flops(scale):
    """The structured variants' transformer blocks cost what the dense baseline's do (within 3 % at CPU scale,
    7 % at GPU scale, where btt-moe's width step is coarse): forward FLOPs per token of the built model (one
    layer, a tiny vocabulary), less the MLM head, which grows with the width and is not matched."""
    from cramming import impl as impl_
    from cramming.data.tokenizer import SPECIAL_IDS
    from cramming.run import build_model, flops_per_token

    extra = gpu_overrides("structured-linear") if scale == "gpu" else []
    blocks = {}
    for job in sweep_jobs("structured-linear", [*extra, "arch.num_layers=1", "data.vocab_size=64"]):
        c = validated(job)
        model = build_model(c.arch, c.data.vocab_size, SPECIAL_IDS, impl_.resolve(replace(c.impl, device="cpu"),
                                                                                   c.arch))
        head = 2 * c.arch.hidden_size * c.data.vocab_size * c.train.mask_prob
        blocks[c.arch.linear] = flops_per_token(model, c) - head
    assert len(blocks) == 6
    for kind, flops in blocks.items():
        assert abs(flops / blocks["dense"] - 1) < (0.03 if scale == "cpu" else 0.07), (kind, flops, blocks["dense"])


def run_multirun(*overrides: str) -> subprocess.CompletedProcess:
    return run_pretrain("-m", *overrides, in_process=True)


def test_multirun_dryrun_launches_every_job(tmp_path):
    result = run_multirun("+experiment=positions", "dryrun=true", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("dryrun: config valid") == 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0_learned", "1_rotary", "2_rpe",
                                                                         "3_rpe-nocache"]
    overrides = OmegaConf.load(tmp_path / "3_rpe-nocache" / ".hydra" / "overrides.yaml")
    assert "experiment/positions@_global_=rpe-nocache" in overrides


def test_token_dropping_trains_at_smoke_scale(tmp_path):
    """Both jobs take a step; the dropping one counts fewer FLOPs per token and its checkpoint carries the moved
    importance averages."""
    from safetensors.torch import load_file

    result = run_multirun("+experiment=token-dropping", *SMOKE, f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = {job.name: json.loads((job / "checkpoint" / "train_summary.json").read_text())
                 for job in tmp_path.iterdir() if job.is_dir()}
    assert set(summaries) == {"0_full", "1_keep50"}
    assert [summaries[j]["config"]["arch"]["token_dropping"]["keep"] for j in ("0_full", "1_keep50")] == [None, 0.5]
    assert all(s["steps"] == 1 and s["val_loss"] > 0 for s in summaries.values())
    assert summaries["1_keep50"]["flops_per_token"] < summaries["0_full"]["flops_per_token"]
    weights = {job: load_file(tmp_path / job / "checkpoint" / "model.safetensors") for job in summaries}
    assert "token_importance.loss" in weights["1_keep50"] and "token_importance.loss" not in weights["0_full"]


def test_a_preset_trains_at_smoke_scale(tmp_path):
    """Real training, capped: both jobs of topk-attention take one step on the sanity source and checkpoint."""
    result = run_multirun("+experiment=topk-attention", *SMOKE, f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("checkpoint: ") == 2
    summaries = {job.name: json.loads((job / "checkpoint" / "train_summary.json").read_text())
                 for job in tmp_path.iterdir() if job.is_dir()}
    assert set(summaries) == {"0_topk", "1_global"}
    assert summaries["0_topk"]["config"]["arch"]["attention"]["pattern"] == ["topk"]
    assert summaries["1_global"]["config"]["arch"]["attention"]["pattern"] == ["global"]
    for summary in summaries.values():
        assert summary["steps"] == 1 and summary["val_loss"] > 0
