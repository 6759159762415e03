"""Per-token time of KV-cached greedy generation: our causal model against transformers' own LlamaForCausalLM and
GPT2LMHeadModel of the same size, timed in the same run.

    python scripts/bench_generate.py                          # gpt-tiny (4 x 256), 1 x (24 prompt + 40 new) tokens
    python scripts/bench_generate.py arch.num_layers=2 arch.hidden_size=64 arch.num_heads=2 arch.ffn_size=256
    python scripts/bench_generate.py --batch 4 --threads 2 --profile

The references have random weights and our model's layers, width, heads, feed-forward width and vocabulary (Llama
with our ffn_size as its SwiGLU width, GPT-2 with it as n_inner), so what differs is each model's per-step work:
at these sizes a decode step is mostly Python and small ops, which is what the ratios compare. Each model generates
exactly --new tokens (no end-of-sequence stop) from the same prompts, with the cache and without it (recomputing
the prefix each step); the calls take turns after a warm-up, and the median counts. Our two must give the same
tokens, or the script fails. "ours / it": our cached time over that model's (above 1: we are slower). --profile
prints cProfile's top entries for our cached calls.
"""

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def ours(vocab: int, arch: str, overrides: list[str]):
    from bench_sections.common import compose_config

    from cramming.data.tokenizer import SPECIAL_IDS
    from cramming.impl import resolve
    from cramming.run import build_model

    config = compose_config([f"arch={arch}", f"data.vocab_size={vocab}", "impl=cpu", *overrides])
    return build_model(config.arch, vocab, SPECIAL_IDS, resolve(config.impl, config.arch)).eval()


def references(config) -> dict:
    """transformers' Llama and GPT-2 with our model's sizes, random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    size = {"vocab_size": config.vocab_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "hidden_size": config.hidden_size}
    llama = LlamaConfig(**size, intermediate_size=config.ffn_size, num_key_value_heads=config.num_heads,
                        max_position_embeddings=config.max_seq_length, tie_word_embeddings=True, pad_token_id=0)
    gpt2 = GPT2Config(vocab_size=config.vocab_size, n_layer=config.num_layers, n_head=config.num_heads,
                      n_embd=config.hidden_size, n_inner=config.ffn_size, n_positions=config.max_seq_length,
                      pad_token_id=0, bos_token_id=config.cls_token_id, eos_token_id=config.sep_token_id)
    return {"Llama": LlamaForCausalLM(llama).eval(), "GPT-2": GPT2LMHeadModel(gpt2).eval()}


def generate(model, ids, new: int, use_cache: bool = True):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0, eos_token_id=None, use_cache=use_cache)


def timed_in_turns(calls: dict, rounds: int) -> dict:
    """Median seconds of each call, one warm-up each, then the calls take turns round by round."""
    times = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def profile(call, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="pretrain.py overrides of the model, e.g. arch.num_layers=2")
    p.add_argument("--arch", default="gpt-tiny")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=24)
    p.add_argument("--new", type=int, default=40)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="cProfile our cached calls after timing")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ours(args.vocab, args.arch, args.overrides)
    models = {"ours": model, **references(model.config)}
    ids = torch.randint(5, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    if not torch.equal(generate(model, ids, args.new), generate(model, ids, args.new, use_cache=False)):
        raise SystemExit("error: our cached generation gave other tokens than recomputing the prefix")
    calls = {(name, cached): (lambda m=m, c=cached: generate(m, ids, args.new, c))
             for name, m in models.items() for cached in (True, False)}
    median = timed_in_turns(calls, args.rounds)
    c = model.config
    print(f"{args.arch} {' '.join(args.overrides)}: {c.num_layers} layers x {c.hidden_size} wide, {c.num_heads} heads, "
          f"ffn {c.ffn_size}, vocab {args.vocab}; batch {args.batch}, {args.prompt} prompt + {args.new} new tokens, "
          f"greedy; {args.threads} torch thread(s); median of {args.rounds} calls in turns")
    print(f"{'model':<8} {'cached ms/token':>16} {'uncached ms/token':>18} {'cached speed-up':>16} {'ours / it':>10}")
    for name in models:
        cached, uncached = median[name, True], median[name, False]
        print(f"{name:<8} {cached / args.new * 1e3:>16.3f} {uncached / args.new * 1e3:>18.3f} "
              f"{uncached / cached:>15.2f}x {median['ours', True] / cached:>9.2f}x")
    if args.profile:
        profile(lambda: generate(model, ids, args.new), 25)


if __name__ == "__main__":
    main()
