"""Racing seeds against fixed seeds, replayed from per-seed results recorded once.

    python -m sweeper -m lr=8e-4,1.5e-3,2.5e-3,5e-3 hydra.sweeper.seeds=8 max_steps=20 \
        batch_size=16 group_size=4 task.eval_size=200 eval_every=0 'hydra.sweeper.health=[]' \
        hydra.sweeper.study_name=racing-truth-20               # the truth: 8 seeds each
    python bench/bench_racing.py --storage sqlite:///sweeps.db --study racing-truth-20

The sweeper gives every configuration the same seeds (sweeper/sweep/flights.py seeds_of), and
a seed fixes the problems drawn, the sampling noise and the LoRA init, so a sweep is replayed
as the sweeper draws: one random order of the recorded seed indices shared by every
configuration (a replay is a sweep started at another base seed), the configurations queued
in a random order, and judged in a random order too (the verdict's sort is stable: ties are
broken at random). Every arm sees the same draws: fixed seeds=2, 3 and 5 take the first 2, 3,
5 seeds of the order; racing (seeds=auto, max_seeds=5) runs the decisions of
sweeper/sweep/racing.py in the order sweeper/sweep/loop.py makes them with one lane, paired by
seed as the sweeper races ("racing"), and unpaired as it raced before ("racing_unpaired", the
seeds hidden from the race and the verdict). Every arm is judged by the same rule at the same
level: analysis/verdict.py as it judges a raced study with max_seeds=5 (paired by seed, or
unpaired for the unpaired arm; variance at its upper bound, the decided level for the grid's
configurations).

Per arm: best-pick rate, strict (the verdict's best is the truth's best) and within ties (or
one the truth calls tied with it), each with its 95% Wilson interval over replays, regret
(the truth's best mean minus the pick's), runs, and both error types: "decided" a pair the truth calls tied (means within 2 standard errors of their
difference), and "tied" a pair whose true difference exceeds the minimal difference that
counts (the eval's standard error, averaged over the truth's seeds); for racing also the
races stopped as tied whose true difference exceeds it. Replays share the recorded pool, so
they are not independent draws of new training runs: say so with the numbers.
`pairing` compares, on the same draws with fixed seeds=2 and 3, the 95% intervals of every
pair's difference made paired by seed (blocked over every configuration, and per-seed
differences) and unpaired (Welch): coverage of the truth's difference and mean width.
Writes bench/results/racing_<study>.json, every replay seed's summary and every replay.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import deque
from pathlib import Path

import optuna
from machine_info import machine  # bench/ is on the path: this runs as a script

from analysis.proportions import wilson
from analysis.verdict import verdict
from judge import blocked, stats
from judge.configs import Config, Seed, config
from judge.race import HOLD, SEED, STOP, decide, minimal_difference
from judge.stats import MIN_SEEDS, mean_and_stderr, z_quantile
from records.sweep import replicates

RESULTS = Path(__file__).resolve().parent / "results"
MAX_SEEDS = 5
FIXED = (2, 3, 5)
ARMS = tuple(f"fixed{n}" for n in FIXED) + ("racing", "racing_unpaired")
UNPAIRED = 1000  # seed offset per configuration that hides the shared seeds (unpaired arms)

Draw = tuple[float, float | None]  # a seed's value and its eval stderr
Drawn = tuple[int, float, float | None]  # (seed index in the truth, value, eval stderr)


def recorded_draws(storage: str, study: str) -> dict[str, list[Draw]]:
    """{configuration label: its completed seeds (value, eval stderr)} from the truth study."""
    s = optuna.load_study(study_name=study, storage=storage)
    out = {}
    for t in s.get_trials(deepcopy=False):
        done = [r for r in replicates(t) if r.state == "COMPLETE"]
        if len(done) >= MAX_SEEDS:
            out[f"lr={t.params['lr']:g}"] = [(r.value, r.stderr) for r in done]
    return out


def entry(c: str, drawn: list[Drawn], paired: bool) -> Config:
    return config(c, [v for _, v, _ in drawn], [s for s, _, _ in drawn] if paired else ())


def race(draws: dict[str, list[Drawn]], max_seeds: int, min_difference: float | None, paired: bool):
    """One grid sweep with seeds=auto and one lane, the configurations queued in the order of
    `draws`: (the seeds each configuration got, why each stopped). min_difference None: the
    race's default, from the stderrs run so far. paired: the race sees the seeds."""
    got: dict[str, list[Drawn]] = {c: [] for c in draws}
    why: dict[str, str] = {}
    queue, pending, held, open_ = deque(draws), deque(), set(), set()

    def settle(c: str) -> None:
        others = [entry(o, d, paired) for o, d in got.items() if o != c and d]
        to_come = bool(queue) or any(len(got[o]) < MIN_SEEDS for o in open_ if o != c)
        low = min_difference
        if low is None:
            low = minimal_difference([e for d in got.values() for _, _, e in d])
        me = entry(c, got[c], paired)
        step = decide(me, others, max_seeds, True, to_come, len(draws), low)
        held.discard(c)
        if step.action == SEED:
            pending.appendleft(c)
        elif step.action == HOLD:
            held.add(c)
        elif step.action == STOP:
            open_.discard(c)
            why[c] = step.why
            for h in list(held):
                settle(h)

    while True:
        if pending:
            c = pending.popleft()
            got[c].append(draws[c][len(got[c])])
            if c not in pending:  # all its started seeds ended
                settle(c)
        elif queue:
            c = queue.popleft()
            open_.add(c)
            pending.extend([c] * MIN_SEEDS)
        elif held:
            for h in list(held):
                settle(h)
        else:
            return got, why


def judged(got: dict[str, list[Drawn]], paired: bool = True):
    """The one rule every arm is judged by: the raced verdict at max_seeds=MAX_SEEDS, the
    configurations in the order of `got` (ties broken by it). Unpaired: each configuration's
    seeds moved apart, so none is shared."""
    configs = [
        Config(c, {}, tuple(Seed(s + (0 if paired else UNPAIRED * i), v, None) for s, v, _ in d))
        for i, (c, d) in enumerate(got.items())
    ]
    return verdict(configs, True, MAX_SEEDS)


class Truth:
    """What the recorded seeds say: each configuration's mean, the pairs it calls tied, and
    the minimal difference that counts."""

    def __init__(self, draws: dict[str, list[Draw]]):
        self.values = {c: [v for v, _ in d] for c, d in draws.items()}
        self.means = {c: sum(v) / len(v) for c, v in self.values.items()}
        self.best = max(self.means, key=self.means.get)
        self.min_difference = minimal_difference([e for d in draws.values() for _, e in d])
        self.ties = set()
        for a in self.values:
            for b in self.values:
                (ma, sa), (mb, sb) = (
                    mean_and_stderr(self.values[a]),
                    mean_and_stderr(self.values[b]),
                )
                if a < b and abs(ma - mb) < 2 * math.hypot(sa, sb):
                    self.ties.add(frozenset((a, b)))

    def gap(self, a: str, b: str) -> float:
        return abs(self.means[a] - self.means[b])


def scored(truth: Truth, got: dict[str, list[Drawn]], paired: bool = True) -> dict:
    """One arm's replay by the common rule: its pick, runs and both error types."""
    v = judged(got, paired)
    pick = v.best.label
    decided = [s.label for s in v.ranked[1:] if s.label not in v.tied_with_best]
    return {
        "pick": pick,
        "strict": pick == truth.best,
        "within_ties": pick == truth.best or frozenset((pick, truth.best)) in truth.ties,
        "runs": sum(len(x) for x in got.values()),
        "regret": truth.means[truth.best] - truth.means[pick],
        "decided_truth_tie": sum(frozenset((pick, o)) in truth.ties for o in decided),
        "tied_beyond_min": sum(truth.gap(pick, o) > truth.min_difference for o in v.tied_with_best),
    }


def drawn(draws: dict[str, list[Draw]], rng: random.Random) -> dict[str, list[Drawn]]:
    """One replay's draws as the sweeper makes them: one order of the seed indices shared by
    every configuration, the configurations in a random order."""
    seeds = min(len(d) for d in draws.values())
    order = rng.sample(range(seeds), seeds)
    configs = rng.sample(list(draws), len(draws))
    return {c: [(s, *draws[c][s]) for s in order] for c in configs}


def run(truth: Truth, draws: dict[str, list[Draw]], reps: int, seed: int, low) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for rep in range(reps):
        order = drawn(draws, rng)
        row = {
            "seed": seed,
            "replay": rep,
            "queue": list(order),
            "seeds": [s for s, *_ in next(iter(order.values()))],
        }
        for n in FIXED:
            row[f"fixed{n}"] = scored(truth, shuffled({c: d[:n] for c, d in order.items()}, rng))
        for arm, paired in (("racing", True), ("racing_unpaired", False)):
            got, why = race(order, MAX_SEEDS, low, paired)
            row[arm] = scored(truth, shuffled(got, rng), paired)
            row[arm]["abandoned_beyond_min"] = sum(
                w.startswith("tied with ") and truth.gap(c, w.split()[2]) > truth.min_difference
                for c, w in why.items()
            )
            row[f"{arm}_seeds"] = {c: len(v) for c, v in got.items()}
        row["pairing"] = pairing(truth, order)
        rows.append(row)
    return rows


def shuffled(got: dict, rng: random.Random) -> dict:
    """The configurations in a random order: the verdict breaks ties by it."""
    return {c: got[c] for c in rng.sample(list(got), len(got))}


PAIRINGS = ("blocked", "blocked_raised", "per_seed", "welch")


def pairing(truth: Truth, order: dict[str, list[Drawn]]) -> dict:
    """Fixed seeds=2 and 3: for every pair, whether each method's 95% interval covers the
    truth's difference, and its width."""
    out = {}
    for n in (2, 3):
        by_seed = {c: {s: v for s, v, _ in d[:n]} for c, d in order.items()}
        fit = blocked.blocked_fit(by_seed)
        raised = blocked.blocked_bound(fit)
        cover = {m: [] for m in PAIRINGS}
        width = {m: [] for m in PAIRINGS}
        for a in by_seed:
            for b in by_seed:
                if a >= b:
                    continue
                made = {
                    "blocked": fit.difference(a, b),
                    "blocked_raised": raised.difference(a, b),
                    "per_seed": blocked.per_seed_difference(by_seed[a], by_seed[b]),
                    "welch": stats.welch_difference(
                        list(by_seed[a].values()), list(by_seed[b].values())
                    ),
                }
                true = truth.means[a] - truth.means[b]
                for m, i in made.items():
                    if i is None:  # no spread to pair on: the verdict goes unpaired
                        i = made["welch"]
                    cover[m].append(i.low <= true <= i.high)
                    width[m].append(i.high - i.low)
        out[n] = {
            m: [sum(cover[m]), len(cover[m]), sum(width[m]) / len(width[m])] for m in PAIRINGS
        }
    return out


def paired(a: list[float], b: list[float]) -> list[float]:
    """mean(a - b) and its 95% normal interval over replays (the same draws for both)."""
    mean, se = mean_and_stderr([x - y for x, y in zip(a, b, strict=True)])
    half = z_quantile() * se
    return [mean, mean - half, mean + half]


def summary(truth: Truth, rows: list[dict]) -> dict:
    out = {}
    best = {arm: [float(r[arm]["strict"]) for r in rows] for arm in ARMS}
    within = {arm: [float(r[arm]["within_ties"]) for r in rows] for arm in ARMS}
    for arm in ARMS:
        got = [r[arm] for r in rows]
        runs = [g["runs"] for g in got]
        regret = mean_and_stderr([g["regret"] for g in got])
        out[arm] = {
            "best_pick_rate": sum(best[arm]) / len(rows),
            "best_pick_95": wilson(int(sum(best[arm])), len(rows)),
            "within_ties_rate": sum(within[arm]) / len(rows),
            "within_ties_95": wilson(int(sum(within[arm])), len(rows)),
            "regret_mean": regret[0],
            "regret_stderr": regret[1],
            "runs_mean": sum(runs) / len(runs),
            "runs_range": [min(runs), max(runs)],
            "decided_truth_tie": sum(g["decided_truth_tie"] for g in got),
            "tied_beyond_min": sum(g["tied_beyond_min"] for g in got),
        }
    regrets = {arm: [r[arm]["regret"] for r in rows] for arm in ARMS}
    for arm in ("racing", "racing_unpaired"):
        out[arm]["abandoned_beyond_min"] = sum(r[arm]["abandoned_beyond_min"] for r in rows)
        for n in FIXED:
            out[arm][f"runs_share_of_fixed{n}"] = (
                out[arm]["runs_mean"] / out[f"fixed{n}"]["runs_mean"]
            )
    for arm in ("racing", "racing_unpaired"):
        for n in FIXED:
            out[f"{arm}_minus_fixed{n}_best_pick"] = paired(best[arm], best[f"fixed{n}"])
            out[f"{arm}_minus_fixed{n}_within_ties"] = paired(within[arm], within[f"fixed{n}"])
            out[f"{arm}_minus_fixed{n}_regret"] = paired(regrets[arm], regrets[f"fixed{n}"])
    out["pairing"] = {
        str(n): {
            m: {
                "coverage": sum(r["pairing"][n][m][0] for r in rows)
                / sum(r["pairing"][n][m][1] for r in rows),
                "mean_width": sum(r["pairing"][n][m][2] for r in rows) / len(rows),
            }
            for m in PAIRINGS
        }
        for n in (2, 3)
    }
    return out


def report(draws: dict[str, list[Draw]], reps: int, seeds, low) -> dict:
    truth = Truth(draws)
    per_seed = {s: run(truth, draws, reps, s, low) for s in seeds}
    rows = [r for s in seeds for r in per_seed[s]]
    return {
        "machine": machine(),
        "truth": {
            c: {"mean": truth.means[c], "values": [v for v, _ in d], "stderrs": [e for _, e in d]}
            for c, d in draws.items()
        },
        "truth_best": truth.best,
        "truth_ties": sorted(sorted(p) for p in truth.ties),
        "min_difference_truth": truth.min_difference,
        "min_difference_race": "eval stderr (default)" if low is None else low,
        "max_seeds": MAX_SEEDS,
        "repetitions": reps,
        "replay_seeds": list(seeds),
        "all": summary(truth, rows),
        "by_seed": {str(s): summary(truth, per_seed[s]) for s in seeds},
        "rows": rows,
    }


def draws_from_results(path: str, eval_size: int | None) -> dict[str, list[Draw]]:
    """The truth's per-seed values as an earlier run of this script recorded them; truths
    recorded before stderrs were get the exact-match reward's, sqrt(p (1 - p) / (n - 1))
    over eval_size problems."""
    truth = json.loads(Path(path).read_text())["truth"]
    out = {}
    for c, t in truth.items():
        stderrs = t.get("stderrs") or [
            math.sqrt(v * (1 - v) / (eval_size - 1)) if eval_size else None for v in t["values"]
        ]
        out[c] = list(zip(t["values"], stderrs, strict=True))
    return out


def dumped(out: dict) -> str:
    """The results as JSON, one replay per line (thousands of them)."""
    head = json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1)
    rows = ",\n".join(f"  {json.dumps(r)}" for r in out["rows"])
    return f'{head[:-2]},\n "rows": [\n{rows}\n ]\n}}\n'


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default="sqlite:///sweeps.db")
    p.add_argument("--study", default="racing-truth-20")
    p.add_argument(
        "--values-from",
        help="replay the truth recorded in this results JSON (no study needed), e.g. "
        "bench/results/racing_racing-truth.json",
    )
    p.add_argument(
        "--eval-size",
        type=int,
        help="with --values-from a truth recorded without stderrs: its task.eval_size",
    )
    p.add_argument("--min-difference", type=float, help="default: the eval's stderr")
    p.add_argument("--repetitions", type=int, default=200)
    p.add_argument("--seed", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", help="default: bench/results/racing_<study>.json")
    p.add_argument("--name", help="with --values-from: the results' name (racing_<name>.json)")
    args = p.parse_args()
    if args.values_from:
        draws = draws_from_results(args.values_from, args.eval_size)
    else:
        draws = recorded_draws(args.storage, args.study)
    out = report(draws, args.repetitions, args.seed, args.min_difference)
    path = Path(args.out) if args.out else RESULTS / f"racing_{args.name or args.study}.json"
    path.write_text(dumped(out))
    print(json.dumps(out["all"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
