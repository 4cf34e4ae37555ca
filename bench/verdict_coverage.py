"""How often the verdict's 95% interval for a difference covers the truth's difference, replayed
on the recorded-curve library (bench/record_curves.py) as the sweeper runs a grid: every
configuration gets the same seeds (`seeds_of`: one draw shared by all), the verdict fits them
with analysis/verdict.py's own `blocked` and `difference` (paired by seed where it can).

    python bench/verdict_coverage.py [--seeds 2 3] [--replays 2000] [--part heldout]

A configuration is one (task, lr); a replay draws n of the recorded seeds (shared across the
configurations) and checks, for every pair, whether the interval holds the truth's difference,
the truth being the mean final held-out value over the recorded seeds the replay did not draw
(independent of it). The truth is itself a mean of a few seeds: its own noise makes the
measured coverage an underestimate, and pairs of one replay share their seeds, so the Wilson
interval over pairs is narrower than the replays warrant.
Writes bench/results/verdict_coverage.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections import defaultdict
from pathlib import Path

from analysis.rule_replay import load_library, wilson
from analysis.verdict import Config, Seed, blocked, difference

RESULTS = Path(__file__).resolve().parent / "results"


def pools(part: str | None) -> dict[str, dict[str, dict[int, tuple[float, float]]]]:
    """{task: {lr: {seed: (final held-out value, its stderr)}}} from the library."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for run in load_library([RESULTS / "curves"], part):
        if run.error:
            continue
        model, rest = run.run.split("-", 1)
        task, lr, seed = rest.rsplit("-", 2)
        last = run.steps[run.last_step]
        value = last.get(run.heldout_metric)
        if value is None:
            continue
        stderr = last.get("eval/reward/stderr", float("nan"))
        out[f"{model}-{task}"][lr][int(seed.removeprefix("seed"))] = (value, stderr)
    return out


def replay(pool: dict[str, dict[int, tuple[float, float]]], n: int, rng: random.Random) -> tuple:
    """(pairs covered, pairs judged) for one draw of n seeds shared by every configuration."""
    common = sorted(set.intersection(*(set(seeds) for seeds in pool.values())))
    drawn = rng.sample(common, n)
    rest = [s for s in common if s not in drawn]  # the truth: seeds the replay never saw
    truth = {lr: sum(seeds[s][0] for s in rest) / len(rest) for lr, seeds in pool.items()}
    configs = [Config(lr, {"lr": lr}, tuple(Seed(s, *pool[lr][s]) for s in drawn)) for lr in pool]
    fit = blocked(configs)
    covered = judged = 0
    for a, b in itertools.combinations(configs, 2):
        interval = difference(a, b, paired=fit)
        judged += 1
        covered += interval.low <= truth[a.label] - truth[b.label] <= interval.high
    return covered, judged


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    p.add_argument("--replays", type=int, default=2000)
    p.add_argument("--part", choices=["calibration", "heldout"], help="default: every run")
    args = p.parse_args(argv)
    rng = random.Random(0)
    out = {}
    for name, pool in sorted(pools(args.part).items()):
        common = set.intersection(*(set(s) for s in pool.values()))
        for n in args.seeds:
            if len(common) < n + 2:  # the truth needs two seeds of its own
                continue
            covered = judged = 0
            for _ in range(args.replays):
                c, j = replay(pool, n, rng)
                covered, judged = covered + c, judged + j
            low, high = wilson(covered, judged)
            out[f"{name} seeds={n}"] = {
                "configurations": len(pool),
                "recorded_seeds": sorted(common),
                "covered": covered,
                "pairs_judged": judged,
                "coverage": covered / judged,
            }
            print(
                f"{name} seeds={n} ({len(pool)} lrs, truth over {len(common)} seeds): "
                f"{covered}/{judged} = {covered / judged:.1%} [{low:.1%}, {high:.1%}]"
            )
    (RESULTS / "verdict_coverage.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
