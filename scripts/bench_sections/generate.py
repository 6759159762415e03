"""Section 6: generation with the KV cache against recomputing the prefix, on gpt-tiny, in the same run.

The model is built as pretrain.py builds it (arch=gpt-tiny, the vocabulary of the other sections, eval mode,
fp32 on CPU, bf16 autocast on GPU) and generates greedily from a batch of random prompts (ids 5..vocab-1) exactly
--generate-tokens new tokens (no end-of-sequence stop), once with `use_cache=True` (each step feeds one token) and
once with `use_cache=False` (each step feeds the whole sequence so far), the two taking turns, after one warm-up
call each; the median call counts. Both must produce the same tokens, or the section fails, and both project only
the last position onto the vocabulary (generate's logits_to_keep=1), so the difference is the cache's alone. The
figure is the ratio of the two medians: how much faster the cache generates those tokens. On CPU it is measured at one torch
thread and at the default count: a decode step is many small ops, and on a shared machine waiting for the pool's
other thread can cost more than the op (measured here: a (4, 256) layer norm took 9 us at one thread and 750 us at
two while the load average was 8 on 2 cores).
"""

import statistics

import torch

from .common import at_each_thread_count, compose_config, table, target, thread_counts, timed

SMOKE_ARCH = ["arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128"]


def build_gpt_tiny(vocab: int, device, smoke: bool):
    from cramming.data.tokenizer import SPECIAL_IDS
    from cramming.impl import resolve
    from cramming.run import build_model

    overrides = ["arch=gpt-tiny", f"data.vocab_size={vocab}", f"impl={'gpu' if device.type == 'cuda' else 'cpu'}"]
    config = compose_config(overrides + (SMOKE_ARCH if smoke else []))
    return build_model(config.arch, vocab, SPECIAL_IDS, resolve(config.impl, config.arch)).to(device).eval()


def measure(model, ids, new: int, rounds: int, device) -> dict:
    """Median seconds of one generate call with and without the cache, the calls taking turns after a warm-up."""
    outputs, times = {}, {True: [], False: []}

    def generate(use_cache: bool):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            outputs[use_cache] = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                                min_new_tokens=new, do_sample=False, pad_token_id=0,
                                                eos_token_id=None, use_cache=use_cache)

    for use_cache in (True, False):  # warm-up
        generate(use_cache)
    for _ in range(rounds):
        for use_cache in (True, False):
            times[use_cache].append(timed(lambda: generate(use_cache), device))
    if not torch.equal(outputs[True], outputs[False]):
        raise RuntimeError("generation with the KV cache gave other tokens than without it")
    cached, uncached = statistics.median(times[True]), statistics.median(times[False])
    return {"cached_s": cached, "uncached_s": uncached, "speedup": uncached / cached,
            "times": {"cached": times[True], "uncached": times[False]}}


def run(args, device) -> dict:
    batch, prompt, new = (2, 8, 4) if args.smoke else (4, 64, args.generate_tokens)
    vocab = 512 if args.smoke else args.vocab
    rounds = 1 if args.smoke else args.generate_rounds
    torch.manual_seed(0)
    model = build_gpt_tiny(vocab, device, args.smoke)
    ids = torch.randint(5, vocab, (batch, prompt), generator=torch.Generator().manual_seed(0)).to(device)
    counts = thread_counts(device)
    print(f"  gpt-tiny: batch {batch}, prompt {prompt}, {new} new tokens, vocab {vocab}, {rounds} timed calls each, "
          f"torch threads {counts}", flush=True)
    results = at_each_thread_count(counts, lambda: measure(model, ids, new, rounds, device))
    rows, targets = [], []
    for threads, r in results.items():
        rows.append([threads, "with the cache (use_cache=True)", r["cached_s"] * 1e3, batch * new / r["cached_s"],
                     f"{r['speedup']:.2f}x"])
        rows.append([threads, "recomputing the prefix (use_cache=False)", r["uncached_s"] * 1e3,
                     batch * new / r["uncached_s"], ""])
        targets.append(target("generate", f"gpt-tiny: {new} new tokens, KV cache / recomputing the prefix "
                                          f"({threads} torch thread{'s' if threads > 1 else ''})",
                              r["speedup"], ">= 2.0x", ">=", 2.0))
    markdown = (f"gpt-tiny, batch {batch}, prompt {prompt} tokens, {new} new tokens (greedy, no early stop), "
                f"{'bf16 autocast' if device.type == 'cuda' else 'fp32'}; median of {rounds} alternating calls "
                "each; both produced the same tokens.\n\n"
                + table(["torch threads", "generate", "call (ms, median)", "new tokens/s", "speed-up"], rows))
    return {"status": "ok", "batch": batch, "prompt": prompt, "new_tokens": new, "vocab": vocab,
            "results": {str(k): v for k, v in results.items()}, "targets": targets, "markdown": markdown}
