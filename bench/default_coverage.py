"""How often the default's own verdict (`seeds=auto`: health rules, the race, max_seeds=3)
holds the truth's difference in its intervals, with 95% intervals clustered by replay (issue
72); the fixed-seed grids on the same draws beside it.

    python bench/default_coverage.py --curves 'FILES*.json' [--part heldout] [--repetitions 60]
        [--policies default fixed2_health ...] [--name NAME]

Each replay is bench_cost.py's: one sweep of each policy over a recorded pool, the sweeper's
own decisions (its `draws` and `Sweep`; nothing raced again here). Its verdict is
analysis/verdict.py's on the study's trials, and every interval is the judge's
(judge/compare.py) as that verdict builds it, raced for `seeds=auto`:

- shown pairs: the best against each other configuration, what the verdict prints, at 95% and
  at the stricter level it prints them at (stats.decided_level);
- all pairs: every two configurations with a completed seed, at 95%.

The truth is bench/verdict_coverage.py's: a pair's mean seed-paired difference of final
held-out values over the recorded seeds the replay did not draw (the order's first
`most_seeds` of any policy run: the same truth for every policy on a draw), plain and with the
truth's own noise allowed for. Pairs of one replay share its seeds, so the interval of a
coverage is clustered by replay (analysis/proportions.py clustered_interval).

A pair where a drawn seed broke (the default rules stopped it; it counts at the objective's
floor, judge/configs.py) is counted apart from one where none did: a pair of the second kind is
one the sweeper before issue 72's floor judged too.

A configuration is unstable when the default health rules stop, or the run breaks, in at least
one of the pool's recorded seeds (each seed replayed alone through the same rules); a pair is
unstable when either of its configurations is.
Writes bench/results/default_coverage-<name>.json.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

import bench_cost as bc  # bench/ is on the path: this runs as a script
import optuna
from machine_info import machine
from verdict_coverage import noise_allowed, paired_spread

from analysis.proportions import clustered_interval, wilson
from analysis.verdict import racing_level, sweep_verdict
from judge import stats
from judge.compare import Judge
from judge.configs import Config
from records.sweep import State, StudyAttr, replicates

POLICIES = ("default", "fixed2_health", "fixed3_health", "fixed2", "fixed3")
WHATS = ("covered", "covered, truth noise allowed")
PRINTED = (
    "all",
    "all, unstable",
    "all, unstable, kept runs' truth",
    "all, a seed broke",
    "all, no seed broke",
    "all, scattered",
    "shown",
    "shown, unstable",
    "shown at its level, all",
)


def unstable_configs(pool: bc.Pool, eval_every: int) -> dict[str, list[int]]:
    """{configuration: the recorded seeds the default health rules stop or that break}, for
    every configuration with one: each seed replayed alone (a grid stops a configuration's
    later seeds once one breaks, which would hide them)."""
    alone = next(q for q in bc.POLICIES if q.name == "fixed1_health")
    stopped: dict[str, list[int]] = {}
    for seed in pool.seeds:
        study = bc.Sweep(pool, alone, sorted(pool.runs), [seed], f"health-{seed}", eval_every)
        for t in study.run().get_trials(deepcopy=False):
            if any(r.state != State.COMPLETE for r in replicates(t)):
                stopped.setdefault(t.user_attrs[bc.CONFIG], []).append(seed)
    return stopped


def scattered_pairs(pool: bc.Pool) -> set[frozenset[str]]:
    """bench/verdict_coverage.py's scattered half: the pairs whose seed-paired sd over every
    recorded seed is above the median of the pairs that vary (the issue's "unstable lr"
    figure, 81.7%, is theirs at 2 fixed seeds)."""
    finals = {c: {s: pool.final(c, s) for s in pool.seeds} for c in pool.runs}
    spreads = {
        frozenset(pair): paired_spread(finals, *pair) for pair in itertools.combinations(finals, 2)
    }
    varying = [x for x in spreads.values() if x > 0]
    split = statistics.median(varying) if varying else 0.0
    return {pair for pair, x in spreads.items() if x > split}


def fewest_seeds(a: Config, b: Config) -> str:
    return f"fewest seeds {min(len(a.values), len(b.values))}"


def method_of(interval: stats.Interval) -> str:
    """The judge's way to the interval, in a word: what a miss is diagnosed by."""
    if interval.method.startswith("paired by seed"):
        return "paired by seed"
    return "unpaired" if interval.method.startswith("unpaired") else "one seed"


def tallied(
    out: Counter, kinds: Sequence[str], interval: stats.Interval, diffs: list[float]
) -> None:
    """Count one interval against the truth's seed-paired differences under every kind."""
    truth = statistics.fmean(diffs)
    low, high = noise_allowed(interval, diffs)
    for kind in kinds:
        out[f"{kind} judged"] += 1
        out[f"{kind} width"] += interval.high - interval.low
        out[f"{kind} covered"] += interval.low <= truth <= interval.high
        out[f"{kind} covered, truth noise allowed"] += low <= truth <= high


def verdict_coverage(
    pool: bc.Pool,
    study: optuna.Study,
    truth_seeds: Sequence[int],
    stopped: Mapping[str, Sequence[int]],
    scattered: set[frozenset[str]] = frozenset(),
) -> Counter:
    """One replay's verdict against the truth over `truth_seeds`: per kind of pair, how many
    were judged and covered (and the intervals' summed width). stopped: `unstable_configs`.
    Besides the truth over every seed, one over the seeds whose runs the rules keep (`kept
    runs' truth`): a sweep with the rules averages only those, so on an unstable pair the
    two truths differ by the runs the rules stop."""
    trials = study.get_trials(deepcopy=False)
    name = {f"t{t.number}": t.user_attrs[bc.CONFIG] for t in trials}
    attrs = study.user_attrs
    ranked = [s.config for s in sweep_verdict(trials, attrs, True).ranked]
    judge = Judge(ranked, raced=StudyAttr.MAX_SEEDS in attrs)  # as the verdict builds it
    level = racing_level(attrs.get(StudyAttr.MAX_SEEDS), len(ranked))
    out = Counter({"configurations without a value": len(trials) - len(ranked)})
    out.update(f"in the verdict: {name[c.label]}" for c in ranked)

    def truth_diffs(a: Config, b: Config, kept: bool = False) -> list[float]:
        ca, cb = name[a.label], name[b.label]
        gone = {*stopped.get(ca, ()), *stopped.get(cb, ())} if kept else set()
        return [pool.final(ca, s)[0] - pool.final(cb, s)[0] for s in truth_seeds if s not in gone]

    def stability(a: Config, b: Config) -> str:
        return "unstable" if {name[a.label], name[b.label]} & set(stopped) else "stable"

    for a, b in itertools.combinations(ranked, 2):
        interval = judge.difference(a, b)
        if not interval.known:
            out["pairs without an interval"] += 1
            continue
        split = stability(a, b)
        scatter = (
            "scattered" if frozenset((name[a.label], name[b.label])) in scattered else "steady"
        )
        broke = "a seed broke" if a.broke or b.broke else "no seed broke"
        kinds = [
            "all",
            f"all, {split}",
            f"all, {broke}",  # a drawn seed that broke counts at the floor (issue 72)
            f"all, {fewest_seeds(a, b)}",
            f"all, {method_of(interval)}",
            f"all, {scatter}",
            *(f"all, with {name[c.label]}" for c in (a, b)),  # which configurations miss
        ]
        if a is ranked[0]:  # the best against another: what the verdict prints
            kinds += ["shown", f"shown, {split}"]
            shown = judge.difference(a, b, level)
            tallied(
                out, [f"shown at its level, {k}" for k in ("all", split)], shown, truth_diffs(a, b)
            )
        tallied(out, kinds, interval, truth_diffs(a, b))
        kept = truth_diffs(a, b, kept=True)
        if len(kept) >= 2:  # the truth's noise needs two seeds
            on_kept = [f"{k}, kept runs' truth" for k in kinds if k in ("all", "all, unstable")]
            tallied(out, on_kept, interval, kept)
    return out


def coverage(per_replay: Sequence[Counter], kind: str) -> dict:
    """A kind of pair's coverage pooled over replays, with its 95% interval clustered by
    replay (replays that judged none of the kind left out) and the Wilson one beside, which
    treats the pairs as independent."""
    judged = [c for c in per_replay if c[f"{kind} judged"]]
    n = sum(c[f"{kind} judged"] for c in judged)
    out = {"replays": len(judged), "judged": n}
    if n:
        out["mean width"] = sum(c[f"{kind} width"] for c in judged) / n
    for what in WHATS:
        hits = sum(c[f"{kind} {what}"] for c in judged)
        clusters = {
            str(i): (c[f"{kind} {what}"], c[f"{kind} judged"]) for i, c in enumerate(judged)
        }
        out[what] = {
            "covered": hits,
            "coverage": hits / n if n else None,
            "clustered": list(clustered_interval(clusters)),
            "wilson": list(wilson(hits, n)),
        }
    return out


def kinds_of(per_replay: Sequence[Counter]) -> list[str]:
    """Every kind of pair the replays judged, in a stable order."""
    return sorted(
        {k.removesuffix(" judged") for c in per_replay for k in c if k.endswith(" judged")}
    )


def shown_line(name: str, policy: str, kind: str, got: dict) -> str:
    c = got["covered"]
    low, high = c["clustered"]
    allowed = got["covered, truth noise allowed"]
    return (
        f"{name} {policy:14s} {kind:34s} {c['covered']}/{got['judged']} = {c['coverage']:.1%} "
        f"[{low:.1%}, {high:.1%}] (Wilson [{c['wilson'][0]:.1%}, {c['wilson'][1]:.1%}]); "
        f"truth noise allowed {allowed['coverage']:.1%}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", nargs="+", required=True, help="record_curves.py files (globs)")
    p.add_argument("--part", default="all", choices=["calibration", "heldout", "all"])
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument("--repetitions", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=10, help="the sweep's eval cadence")
    p.add_argument("--name", default="curves", help="results: default_coverage-<name>.json")
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    known = {q.name: q for q in (*bc.POLICIES, *bc.VARIANTS)}
    unknown = sorted(set(args.policies) - set(known))
    if unknown:
        p.error(f"--policies {' '.join(unknown)}: not among {sorted(known)}")
    policies = [known[n] for n in args.policies]
    paths = [f for pattern in args.curves for f in sorted(glob.glob(pattern))]
    results = {"machine": machine(), "eval_every": args.eval_every, "pools": {}}
    for pool in bc.load_curves(paths, args.part, None, None).values():
        drawn = max(q.most_seeds for q in policies)
        if len(pool.seeds) < drawn + 2:  # the truth needs two seeds of its own
            continue
        unstable = unstable_configs(pool, args.eval_every)
        scattered = scattered_pairs(pool)
        per_policy: dict[str, list[Counter]] = {q.name: [] for q in policies}
        for _, order, queue, name in bc.draws(pool, args.repetitions, args.seed):
            for q in policies:
                study = bc.Sweep(pool, q, queue, order, name, args.eval_every).run()
                per_policy[q.name].append(
                    verdict_coverage(pool, study, order[drawn:], unstable, scattered)
                )
        entry = {
            "configurations": sorted(pool.runs),
            "seeds": pool.seeds,
            "truth seeds a replay": len(pool.seeds) - drawn,
            "replays": args.repetitions,
            "unstable (seeds the health rules stop or that break)": unstable,
            "policies": {},
        }
        for q, rows in per_policy.items():
            got = {kind: coverage(rows, kind) for kind in kinds_of(rows)}
            got["pairs without an interval"] = sum(r["pairs without an interval"] for r in rows)
            got["configurations without a value"] = sum(
                r["configurations without a value"] for r in rows
            )
            got["replays with it in the verdict"] = {
                c: sum(r[f"in the verdict: {c}"] for r in rows) for c in sorted(pool.runs)
            }
            entry["policies"][q] = got
            for kind in PRINTED:
                if kind in got:
                    print(shown_line(pool.name, q, kind, got[kind]))
        results["pools"][pool.name] = entry
    path = bc.RESULTS / f"default_coverage-{args.name}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
