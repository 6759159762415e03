"""Every refusal of a config value, in one table: a bad value stops with one line naming the key, before any work.

Each row composes a config from Hydra overrides and runs it through the one validation layer every entry point
calls (cramming.validation.load_config for pretrain.py, cramming.validation.eval.load_eval_config for eval.py),
so a rule is checked where it is enforced, whichever component declares it; adding a rule is adding a row. What a
refusal needs beyond the config (a run, a data file, a patched registry, the command line's exit code) stays with
its component's tests."""

import re

import pytest
from hydra import compose, initialize_config_dir
from test_config import CONF, compose_config

from cramming.errors import UserError
from cramming.validation import load_config
from cramming.validation.eval import load_eval_config

# Base overrides, each copied from the tests the rows came from.
TINY = ("arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
        "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1")
GPT = ("arch=gpt-tiny",)
RTD = (*TINY, "arch.objective=rtd")
SPAN = (*TINY, "train.masking=span")
DROPPING = ("arch=crammed-bert-tiny", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128", "impl=cpu",
            "data=sanity", "data.vocab_size=256", "data.seq_length=32", "arch.token_dropping.keep=0.5")
COMPILED = ("arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.batch_size=16", "train.max_steps=2",
            "train.validation_sequences=16", "data=sanity", "data.vocab_size=256", "data.seq_length=32",
            "data.max_chars=60000", "data.validation_fraction=0.1", "train.checkpoint_every_minutes=null")
WINDOWED = ("arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "arch.attention.pattern=[local]", "arch.attention.window=32", "impl=cpu",
            "train=cpu-smoke", "train.validation_sequences=16", "data=sanity", "data.vocab_size=256",
            "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1",
            "train.schedule=step-triangle", "train.max_steps=8", "train.batch_size=8", "impl.microbatch_size=8",
            "train.checkpoint_every_minutes=null", "train.window_schedule=[[0.25,4],[0.25,8],[0.5,16]]")
CHECKPOINT = ("checkpoint=somewhere",)  # eval.py's loader reads no checkpoint: any folder name will do
FAST = (*CHECKPOINT, "impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=16")  # test_eval_cli's recipe
ZERO_SHOT = ("checkpoint=x", "eval=zero-shot")
SUPERGLUE = ("checkpoint=x", "eval=superglue")


def row(overrides: str, fragment, id: str, base: tuple = ()):
    """One refusal: `base` and then `overrides` (split on spaces) refused with a line holding `fragment` (a plain
    substring, or a compiled regex searched for)."""
    return pytest.param(base, overrides, fragment, id=id)


def says(message: str, fragment) -> bool:
    return bool(fragment.search(message)) if isinstance(fragment, re.Pattern) else fragment in message


PRETRAIN = [
    # the schema's shape: unknown keys, wrong types, ??? (cramming/validation/pretrain.py: load_config, check_no_missing)
    row("+arch.bogus=1", "arch.bogus", "unknown-key"),
    row("+arch.linear_args.width=3", "arch.linear_args.width", "unknown-nested-key"),
    row("arch.hidden_size=big", "arch.hidden_size", "wrong-type"),
    row("arch.attention.pattern=local", "arch.attention.pattern", "list-given-a-string"),
    # (`key=???` would otherwise merge onto the schema as "keep the default", silently)
    row("budget=???", "budget=??? leaves the value missing", "missing-value-top"),
    row("arch.hidden_size=???", "arch.hidden_size=??? leaves the value missing", "missing-value-nested"),

    # the run (budget: cramming/config.py RULES; name, arch.num_heads: cramming/validation/pretrain.py across_sections)
    row("budget=0", "budget=0", "budget-zero"),
    row("name=", "name=''", "name-empty"),
    row("arch.num_heads=5", "must divide arch.hidden_size", "num-heads-not-dividing"),

    # arch: choices and ranges (cramming/model/arch.py RULES and REGISTERED, walked by cramming/rules.py)
    row("arch.position=wavy", "arch.position='wavy' is not a valid option; choose one of: alibi, learned, none, rotary",
        "position-unknown"),
    row("arch.norm=batchnorm", "arch.norm='batchnorm'", "norm-unknown"),
    row("arch.ffn=moe", "arch.ffn='moe'", "ffn-unknown"),
    row("arch.activation=tanhh", "arch.activation", "activation-unknown"),
    row("arch.norm_position=middle", "arch.norm_position", "norm-position-unknown"),
    row("arch.objective=gan", "arch.objective", "objective-unknown"),
    row("arch.init=xavier", "arch.init='xavier'", "init-unknown"),
    row("arch.layout=[gmlp,cnn]", "arch.layout='cnn'", "layout-block-unknown"),
    row("arch.init_std=0", "arch.init_std", "init-std-zero"),

    # arch.position: each position's own refusals (cramming/model/positions.py; arch.rotary, arch.rpe: model/arch.py)
    row("arch.position=rotary arch.rotary.every=0", "arch.rotary.every=0", "rotary-every-zero"),
    row("arch.position=rotary arch.rotary.pct=1.5", "arch.rotary.pct=1.5", "rotary-pct-above-1"),
    row("arch.position=rotary arch.rotary.pct=0.01", "rotates no dimension pair", "rotary-pct-rotates-nothing"),
    row("arch.position=rotary arch.rotary.base=1", "arch.rotary.base", "rotary-base-1"),
    row("arch.position=rpe arch.rpe.buckets=2", "arch.rpe.buckets=2", "rpe-too-few-buckets"),
    row("arch.position=rpe arch.rpe.max_distance=8", "arch.rpe.max_distance=8", "rpe-distance-below-buckets"),
    row("arch.position=learned data.seq_length=256", "longer than the learned position table",
        "learned-table-too-short"),
    row("data.seq_length=1024", "longer than the scaled-sinusoidal position table (arch.max_seq_length=128)",
        "sinusoidal-table-too-short"),

    # arch.layout's blocks (cramming/model/modeling_crammed.py, gmlp.py)
    row("arch.layout=[gmlp] data.seq_length=256", "longer than the gmlp spatial matrix", "gmlp-matrix-too-short"),

    # arch.attention: the patterns (cramming/model/patterns.py, asked through the PATTERNS registry)
    row("arch.attention.pattern=[local,wavy]", "arch.attention.pattern='wavy'", "pattern-unknown"),
    row("arch.attention.pattern=[]", "name at least one pattern", "pattern-empty"),
    row("arch.attention.pattern=[stepped] arch.attention.window=48", "divides data.seq_length=128",
        "stepped-window-not-dividing"),
    row("arch.attention.pattern=[local] arch.attention.window=200", "must be in [1, data.seq_length=128]",
        "local-window-too-wide"),
    row("arch.attention.pattern=[local] arch.attention.window=0", "arch.attention.window", "local-window-zero"),
    row("arch.attention.pattern=[topk] arch.attention.topk=129", "arch.attention.topk=129", "topk-too-large"),

    # arch.linear: the structured layers (cramming/model/linear.py; the projections: validation/across.py)
    row("arch.linear=sparse", "arch.linear='sparse'", "linear-unknown"),
    row("arch.linear=lowrank arch.linear_on=[embeddings]", "arch.linear_on='embeddings'", "linear-on-embeddings"),
    row("arch.linear=monarch arch.linear_args.blocks=5", "cannot build the ffn projection 768 -> 3072: monarch",
        "monarch-blocks-not-dividing"),
    row("arch.linear=lowrank arch.linear_args.rank=1000", "rank=1000", "lowrank-rank-too-large"),
    row("arch.linear=btt-moe arch.linear_args.experts=2 arch.linear_args.experts_k=3", "experts_k=3",
        "btt-moe-more-chosen-than-experts"),

    # arch.zero_init_out and arch.value_embeddings, against the layers and blocks (cramming/validation/across.py)
    row("arch.zero_init_out=true arch.linear=lowrank",
        "arch.zero_init_out=True is invalid: needs dense projections", "zero-init-structured-linear", GPT),
    row("arch.value_embeddings=3", "must be in [0, arch.num_layers / 2 = 2]", "value-embeddings-too-many", GPT),
    row("arch.value_embeddings=1 arch.layout=[gmlp,attention]", "has blocks without attention",
        "value-embeddings-gmlp-blocks", GPT),

    # arch.objective=rtd, ELECTRA (arch.rtd: cramming/model/arch.py; the generator's problem(): train/objectives.py;
    # token dropping: validation/across.py)
    row("arch.rtd.generator_scale=0", "arch.rtd.generator_scale=0.0 is invalid: must be in (0, 1]",
        "rtd-generator-scale-zero", RTD),
    row("arch.rtd.generator_scale=1.5", "arch.rtd.generator_scale=1.5 is invalid: must be in (0, 1]",
        "rtd-generator-scale-above-1", RTD),
    row("arch.rtd.generator_layers=0", "arch.rtd.generator_layers=0 is invalid", "rtd-generator-layers-zero", RTD),
    row("arch.rtd.weight=0", "arch.rtd.weight=0.0 is invalid: must be > 0", "rtd-weight-zero", RTD),
    row("arch.parametrization=mup", "arch.parametrization='mup' is invalid: arch.objective=rtd trains a generator",
        "rtd-with-mup", RTD),
    row("arch.num_layers=3 arch.token_dropping.keep=0.5",
        "drops tokens in MLM pretraining only, not arch.objective=rtd", "rtd-with-token-dropping", RTD),
    row("arch.tie_embeddings=false", "arch.rtd.tie_embeddings=True is invalid: the generator would predict through",
        "rtd-tied-generator-untied-model", RTD),

    # arch.parametrization=mup (arch.mup: cramming/model/arch.py; the layers: validation/across.py; the optimizer:
    # cramming/train/optim.py)
    row("arch.parametrization=mup train.optim.name=sgd", "train.optim.name='sgd' is invalid: arch.parametriz",
        "mup-with-sgd", GPT),
    row("arch.parametrization=mup arch.linear=lowrank", "arch.linear='lowrank' is invalid: arch.parametrization",
        "mup-structured-linear", GPT),
    row("arch.parametrization=mup arch.layout=[gmlp]", "arch.layout=['gmlp'] is invalid", "mup-gmlp-blocks", GPT),
    row("arch.parametrization=mup arch.mup.base_width=0", "arch.mup.base_width=0", "mup-base-width-zero", GPT),
    row("arch.parametrization=umup", "arch.parametrization='umup' is not a valid option; choose one of: mup, ",
        "parametrization-unknown", GPT),

    # arch.token_dropping (its ranges: cramming/model/arch.py; what it needs of the rest: validation/across.py)
    row("arch.token_dropping.keep=0", "arch.token_dropping.keep=0.0 is invalid: must be in (0, 1] or null",
        "dropping-keep-zero", DROPPING),
    row("arch.token_dropping.keep=1.5", "arch.token_dropping.keep=1.5 is invalid: must be in (0, 1] or null",
        "dropping-keep-above-1", DROPPING),
    row("arch.token_dropping.decay=1", "arch.token_dropping.decay=1.0 is invalid: must be in [0, 1)",
        "dropping-decay-1", DROPPING),
    row("arch=gpt-tiny", "in MLM pretraining only, not arch.objective=clm", "dropping-causal", DROPPING),
    row("arch.position=alibi", "not arch.position=alibi", "dropping-alibi", DROPPING),
    row("arch.position=rpe", "not arch.position=rpe", "dropping-rpe", DROPPING),
    row("arch.attention.pattern=[local] arch.attention.window=8", "arch.attention.pattern=['local']",
        "dropping-local-pattern", DROPPING),
    row("arch.layout=[attention,gmlp]", "the gmlp blocks of arch.layout", "dropping-gmlp-blocks", DROPPING),
    row("arch.unet_skips=true", "arch.unet_skips=true", "dropping-unet-skips", DROPPING),
    row("arch.value_embeddings=1", "arch.value_embeddings=1", "dropping-value-embeddings", DROPPING),
    row("arch.token_dropping.layers=[-1,3]",
        "arch.token_dropping.layers=[-1, 3] is invalid: give [first, last) with 0", "dropping-layers-negative",
        DROPPING),
    row("arch.token_dropping.layers=[1,4]", "last <= arch.num_layers - 1 = 3", "dropping-layers-past-last", DROPPING),
    row("arch.token_dropping.layers=[2,2]", "0 <= first < last", "dropping-layers-empty", DROPPING),
    row("arch.token_dropping.layers=[1]", "arch.token_dropping.layers=[1] is invalid: give [first, last)",
        "dropping-layers-one-number", DROPPING),
    row("arch.num_layers=1", "is empty at arch.num_layers=1", "dropping-one-layer", DROPPING),

    # data (cramming/config.py DataConfig RULES and REGISTERED; each source's problem(): cramming/data/sources.py;
    # data.encoding: cramming/data/local_text.py)
    row("data=local-text", "data.path", "local-text-without-path"),
    row("data.validation_fraction=0", "data.validation_fraction", "validation-fraction-zero"),
    row("data.ordering=alphabetical", "data.ordering", "ordering-unknown"),
    row("data.source=ftp", "data.source", "source-unknown"),
    row("data.filter_threshold=-1", "data.filter_threshold", "filter-threshold-negative"),
    row("data.vocab_size=10", "data.vocab_size", "vocab-too-small"),
    row("data.encoding=utf9", "data.encoding='utf9' is not a text encoding", "encoding-unknown"),
    row("data.encoding_errors=backslashreplace",
        "data.encoding_errors='backslashreplace' is not a valid option; choose one of: strict, replace, ignore",
        "encoding-errors-unknown"),

    # train: schedule, optimizer, non-finite policy, checkpoints, batch (cramming/config.py TrainConfig; the
    # schedules: cramming/train/schedule.py)
    row("train.schedule=zigzag", "train.schedule='zigzag'", "schedule-unknown"),
    row("train.schedule=step-cosine", "needs train.max_steps", "step-schedule-without-max-steps"),
    row("train.warmup=1.5", "train.warmup=1.5", "warmup-above-1"),
    row("train.schedule=budget-wsd train.warmup=0.6 train.cooldown=0.6", "must fit in the run",
        "wsd-warmup-and-cooldown-past-the-run"),
    row("train.optim.name=adam", "train.optim.name='adam'", "optimizer-unknown"),
    row("train.optim.name=sgd train.optim.sgd.momentum=1.5", "train.optim.sgd.momentum", "sgd-momentum-above-1"),
    row("train.optim.name=muon train.optim.muon.lr=0", "train.optim.muon.lr", "muon-lr-zero"),
    row("train.nonfinite=ignore", "train.nonfinite='ignore'", "nonfinite-unknown"),
    row("train.skip.max_in_row=0", "train.skip.max_in_row", "skip-max-in-row-zero"),
    row("train.nonfinite=rollback train.rollback.lr_factor=2", "train.rollback.lr_factor", "rollback-lr-factor-2"),
    row("train.keep_checkpoints=0", "train.keep_checkpoints", "keep-checkpoints-zero"),
    row("train.checkpoint_every_minutes=0", "train.checkpoint_every_minutes", "checkpoint-every-zero"),
    row("train.lr=-1", "train.lr", "lr-negative"),
    row("train.batch_ramp=1.5", "train.batch_ramp", "batch-ramp-above-1"),
    row("train.mask_prob=0", "train.mask_prob", "mask-prob-zero"),
    row("train.max_steps=0", "train.max_steps", "max-steps-zero"),

    # train.averaging (train.ema, train.lawa: cramming/config.py RULES; the engine: cramming/train/averaging.py)
    row("train.averaging=swa", "train.averaging='swa' is not a valid option; choose one of: ema, lawa, none",
        "averaging-unknown", TINY),
    row("train.averaging=ema train.ema.decay=1.0", "train.ema.decay=1.0 is invalid: must be in (0, 1)",
        "ema-decay-1", TINY),
    row("train.averaging=ema train.ema.decay=0", "train.ema.decay=0.0 is invalid: must be in (0, 1)",
        "ema-decay-zero", TINY),
    row("train.averaging=lawa train.lawa.k=0", "train.lawa.k=0 is invalid: must be >= 1", "lawa-k-zero", TINY),
    row("train.averaging=lawa train.lawa.every_fraction=1.5", "train.lawa.every_fraction=1.5 is invalid",
        "lawa-every-fraction-above-1", TINY),
    row("train.averaging=ema impl.distributed=fsdp2", "cannot run under impl.distributed=fsdp2", "ema-under-fsdp2",
        TINY),

    # train.masking (train.span: cramming/config.py RULES; the objective: cramming/validation/across.py)
    row("train.masking=words",
        re.compile(r"^train.masking='words' is not a valid option; choose one of: span, token, whole-word$"),
        "masking-unknown", SPAN),
    row("train.span.p=0", re.compile(r"^train.span.p=0.0 is invalid: must be in \(0, 1\]$"), "span-p-zero", SPAN),
    row("arch=gpt-tiny train.masking=whole-word",
        re.compile(r"^train.masking='whole-word' is invalid: arch.objective=clm masks nothing"),
        "whole-words-causal", TINY),

    # train.seq_schedule, the curriculum (cramming/train/curriculum.py)
    row("train.seq_schedule=[[0.5,32],[0.4,64]]", "add up to 1", "curriculum-fractions-not-1", TINY),
    row("train.seq_schedule=[[0.5,32],[0.5,48]]", "multiple of data.seq_length=32", "curriculum-length-not-multiple",
        TINY),
    row("train.seq_schedule=[[0.5,32],[0.5,96]] impl.microbatch_size=8", "multiple of 3",
        "curriculum-microbatch-not-multiple", TINY),
    row("train.seq_schedule=[[0.5,32],[0.5,256]] arch.position=learned", "do not extrapolate",
        "curriculum-past-learned-table", TINY),
    row("train.seq_schedule=[[0.5,32],[0.5,64]] data.ordering=sentence-length", "data.ordering=random",
        "curriculum-sorted-data", TINY),

    # train.window_schedule (cramming/train/schedule.py window_schedule_problem)
    row("train.window_schedule=[[0.5,4],[0.5,8]] arch.attention.pattern=[global]", "needs a local or stepped",
        "windows-global-pattern", WINDOWED),
    row("train.window_schedule=[[0.5,4],[0.4,8]]", "must add up to 1", "windows-fractions-not-1", WINDOWED),
    row("train.window_schedule=[[0.5,4],[0.5,64]]", "its window 64 is refused", "windows-local-too-wide", WINDOWED),
    row("train.window_schedule=[[0.5,4],[0.5,5]] arch.attention.pattern=[stepped]", "its window 5 is refused",
        "windows-stepped-not-dividing", WINDOWED),
    row("train.window_schedule=[[0.5,4],[0.5,8]] arch.attention.pattern=[stepped] arch.position=rotary "
        "train.seq_schedule=[[0.5,32],[0.5,64]] arch.attention.window=1",
        re.compile(r"its window 4 is refused: .* a train.seq_schedule stage=63"), "windows-at-a-curriculum-stage",
        WINDOWED),
    row("train.window_schedule=[[0.1,1],[0.1,2],[0.1,3],[0.1,4],[0.1,5],[0.1,6],[0.1,7],[0.1,8],[0.2,9]] "
        "impl.compile=true", "past torch's recompile limit of 8", "windows-past-recompile-limit", WINDOWED),

    # impl (cramming/config.py ImplConfig RULES and REGISTERED; the microbatch: cramming/validation/across.py)
    row("impl.device=tpu", "impl.device", "device-unknown"),
    row("impl.precision=fp4", "impl.precision='fp4'", "precision-unknown"),
    row("impl.attention=magic", "impl.attention", "attention-kernel-unknown"),
    row("impl.rotary=magic", "impl.rotary='magic'", "rotary-kernel-unknown"),
    row("impl.microbatch_size=0", "impl.microbatch_size", "microbatch-zero"),
    row("impl.microbatch_size=big", "impl.microbatch_size", "microbatch-a-word", TINY),
    row("train.batch_size=200", "multiple of impl.microbatch_size", "batch-not-multiple-of-microbatch"),
    row("impl.microbatch_size=auto train.batch_size=63 train.seq_schedule=[[0.5,32],[0.5,64]]", "multiple of 2",
        "auto-microbatch-batch-not-multiple-of-curriculum", TINY),

    # impl.compile_mode (cramming/impl.py compile_problem; against the engine: cramming/validation/across.py)
    row("impl.compile_mode=fastest", "impl.compile_mode='fastest' is not a valid option", "compile-mode-unknown",
        COMPILED),
    row("impl.compile_mode=max-autotune", "impl.compile=false compiles nothing", "compile-mode-without-compile",
        COMPILED),
    row("impl.compile=null impl.compile_mode=max-autotune-no-cudagraphs", "impl.compile=null (off on cpu)",
        "compile-mode-compile-off-on-cpu", COMPILED),
    row("impl.compile=true impl.compile_mode=reduce-overhead", "records CUDA graphs, which need a CUDA device",
        "cuda-graphs-on-cpu-reduce-overhead", COMPILED),
    row("impl.compile=true impl.compile_mode=max-autotune", "records CUDA graphs, which need a CUDA device",
        "cuda-graphs-on-cpu-max-autotune", COMPILED),
    row("impl.compile=true impl.compile_mode=max-autotune impl.device=cuda impl.distributed=deepspeed",
        "impl.distributed=deepspeed compiles the model itself", "compile-mode-under-deepspeed", COMPILED),
]

EVAL = [
    # eval.*: ranges and the benchmark's tasks (cramming/eval/config.py RULES and REGISTERED, walked by
    # cramming/rules.py; the task list: cramming/eval/kinds.py; eval.per_task: cramming/validation/eval.py)
    row("eval.tasks=[glue9]", "eval.tasks='glue9'", "glue-task-unknown", FAST),
    row("eval.seeds=0", "eval.seeds", "seeds-zero", FAST),
    row("eval.recipe.schedule=zigzag", "schedule", "recipe-schedule-unknown", FAST),
    row("+eval.per_task.wnli.epochs=2", "wnli is not in eval.tasks", "per-task-not-in-tasks", FAST),
    row("eval.data_dir=''", "eval.data_dir='' is invalid: an empty folder name", "data-dir-empty", FAST),

    # impl, as eval.py reads it (cramming/config.py ImplConfig; fp8: cramming/validation/eval.py)
    row("impl.device=tpu", "impl.device='tpu' is not a valid option; choose one of", "device-unknown", CHECKPOINT),
    row("impl.attention=flash", "impl.attention='flash' is not a valid option; choose one of",
        "attention-kernel-unknown", CHECKPOINT),
    row("impl.rotary=fast", "impl.rotary='fast' is not a valid option; choose one of", "rotary-kernel-unknown",
        CHECKPOINT),
    row("impl.loss=focal", "impl.loss='focal' is not a valid option; choose one of", "loss-unknown", CHECKPOINT),
    row("impl.precision=fp8", "impl.precision='fp8' is invalid: float8 is for pretraining", "fine-tuning-in-fp8",
        CHECKPOINT),

    # eval=zero-shot (cramming/eval/zero_shot.py refuse)
    row("eval.tasks=[h] eval.data_dir=d eval.seeds=2", re.compile("eval.seeds=2.*deterministic"),
        "zero-shot-several-seeds", ZERO_SHOT),
    row("eval.tasks=[h]", "eval.data_dir", "zero-shot-without-data-dir", ZERO_SHOT),

    # eval=superglue (cramming/eval/superglue.py; a task listed twice: cramming/eval/kinds.py)
    row("eval.tasks=[boolq,axb]", "axb is predicted by the RTE model: add rte", "superglue-diagnostic-without-rte",
        SUPERGLUE),
    row("eval.tasks=[boolq,sst2]", "eval.tasks='sst2' is not a valid option", "superglue-task-unknown", SUPERGLUE),
    row("eval.tasks=[cb,cb]", "a SuperGLUE task is listed twice", "superglue-task-twice", SUPERGLUE),
    row("+eval.per_task.axg.epochs=2", "eval.per_task.axg", "superglue-recipe-for-a-diagnostic", SUPERGLUE),
]


def refusal(load, cfg) -> str:
    with pytest.raises(UserError) as refused:
        load(cfg)
    return str(refused.value)


@pytest.mark.parametrize("base, overrides, fragment", PRETRAIN)
def test_pretrain_refusals_are_one_line_naming_the_key(base, overrides, fragment):
    message = refusal(load_config, compose_config(*base, *overrides.split()))
    assert says(message, fragment), message
    assert "\n" not in message, message


@pytest.mark.parametrize("base, overrides, fragment", EVAL)
def test_eval_refusals_are_one_line_naming_the_key(base, overrides, fragment):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="eval", overrides=[*base, *overrides.split()])
    message = refusal(load_eval_config, cfg)
    assert says(message, fragment), message
    assert "\n" not in message, message
