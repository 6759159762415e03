"""Time-to-target race: is recipe B faster than recipe A to a validation loss, beyond seed noise?

    python scripts/race.py --a "train.lr=1e-3" --b "train.lr=2e-3" --seeds 5 --out outputs/race/lr \
        arch=crammed-bert-tiny impl=cpu train=cpu-smoke data=sanity budget=0.05 \
        train.validate_every_minutes=0.01 train.target_loss=7.2

Runs `pretrain.py <common overrides> <config's overrides> seed=<i>` for i = 0..N-1, for A then B, each into
<out>/<a|b>/seed-<i>, and reads seconds_to_target from each train_summary.json (train.target_loss: the budget
clock at the first validation at or below the target). Prints each config's mean with a 95 % confidence interval
(t distribution) and a one-sided Welch t-test that B's mean time is smaller than A's; the claim "faster" needs
p < 0.01 (modded-nanogpt's rule for a new record). Writes <out>/race.json.

Runs that never reached the target (budget or train.max_steps ran out) are counted and reported, and left out of
the means and the test. So that leaving them out cannot flatter B, B is only called faster when every B run reached
the target; A's misses are left out too, which can only make A look faster (the claim stays conservative).
"""

import argparse
import json
import math
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALPHA = 0.01  # modded-nanogpt: a new record must be faster with p < 0.01


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad input is one line and exit code 2, not argparse's usage block."""
        print(f"error: {message} (python scripts/race.py --help)", file=sys.stderr)
        sys.exit(2)


def parse(argv):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="config A's pretrain.py overrides, quoted as one argument")
    p.add_argument("--b", required=True, help="config B's pretrain.py overrides (the challenger)")
    p.add_argument("--seeds", type=int, default=5, help="runs per config, seed=0..N-1 (at least 2)")
    p.add_argument("--out", type=Path, default=None, help="folder of the runs and race.json; default "
                   "outputs/race/<time>")
    p.add_argument("common", nargs="*", help="pretrain.py overrides for both configs (train.target_loss=...)")
    args = p.parse_args(argv)
    if args.seeds < 2:
        p.error(f"--seeds={args.seeds} is too few: a confidence interval and a t-test need at least 2 runs per "
                "config, e.g. --seeds 5")
    for name in ("a", "b"):
        overrides = [*args.common, *shlex.split(getattr(args, name))]
        if not any(o.startswith("train.target_loss=") for o in overrides):
            p.error(f"config {name.upper()} has no train.target_loss: give it in the common overrides, e.g. "
                    "train.target_loss=3.5 train.validate_every_minutes=1")
    return args


def summary_stats(times: list) -> dict:
    """One config: how many runs reached the target, and the mean of those that did with its 95 % CI."""
    from scipy import stats

    reached = [t for t in times if t is not None]
    n = len(reached)
    mean = sum(reached) / n if n else None
    half = None
    if n >= 2:
        sd = math.sqrt(sum((t - mean) ** 2 for t in reached) / (n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"runs": len(times), "reached": n, "mean_seconds": mean, "ci95_half_width": half,
            "ci95": [mean - half, mean + half] if half is not None else None}


def compare(a: list, b: list, alpha: float = ALPHA) -> dict:
    """A and B's seconds_to_target per seed (None: not reached): each config's stats, and the one-sided Welch
    t-test of "B's mean time is smaller than A's" on the runs that reached the target, with the verdict."""
    from scipy import stats

    result = {"a": summary_stats(a), "b": summary_stats(b), "alpha": alpha, "t": None, "p_value": None}
    a_in, b_in = [t for t in a if t is not None], [t for t in b if t is not None]
    if len(a_in) < 2 or len(b_in) < 2:
        result["verdict"] = "not tested: fewer than 2 runs of a config reached the target"
        return result
    test = stats.ttest_ind(a_in, b_in, equal_var=False, alternative="greater")  # A's times greater: B faster
    result["t"], result["p_value"] = float(test.statistic), float(test.pvalue)
    missed = len(b) - len(b_in)
    if result["p_value"] < alpha and not missed:
        result["verdict"] = f"B faster (p < {alpha:g})"
    elif result["p_value"] < alpha:
        result["verdict"] = f"B not shown faster: {missed} of its runs did not reach the target"
    else:
        result["verdict"] = f"B not shown faster (p = {result['p_value']:.3g})"
    return result


def run_one(overrides: list, run_dir: Path) -> float | None:
    """One pretrain.py run; its seconds_to_target, or None when it did not reach the target."""
    command = [sys.executable, str(REPO / "pretrain.py"), *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    (run_dir / "race.log").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "race.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"error: {shlex.join(overrides)} failed (exit {done.returncode}): {last}; its output is in "
              f"{run_dir / 'race.log'}", file=sys.stderr)
        sys.exit(done.returncode if done.returncode == 2 else 1)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    return summary["seconds_to_target"] if summary["reached_target"] else None


def table(configs: dict, result: dict) -> str:
    """The race as text: a row per config, then the test's line."""
    lines = [f"{'config':<8}{'reached':>9}{'mean s':>10}  95% CI            overrides"]
    for name, overrides in configs.items():
        s = result[name]
        mean = f"{s['mean_seconds']:.2f}" if s["mean_seconds"] is not None else "-"
        ci = (f"{s['ci95'][0]:.2f} .. {s['ci95'][1]:.2f}" if s["ci95"] else "-")
        lines.append(f"{name.upper():<8}{s['reached']:>5}/{s['runs']:<3}{mean:>10}  {ci:<18}{overrides}")
    if result["p_value"] is not None:
        lines.append(f"one-sided Welch t-test, B faster than A: t = {result['t']:.3f}, p = {result['p_value']:.3g}")
    lines.append(f"verdict: {result['verdict']} (runs that missed the target are left out of means and test)")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = args.out or REPO / "outputs" / "race" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    configs = {"a": args.a, "b": args.b}
    times = {}
    for name, extra in configs.items():
        times[name] = []
        for seed in range(args.seeds):
            overrides = [*args.common, *shlex.split(extra), f"seed={seed}", f"name=race-{name}-{seed}"]
            times[name].append(run_one(overrides, out / name / f"seed-{seed}"))
            print(f"{name.upper()} seed {seed}: seconds_to_target {times[name][-1]}", flush=True)
    result = compare(times["a"], times["b"])
    record = {"configs": configs, "common": args.common, "seeds": args.seeds, "seconds_to_target": times, **result}
    out.mkdir(parents=True, exist_ok=True)
    (out / "race.json").write_text(json.dumps(record, indent=2))
    print(table(configs, result))
    print(f"results: {out / 'race.json'}")


if __name__ == "__main__":
    main()
