"""How often the verdict's 95% interval for a difference covers the truth's difference, replayed
on the recorded-curve library (bench/record_curves.py) as the sweeper runs a grid: every
configuration gets the same seeds (`seeds_of`: one draw shared by all), the verdict fits them
with the judge's own comparison (judge/compare.py, paired by seed where it can).

    python bench/verdict_coverage.py [--seeds 2 3] [--replays 300] [--part heldout]
        [--library FOLDER_OR_FILES ...] [--prior-df N] [--out NAME]

A configuration is one (task, lr); a replay draws n of the recorded seeds (shared across the
configurations) and checks, for every pair, whether the interval holds the truth's difference,
the truth being the mean final held-out value over the recorded seeds the replay did not draw
(independent of it). The truth is itself a mean over finitely many seeds: its own noise makes
the plain coverage an underestimate of the coverage of the expected difference, which is what
the interval is for; the second figure allows for that noise (see `replay`). Pairs of one replay
share their seeds, so a coverage's interval is clustered by replay (the Wilson one over pairs,
beside it in the results, is narrower than the replays warrant).
Writes bench/results/verdict_coverage.json (or --out).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from analysis.proportions import clustered_interval, wilson
from analysis.rule_replay import load_library
from judge import blocked, stats
from judge.compare import Judge
from judge.configs import Config, Seed

RESULTS = Path(__file__).resolve().parent / "results"


def pools(
    part: str | None, library: list[Path]
) -> dict[str, dict[str, dict[int, tuple[float, float]]]]:
    """{task: {lr: {seed: (final held-out value, its stderr)}}} from the library."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for run in load_library(library, part):
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


def paired_spread(pool: dict[str, dict[int, tuple[float, float]]], a: str, b: str) -> float:
    """The sd of a pair's seed-paired differences over every common seed."""
    common = sorted(set(pool[a]) & set(pool[b]))
    return statistics.stdev(pool[a][s][0] - pool[b][s][0] for s in common)


def noise_allowed(interval: stats.Interval, truth_diffs: list[float]) -> tuple[float, float]:
    """The interval widened, in quadrature, by 1.96 standard errors of the truth's mean
    difference over its seeds (`truth_diffs`, one a seed): the truth is a mean of finitely
    many seeds, not the expectation the interval is for."""
    truth_se = statistics.stdev(truth_diffs) / math.sqrt(len(truth_diffs))
    low = interval.estimate - math.hypot(interval.estimate - interval.low, 1.96 * truth_se)
    high = interval.estimate + math.hypot(interval.high - interval.estimate, 1.96 * truth_se)
    return low, high


def replay(
    pool: dict[str, dict[int, tuple[float, float]]], n: int, rng: random.Random, split: float
) -> Counter:
    """One draw of n seeds shared by every configuration: per pair, whether the verdict's
    interval holds the truth's difference, plainly and with the truth's own noise allowed for
    (`noise_allowed`), over every pair and over the pairs whose values vary (not both constant,
    e.g. two lrs collapsed to 0 at every seed, which any interval covers), and those split at
    `split` into steady and scattered pairs by their seed-paired spread: the blocked fit judges
    every pair with one pooled residual variance, so its coverage differs between the two."""
    common = sorted(set.intersection(*(set(seeds) for seeds in pool.values())))
    drawn = rng.sample(common, n)
    rest = [s for s in common if s not in drawn]  # the truth: seeds the replay never saw
    configs = [Config(lr, {"lr": lr}, tuple(Seed(s, *pool[lr][s]) for s in drawn)) for lr in pool]
    judge = Judge(configs, raced=False)
    out: Counter = Counter()
    for a, b in itertools.combinations(configs, 2):
        interval = judge.difference(a, b)
        diffs = [pool[a.label][s][0] - pool[b.label][s][0] for s in rest]
        truth = statistics.fmean(diffs)
        low, high = noise_allowed(interval, diffs)
        varies = len({pool[c.label][s][0] for c in (a, b) for s in common}) > 1
        scatter = "scattered" if paired_spread(pool, a.label, b.label) > split else "steady"
        for kind in ("all", "varying", scatter) if varies else ("all",):
            out[f"{kind} judged"] += 1
            out[f"{kind} width"] += interval.high - interval.low
            out[f"{kind} covered"] += interval.low <= truth <= interval.high
            out[f"{kind} covered, truth noise allowed"] += low <= truth <= high
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    p.add_argument("--replays", type=int, default=300)
    p.add_argument("--part", choices=["calibration", "heldout"], help="default: every run")
    p.add_argument("--library", type=Path, nargs="+", default=[RESULTS / "curves"])
    p.add_argument("--out", default="verdict_coverage.json", help="file name under bench/results")
    p.add_argument(
        "--prior-df", type=float, default=blocked.PRIOR_DF, help="the moderation's (to choose it)"
    )
    args = p.parse_args(argv)
    blocked.PRIOR_DF = args.prior_df  # judge.blocked.moderated reads it at each call
    rng = random.Random(0)
    out = {}
    for name, pool in sorted(pools(args.part, args.library).items()):
        common = set.intersection(*(set(s) for s in pool.values()))
        for n in args.seeds:
            if len(common) < n + 2:  # the truth needs two seeds of its own
                continue
            spreads = [paired_spread(pool, a, b) for a, b in itertools.combinations(pool, 2)]
            split = statistics.median(x for x in spreads if x > 0)  # among the varying pairs
            per_replay = [replay(pool, n, rng, split) for _ in range(args.replays)]
            counts = sum(per_replay, Counter())
            entry = {
                "configurations": len(pool),
                "recorded_seeds": sorted(common),
                "prior_df": args.prior_df,
                "split: seed-paired sd": split,
            }
            for kind in ("all", "varying", "steady", "scattered"):
                judged = counts[f"{kind} judged"]
                entry[f"{kind} pairs: mean width"] = counts[f"{kind} width"] / max(judged, 1)
                for what in ("covered", "covered, truth noise allowed"):
                    covered = counts[f"{kind} {what}"]
                    clusters = {
                        str(i): (c[f"{kind} {what}"], c[f"{kind} judged"])
                        for i, c in enumerate(per_replay)
                        if c[f"{kind} judged"]
                    }
                    low, high = clustered_interval(clusters)
                    entry[f"{kind} pairs: {what}"] = {
                        "covered": covered,
                        "judged": judged,
                        "coverage": covered / judged,
                        "clustered by replay": [low, high],
                        "wilson": list(wilson(covered, judged)),
                    }
                    print(
                        f"{name} seeds={n} ({len(pool)} lrs, truth over {len(common) - n} seeds),"
                        f" {kind} pairs, {what}: {covered}/{judged} = {covered / judged:.1%}"
                        f" [{low:.1%}, {high:.1%}] clustered by replay"
                    )
            out[f"{name} seeds={n}"] = entry
    (RESULTS / args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
