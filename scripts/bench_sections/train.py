"""Section 1: training throughput and MFU, ours against Hugging Face models of identical dimensions.

Pairs (CPU / GPU): crammed-bert-tiny and crammed-bert-mini / crammed-bert against `BertForMaskedLM`, gpt-tiny /
gpt-small against `GPT2LMHeadModel`. Ours is built and stepped as pretrain.py builds and steps it
(cramming.run's build_run and Run.step: the objective's masking, torch.compile on GPU, the engine's checked
update). Hugging Face is trained the usual way: `DataCollatorForLanguageModeling` (mlm_probability = our train.mask_prob; mlm=False for GPT-2) on the batch,
forward with labels (full-vocabulary head on every position), backward, torch AdamW with default settings; dropout
0 like ours, so the comparison is the implementation, not a regulariser. Both clip the gradient norm (our trainer
always does; HF's Trainer does by default). Both see the same random token batches (ids 5..vocab-1), one timed step
at a time in turn (ours, HF, a matmul-peak sample, ours, ...), after warm-up; the median step counts. Ours is
also timed, in the same turns, with the other training loss (impl.loss=fused against plain): the ratio behind
impl.loss=auto's choice.

FLOPs (2 per multiply-add), forward, per token. Ours: cramming.run.flops_per_token (each block projection
counts itself, attention 4 * seq * hidden per layer, halved when causal, the head on the share of tokens it decodes:
the masked 25 % with the sparse MLM head). Hugging Face, counted from its matmuls the same way: 2 x the weights of
every Linear / Conv1D in its layers, the same attention term, and its head (BERT: transform + decoder, GPT-2:
lm_head) on every position, which is what it computes. MFU = 3 x forward FLOPs/token x tokens/s / matmul peak, each
peak measured in this run (bf16 on a GPU; fp32 on a CPU, and bf16 where the CPU multiplies bf16 natively: the median
of square torch.mm samples taken between the steps of the same pair, so a busy spell of the machine hits both sides
of the fraction). On a CPU every pair is timed in fp32, and in bf16 as well where impl.precision=auto pretrains in it;
Hugging Face runs under the same autocast as ours, so each ratio is at equal precision.
"""

import statistics

import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

from . import loss_memory
from .common import MatmulPeak, compose_config, table, target, timed

CPU_CASES = [("crammed-bert-tiny", 32), ("crammed-bert-mini", 16), ("gpt-tiny", 16)]
GPU_CASES = [("crammed-bert", 128), ("gpt-small", 32)]
SMOKE_ARCH = ["arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128"]


def synthetic_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with our special ids 0-4 and `vocab` entries: what the HF collator needs to mask."""
    from tokenizers import Tokenizer, models

    from cramming.data.tokenizer import SPECIAL_TOKENS

    words = {t: i for i, t in enumerate(SPECIAL_TOKENS)} | {f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]")


def matmul_weights(module: nn.Module) -> int:
    """Multiply-adds per token of every Linear / Conv1D (GPT-2's transposed Linear) inside `module`."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")


def build_ours(arch_name: str, seq: int, vocab: int, device, smoke: bool, loss: str = "auto",
               precision: str = "auto", attention: str = "auto"):
    """(config, runtime, ours): ours is the run pretrain.py builds (cramming.run.build_run); `loss` is impl.loss,
    `precision` impl.precision, `attention` impl.attention (the other impl settings: impl=cpu or impl=gpu's)."""
    from cramming.run import build_run

    overrides = [f"arch={arch_name}", f"data.vocab_size={vocab}", f"data.seq_length={seq}",
                 f"impl={'gpu' if device.type == 'cuda' else 'cpu'}", f"impl.loss={loss}",
                 f"impl.precision={precision}", f"impl.attention={attention}"] + (SMOKE_ARCH if smoke else [])
    config = compose_config(overrides)
    run = build_run(config)
    ours = {"run": run, "model": run.model, "flops": run.flops, "loss": run.runtime.loss, "params": run.parameters}
    return config, run.runtime, ours


def build_pair(arch_name: str, seq: int, vocab: int, device, smoke: bool, precision: str):
    """(ours, hf): each a dict with the model, optimizer, step inputs and forward FLOPs per token."""
    from cramming.data.tokenizer import SPECIAL_IDS

    config, runtime, ours = build_ours(arch_name, seq, vocab, device, smoke, precision=precision)
    arch = config.arch

    tokenizer = synthetic_tokenizer(vocab)
    clm = arch.objective == "clm"
    dims = {"hidden": arch.hidden_size, "layers": arch.num_layers, "heads": arch.num_heads, "ffn": arch.ffn_size}
    if clm:
        hf_model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=max(seq, 128), n_embd=dims["hidden"],
                                              n_layer=dims["layers"], n_head=dims["heads"], n_inner=dims["ffn"],
                                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                              pad_token_id=SPECIAL_IDS["pad"], bos_token_id=SPECIAL_IDS["cls"],
                                              eos_token_id=SPECIAL_IDS["sep"]))
        layers, head = hf_model.transformer.h, hf_model.lm_head
    else:
        hf_model = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=dims["hidden"],
                                              num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
                                              intermediate_size=dims["ffn"], max_position_embeddings=max(seq, 128),
                                              pad_token_id=SPECIAL_IDS["pad"], hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0))
        layers, head = hf_model.bert.encoder, hf_model.cls
    hf_model.to(device)
    attention = 4 * seq * dims["hidden"] * dims["layers"] // (2 if clm else 1)
    hf = {"model": hf_model, "step_model": hf_model, "opt": torch.optim.AdamW(hf_model.parameters(), lr=config.train.lr),
          "flops": 2 * matmul_weights(layers) + attention + 2 * matmul_weights(head),
          "collator": DataCollatorForLanguageModeling(tokenizer, mlm=not clm, mlm_probability=config.train.mask_prob)}
    hf["params"] = sum(p.numel() for p in hf_model.parameters())
    return config, runtime, ours, hf


def train_step(side: dict, batch: torch.Tensor, generator, clip: float, autocast) -> None:
    """Ours: the run's own step (Run.step). Hugging Face: its collator masks (or copies labels), the model takes
    its dict, and the step is the usual clip and AdamW update."""
    if "run" in side:
        side["run"].step(batch, generator)
        return
    features = {k: v.to(batch.device) for k, v in side["collator"]([{"input_ids": row} for row in batch.cpu()]).items()}
    with autocast():
        loss = side["step_model"](**features).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(side["model"].parameters(), clip)
    side["opt"].step()
    side["opt"].zero_grad(set_to_none=True)


def measure_case(arch_name: str, batch: int, seq: int, vocab: int, rounds: int, warmup: int, device, peaks: dict,
                 smoke: bool, precision: str) -> dict:
    """Ours (with auto's loss and the other), and Hugging Face under the same autocast, in turn, at `precision`;
    MFU against each measured peak (peaks: {precision: MatmulPeak}), sampled between the same rounds."""
    config, runtime, ours, hf = build_pair(arch_name, seq, vocab, device, smoke, precision)
    other = "plain" if ours["loss"] == "fused" else "fused"
    _, _, alternative = build_ours(arch_name, seq, vocab, device, smoke, loss=other, precision=precision)
    autocast = runtime.autocast()  # Hugging Face trains under the same autocast: equal precision
    generator = torch.Generator(device=device)
    sides = {"ours": ours, f"ours, impl.loss={other}": alternative, "HF": hf}
    if runtime.attention == "matmul":  # bf16 on a CPU: auto's kernel against SDPA, the ratio behind the choice
        sides["ours, impl.attention=sdpa"] = build_ours(arch_name, seq, vocab, device, smoke, precision=precision,
                                                        attention="sdpa")[2]

    def step(side, index):
        generator.manual_seed(1000 + index)
        ids = torch.randint(5, vocab, (batch, seq), generator=generator, device=device)
        return timed(lambda: train_step(side, ids, generator, config.train.grad_clip or float("inf"), autocast), device)

    for side in sides.values():
        side["model"].train()
        for i in range(warmup):
            step(side, -1 - i)
        side["times"] = []
    first = {name: len(peak.samples) for name, peak in peaks.items()}
    for r in range(rounds):
        for side in sides.values():
            side["times"].append(step(side, r))
        for peak in peaks.values():
            peak.sample(2)
    # what the machine gave while this pair ran, per precision
    case_peaks = {name: statistics.median(peak.samples[first[name]:]) for name, peak in peaks.items()}
    tokens = batch * seq
    result = {"arch": arch_name, "objective": config.arch.objective, "batch": batch, "seq": seq, "vocab": vocab,
              "precision": runtime.precision, "attention": runtime.attention, "hf_model": type(hf["model"]).__name__,
              "peaks": case_peaks, "peak_flops": case_peaks[runtime.precision], "models": {}}
    for name, side in sides.items():
        median = statistics.median(side["times"])
        achieved = 3 * side["flops"] * tokens / median
        result["models"][name] = {"params": side["params"], "fwd_flops_per_token": side["flops"], "step_s": median,
                                  "step_times": side["times"], "tokens_per_s": tokens / median, "flops": achieved,
                                  "mfu": achieved / result["peak_flops"],
                                  "mfu_of": {p: achieved / value for p, value in case_peaks.items()}}
    result["speedup"] = result["models"]["ours"]["tokens_per_s"] / result["models"]["HF"]["tokens_per_s"]
    fused, plain = ((ours, alternative) if ours["loss"] == "fused" else (alternative, ours))
    result["loss"] = ours["loss"]
    result["fused_over_plain"] = statistics.median(plain["times"]) / statistics.median(fused["times"])
    if "ours, impl.attention=sdpa" in sides:
        result["matmul_over_sdpa"] = statistics.median(sides["ours, impl.attention=sdpa"]["times"]) / \
            statistics.median(ours["times"])
    # The most ours/HF could be with ours at 100 % of the peak and HF as measured: a ratio above this needs fewer FLOPs.
    result["ceiling"] = result["models"]["HF"]["fwd_flops_per_token"] / (
        result["models"]["ours"]["fwd_flops_per_token"] * result["models"]["HF"]["mfu"])
    del ours, alternative, hf, sides
    return result


def precisions(device) -> list[str]:
    """The precisions timed: bf16 on a GPU; on a CPU fp32, and bf16 too where impl.precision=auto pretrains in it
    (native bf16 products measured faster, cramming.impl.cpu_precision)."""
    from cramming.impl import cpu_precision

    if device.type == "cuda":
        return ["bf16"]
    return ["fp32"] + (["bf16"] if cpu_precision()[0] == "bf16" else [])


def measured_peaks(device, smoke: bool) -> dict:
    """A MatmulPeak per precision the machine multiplies in: bf16 on a GPU; fp32 on a CPU, and bf16 where it has
    native bf16 products (cramming.impl.native_bf16)."""
    from cramming.impl import native_bf16

    n = 256 if smoke else (8192 if device.type == "cuda" else 2048)
    dtypes = {"bf16": torch.bfloat16} if device.type == "cuda" else \
        {"fp32": torch.float32, **({"bf16": torch.bfloat16} if native_bf16() else {})}
    peaks = {name: MatmulPeak(device, dtype, n) for name, dtype in dtypes.items()}
    for peak in peaks.values():
        peak.sample(3)
    return peaks


def run(args, device) -> dict:
    smoke = args.smoke
    cases = [("crammed-bert-tiny", 2), ("gpt-tiny", 2)] if smoke else (GPU_CASES if device.type == "cuda" else CPU_CASES)
    seq, vocab = (32, 512) if smoke else (128, 32768)
    peaks = measured_peaks(device, smoke)
    timed_in = precisions(device)
    results = []
    for arch_name, batch in cases:
        rounds = 1 if smoke else args.train_rounds
        for precision in timed_in:
            print(f"  {arch_name}: batch {batch} x {seq}, vocab {vocab}, {precision}, {rounds} timed steps per model",
                  flush=True)
            torch.manual_seed(0)
            results.append(measure_case(arch_name, batch, seq, vocab, rounds, 0 if smoke else 1, device, peaks, smoke,
                                        precision))
        # peak resident memory is a CPU measure (on GPUs the allocator keeps its own); a smoke run probes one case
        if device.type == "cpu" and not (smoke and len(results) > len(timed_in)):
            results[-1]["memory"] = loss_memory.measure(arch_name, batch, seq, vocab, smoke)
    return {"status": "ok", "peak_flops": peaks[timed_in[0]].flops(), "dtype": timed_in[0],
            "peaks": {name: peak.flops() for name, peak in peaks.items()},
            "peak_samples": {name: peak.samples for name, peak in peaks.items()}, "precisions": timed_in,
            "cases": results, "targets": targets_of(results, device), "markdown": markdown(results, peaks)}


def targets_of(results: list[dict], device) -> list[dict]:
    """Ours over HF at equal precision (>= 2x on a CPU), MFU against the case's own peak (>= 60 % in fp32 on a
    CPU), and on a CPU the step's FLOP/s over the fp32 peak (>= 90 %: what native bf16 products buy)."""
    on_cpu = device.type == "cpu"
    targets = []
    for case in results:
        label, precision = f"{case['arch']} ({case['precision']})", case["precision"]
        ours = case["models"]["ours"]
        targets.append(target("train", f"{label} vs {case['hf_model']}: tokens/s ours/HF, equal precision",
                              case["speedup"], ">= 2.0x" if on_cpu else "report", ">=" if on_cpu else "report", 2.0))
        gated = on_cpu and precision == "fp32"
        targets.append(target("train", f"{label}: MFU (of the measured {precision} matmul peak)", ours["mfu"],
                              ">= 60 %" if gated else "report", ">=" if gated else "report", 0.60, unit="%"))
        if on_cpu and precision != "fp32":
            targets.append(target("train", f"{label}: step FLOP/s over the measured fp32 matmul peak",
                                  ours["mfu_of"]["fp32"], ">= 90 %", ">=", 0.90, unit="%"))
        targets.append(target("train", f"{label}: step speed impl.loss=fused / plain (auto picks {case['loss']})",
                              case["fused_over_plain"], "report", "report", None))
        if "matmul_over_sdpa" in case:
            targets.append(target("train", f"{label}: step speed impl.attention=matmul / sdpa (auto picks matmul)",
                                  case["matmul_over_sdpa"], "report", "report", None))
        # a tiny (smoke) step's working memory can be below the resident set's granularity: no ratio of nothing
        if "memory" in case and min(m["step_bytes"] for m in case["memory"].values()) > 0:
            fused, plain = case["memory"]["fused"]["step_bytes"], case["memory"]["plain"]["step_bytes"]
            targets.append(target("train", f"{case['arch']}: step working memory impl.loss=fused / plain",
                                  fused / plain, "report", "report", None))
    return targets


def markdown(results: list[dict], peaks: dict) -> str:
    names = list(peaks)
    rows = [[f"{c['arch']} ({c['batch']} x {c['seq']})", c["precision"],
             name if name != "ours" else f"ours, impl.loss={c['loss']}, attention {c['attention']}",
             m["params"] / 1e6, m["fwd_flops_per_token"] / 1e6, m["step_s"] * 1e3, m["tokens_per_s"],
             *[f"{100 * m['mfu_of'][p]:.1f} %" for p in names],
             f"{c['speedup']:.2f}x" if name == "ours" else "", f"{c['ceiling']:.2f}x" if name == "ours" else ""]
            for c in results for name, m in c["models"].items()]
    measured = "; ".join(f"{p}: median {peak.flops() / 1e9:,.1f} GFLOP/s of {len(peak.samples)} square {peak.n}^3 "
                         "torch.mm samples" for p, peak in peaks.items())
    text = (f"Matmul peaks, measured between the steps of each pair ({measured}). Each case is timed in its "
            "precision, Hugging Face under the same autocast; MFU is given against each precision's peak, the "
            "samples taken while that pair ran.\n\n"
            + table(["model", "precision", "impl", "params (M)", "fwd MFLOPs/token", "step (ms, median)", "tokens/s",
                     *[f"MFU of {p} peak" for p in names], "ours/HF", "ours/HF at 100 % MFU"], rows)
            + "\n\nThe last column is the most ours/HF could be with our MFU at 100 % and HF's as measured (HF's "
              "forward FLOPs / (ours x HF's MFU)): where it is below a target, only fewer FLOPs per token could "
              "meet it.")
    memory = [[c["arch"], loss, m["step_bytes"] / 2**20, m["peak_bytes"] / 2**20]
              for c in results if "memory" in c for loss, m in c["memory"].items()]
    if memory:
        text += ("\n\nWorking memory of a training step (peak resident set minus what stays resident between "
                 "steps; each in its own interpreter, `scripts/bench_sections/loss_memory.py`):\n\n"
                 + table(["model", "impl.loss", "step MiB", "peak RSS MiB"], memory))
    return text
