"""The race and the verdict say the same thing: on the cost benchmark's recorded pools (each
held-out set of seeds, each task, the default policy), replayed as the product runs a grid, no
configuration the race stopped is then named the best or tied with it by the verdict, and one
the race eliminated as worse than a leader ranks below that leader. One judge (judge/compare.py)
makes both decisions; this holds it to that on real curves, not only on hand-made ones."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import optuna
import pytest

from analysis.verdict import sweep_verdict
from records.sweep import TrialAttr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_cost as bc  # noqa: E402  (bench/ is scripts, not a package)

pytestmark = pytest.mark.slow

CURVES = Path(__file__).resolve().parents[1] / "bench" / "results" / "curves"
# The held-out sets of bench/COST.md: 23 seeds each, seeds 35-79 ... 219-263 (odd from 23 on)
HELD_OUT = [range(start, start + 45, 2) for start in (35, 81, 127, 173, 219)]
TASKS = ("addition", "addition_length")
REPLAYS = 1  # a seed order and queue a pool is replayed in (11 pools, 10 configurations each)
STOPPED = ("eliminated", "cannot beat")
TIED = "Tied at this sample size: "


def pools() -> list[bc.Pool]:
    found = []
    for task in TASKS:
        for seeds in HELD_OUT:
            paths = [str(p) for s in seeds for p in CURVES.glob(f"tiny-{task}-lr*-seed{s}.json")]
            (pool,) = bc.load_curves(paths, "all", None, None).values()
            pool.name = f"{pool.name}-seeds{seeds.start}"
            found.append(pool)
    smollm2 = [str(p) for p in CURVES.glob("smollm2-*.json")]
    return [*found, *bc.load_curves(smollm2, "all", None, None).values()]


def test_no_configuration_the_race_stopped_is_the_verdicts_best_or_tied_with_it():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    bc.memoized_forecasts()
    (ours,) = [p for p in bc.POLICIES if p.name == "ours"]  # the product's default
    checked = stopped = 0
    for pool in pools():
        rng = random.Random(0)
        for rep in range(REPLAYS):
            order = rng.sample(pool.seeds, len(pool.seeds))
            queue = rng.sample(sorted(pool.runs), len(pool.runs))
            study = bc.Sweep(pool, ours, queue, order, f"{pool.name}-{rep}", 10).run()
            trials = study.get_trials(deepcopy=False)
            v = sweep_verdict(trials, study.user_attrs, True)
            ranked = [s.label for s in v.ranked]
            for t in trials:
                race, label = t.user_attrs.get(TrialAttr.RACE, ""), f"t{t.number}"
                if not race.startswith(STOPPED):
                    continue
                stopped += 1
                where = f"{pool.name} replay {rep}: {label} ({race})"
                assert v.best is None or v.best.label != label, f"{where} is the best: {v.decision}"
                if v.decision.startswith(TIED):  # "Tied at this sample size: t0, t1 and t2; ..."
                    group = re.findall(r"t\d+", v.decision.removeprefix(TIED).split(";")[0])
                    assert label not in group, f"{where} is tied with the best: {v.decision}"
                leader = race.split(": ")[1].split()[0] if race.startswith("eliminated") else ""
                if leader in ranked and label in ranked:
                    assert ranked.index(leader) < ranked.index(label), f"{where}: {ranked}"
            checked += 1
    assert checked == REPLAYS * (len(TASKS) * len(HELD_OUT) + 1)
    assert stopped > 0  # the race did stop configurations: the check had something to check
