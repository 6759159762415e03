"""python -m cramming.race: is recipe B faster than recipe A to a validation loss, beyond seed noise?

    python -m cramming.race --a "train.lr=1e-3" --b "train.lr=2e-3" --seeds 5 --out outputs/race/lr \
        arch=crammed-bert-tiny impl=cpu train=cpu-smoke data=sanity budget=0.03 \
        train.validate_every_minutes=0.01 train.target_loss=7.2

Pretrains (cramming-pretrain) `<common overrides> <config's overrides> seed=<i>` for i = 0..N-1, A then B, each into
<out>/<a|b>/seed-<i>, and reads seconds_to_target and the final val_loss of each train_summary.json. Two verdicts,
each at p < 0.01:

- time: a one-sided Mann-Whitney U test that A's times to target tend to be larger than B's. A run that never
  reached the target (its budget or train.max_steps ran out) is censored, not dropped: tied with the other misses
  and ranked above every run that reached it (with one censoring time this is Gehan's generalized Wilcoxon test).
  A's misses are evidence that B is faster, B's misses evidence against it.
- loss, modded-nanogpt's record rule: per recipe, a one-sample t-test that its mean final validation loss is at most
  the target (scipy.stats.ttest_1samp(..., alternative="less")).

Each config's reach count, and the mean time of its reached runs with a 95 % CI, are reported too. Everything goes
to <out>/race.json, whose absolute path is the last line printed.
"""

import argparse
import json
import math
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from .atomic import write_atomic
from .errors import exit_on_user_error
from .outputs import claim_folder

ALPHA = 0.01  # both verdicts; modded-nanogpt's records use p < 0.01
EXACT_SPLITS = 200_000  # exact permutation p up to this many ways to split the runs (10 seeds each: 184,756)
TIME_TEST = ("one-sided Mann-Whitney U, B faster than A; runs that missed the target are censored: tied with each "
             "other above every reached run")
PRETRAIN = "from cramming.commands import pretrain_command; pretrain_command('cramming-pretrain')"


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad input is one line and exit code 2, not argparse's usage block."""
        print(f"error: {message} (python -m cramming.race --help)", file=sys.stderr)
        sys.exit(2)


def parse(argv):
    p = Parser(prog="python -m cramming.race", description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="config A's pretraining overrides, quoted as one argument")
    p.add_argument("--b", required=True, help="config B's pretraining overrides (the challenger)")
    p.add_argument("--seeds", type=int, default=5, help="runs per config, seed=0..N-1 (at least 2; 5 or more for "
                   "the time verdict to be able to reach p < 0.01)")
    p.add_argument("--out", type=Path, default=None, help="folder of the runs and race.json; default "
                   "outputs/race/<time> under the current directory")
    p.add_argument("common", nargs="*", help="pretraining overrides for both configs (train.target_loss=...)")
    args = p.parse_args(argv)
    if args.seeds < 2:
        p.error(f"--seeds={args.seeds} is too few: a confidence interval and a t-test need at least 2 runs per "
                "config, e.g. --seeds 5")
    for name in ("a", "b"):
        overrides = [*args.common, *shlex.split(getattr(args, name))]
        if not any(o.startswith("train.target_loss=") for o in overrides):
            p.error(f"config {name.upper()} has no train.target_loss: give it in the common overrides, e.g. "
                    "train.target_loss=3.5 train.validate_every_minutes=1")
    if smallest_p(args.seeds, args.seeds) >= ALPHA:
        print(f"note: with --seeds {args.seeds} the time test's smallest possible p is "
              f"{smallest_p(args.seeds, args.seeds):.3g}, so B cannot be shown faster at p < {ALPHA:g}; "
              f"--seeds {seeds_needed()} or more can", file=sys.stderr)
    return args


def smallest_p(n_a: int, n_b: int) -> float:
    """The rank test's best case (every B run faster than every A run): one split of the runs in all of them."""
    return 1 / math.comb(n_a + n_b, n_a)


def seeds_needed(alpha: float = ALPHA) -> int:
    """Fewest seeds per config with which the time verdict can say "faster" at all."""
    n = 2
    while smallest_p(n, n) >= alpha:
        n += 1
    return n


def summary_stats(times: list) -> dict:
    """One config: how many runs reached the target, and the mean of those that did with its 95 % CI."""
    from scipy import stats  # 0.7 s to import: not before the runs, so a refusal is instant

    reached = [t for t in times if t is not None]
    n = len(reached)
    mean = sum(reached) / n if n else None
    half = None
    if n >= 2:
        sd = math.sqrt(sum((t - mean) ** 2 for t in reached) / (n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"runs": len(times), "reached": n, "mean_seconds": mean, "ci95_half_width": half,
            "ci95": [mean - half, mean + half] if half is not None else None}


def rank_test(a: list, b: list) -> dict:
    """U counts the (A, B) pairs where A's run was slower; a miss is +inf, so it loses to every reached run and ties
    with every miss. The p value is exact (every split of the runs into A and B, ties included) while that is
    cheap, else scipy's tie-corrected normal approximation."""
    from scipy import stats  # 0.7 s to import: not before the runs, so a refusal is instant

    x, y = ([math.inf if t is None else t for t in times] for times in (a, b))
    exact = math.comb(len(x) + len(y), len(x)) <= EXACT_SPLITS
    method = stats.PermutationMethod(n_resamples=EXACT_SPLITS) if exact else "asymptotic"
    test = stats.mannwhitneyu(x, y, alternative="greater", method=method)
    return {"test": TIME_TEST, "alternative": "A's times greater than B's", "U": float(test.statistic),
            "p_value": float(test.pvalue), "p_method": "exact permutation" if exact else "normal approximation"}


def compare(a: list, b: list, alpha: float = ALPHA) -> dict:
    """A and B's seconds_to_target per seed (None: not reached): each config's stats, the censored rank test of "B
    is faster than A" over every run, missed ones included, and its verdict."""
    result = {"a": summary_stats(a), "b": summary_stats(b), "alpha": alpha, "time_test": None}
    if not result["a"]["reached"] and not result["b"]["reached"]:
        result["verdict"] = "not tested: no run of either config reached the target"
        return result
    result["time_test"] = test = rank_test(a, b)
    if test["p_value"] < alpha:
        result["verdict"] = f"B faster (p < {alpha:g})"
        return result
    result["verdict"] = f"B not shown faster (p = {test['p_value']:.3g})"
    if smallest_p(len(a), len(b)) >= alpha:
        result["verdict"] += (f"; with {len(a)} and {len(b)} runs this test cannot go below p = "
                              f"{smallest_p(len(a), len(b)):.3g}: run --seeds {seeds_needed(alpha)} or more")
    return result


def loss_test(losses: list, target: float, alpha: float = ALPHA) -> dict:
    """modded-nanogpt's record rule for one recipe: its mean final validation loss is at most the target, by a
    one-sample one-sided t-test over its seeds."""
    from scipy import stats  # 0.7 s to import: not before the runs, so a refusal is instant

    n = len(losses)
    result = {"runs": n, "target_loss": target, "mean_val_loss": sum(losses) / n if n else None, "t": None,
              "p_value": None, "alpha": alpha}
    if n < 2:
        result["verdict"] = "not tested: fewer than 2 runs"
        return result
    test = stats.ttest_1samp(losses, target, alternative="less")
    result["t"], result["p_value"] = float(test.statistic), float(test.pvalue)
    if result["p_value"] < alpha:  # nan (every loss exactly the target) is not below
        result["verdict"] = f"mean final loss <= {target:g} (p < {alpha:g})"
    else:
        result["verdict"] = f"mean final loss not shown <= {target:g} (p = {result['p_value']:.3g})"
    return result


def run_one(overrides: list, run_dir: Path) -> dict:
    """One pretraining run: its train_summary.json's target_loss, seconds_to_target (None: not reached) and final
    val_loss."""
    command = [sys.executable, "-c", PRETRAIN, *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "race.log", done.stdout + done.stderr)  # replaces a link, never writes through one
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"error: {shlex.join(overrides)} failed (exit {done.returncode}): {last}; its output is in "
              f"{run_dir / 'race.log'}", file=sys.stderr)
        sys.exit(done.returncode if done.returncode == 2 else 1)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    return {"target_loss": summary["target_loss"], "val_loss": summary["val_loss"],
            "seconds_to_target": summary["seconds_to_target"] if summary["reached_target"] else None}


def table(configs: dict, result: dict) -> str:
    """The race as text: a row per config, then each test and verdict."""
    head = f"{'config':<8}{'reached':>9}{'mean s':>10}  {'95% CI':<18}{'final loss':>11}  {'loss verdict':<48}"
    lines = [head + "overrides"]
    for name, overrides in configs.items():
        s, loss = result[name], result["loss"][name]
        mean = f"{s['mean_seconds']:.2f}" if s["mean_seconds"] is not None else "-"
        ci = f"{s['ci95'][0]:.2f} .. {s['ci95'][1]:.2f}" if s["ci95"] else "-"
        lines.append(f"{name.upper():<8}{s['reached']:>5}/{s['runs']:<3}{mean:>10}  {ci:<18}"
                     f"{loss['mean_val_loss']:>11.4f}  {loss['verdict']:<48}{overrides}")
    test = result["time_test"]
    if test:
        lines.append(f"time test: {test['test']}: U = {test['U']:g}, p = {test['p_value']:.3g} ({test['p_method']})")
    lines.append(f"verdict, time to target: {result['verdict']}")
    lines.append("verdict, modded-nanogpt's rule (mean final loss <= target at p < "
                 f"{result['alpha']:g}, one-sample one-sided t-test): "
                 + "; ".join(f"{n.upper()}: {result['loss'][n]['verdict']}" for n in configs))
    return "\n".join(lines)


@exit_on_user_error
def main(argv=None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = (args.out or Path("outputs") / "race" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    claim_folder(out, lambda entry: False, "a race")  # a race's folder is new (or empty): nothing in it is replaced
    configs = {"a": args.a, "b": args.b}
    runs = {}
    for name, extra in configs.items():
        runs[name] = []
        for seed in range(args.seeds):
            overrides = [*args.common, *shlex.split(extra), f"seed={seed}", f"name=race-{name}-{seed}"]
            runs[name].append(run_one(overrides, out / name / f"seed-{seed}"))
            print(f"{name.upper()} seed {seed}: seconds_to_target {runs[name][-1]['seconds_to_target']}, "
                  f"final val_loss {runs[name][-1]['val_loss']:.4f}", flush=True)
    times = {n: [r["seconds_to_target"] for r in rs] for n, rs in runs.items()}
    losses = {n: [r["val_loss"] for r in rs] for n, rs in runs.items()}
    result = compare(times["a"], times["b"])
    result["loss"] = {n: loss_test(losses[n], runs[n][0]["target_loss"]) for n in configs}
    record = {"configs": configs, "common": args.common, "seeds": args.seeds, "seconds_to_target": times,
              "final_val_loss": losses, **result}
    write_atomic(out / "race.json", json.dumps(record, indent=2))
    print(table(configs, result))
    print(f"results: {out / 'race.json'}")


if __name__ == "__main__":
    main()
