"""A seed a health rule stopped counts at the objective's floor (issue 72), on hand-made records:
the configuration's outcome, how the judge counts and compares it, what the race does next, and
what the verdict prints. The replayed sweeps are in test_bench_cost.py; a real CLI sweep whose
configuration breaks on every seed is in test_sweeper_cli.py."""

from __future__ import annotations

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from analysis.verdict import interval_cells, sweep_verdict, verdict
from judge import race, stats
from judge.compare import Judge
from judge.configs import Config, Seed, break_floor, config_of, configs_from_trials
from records.sweep import Replicate, State, StudyAttr, replicate_key
from sweeper.sweep import racing
from sweeper.sweep.tell import combine

KL = {"rule": "post_update_kl", "check": "post_update_kl", "step": 6, "action": "prune"}
FORECAST = {"rule": "forecast", "check": "forecast", "step": 6, "action": "prune"}


def record(seed: int, state: str, value=None, breach=None, steps=10) -> Replicate:
    reason = "kl above its bound" if state == State.PRUNED else ""
    return Replicate(seed, state, value, 0.02, steps, 0.2, reason, None, breach)


def trial(number: int, state: TrialState, *records: Replicate, lr: float = 1e-3):
    attrs = {replicate_key(r.seed): r.as_attr() for r in records}
    value = None
    if state == TrialState.COMPLETE:
        value = sum(r.value if r.value is not None else 0.0 for r in records) / len(records)
    t = create_trial(
        state=state,
        value=value,
        params={"lr": lr},
        distributions={"lr": FloatDistribution(1e-5, 1.0, log=True)},
        user_attrs=attrs,
    )
    t.number = number
    return t


def test_a_broken_seed_counts_at_the_floor_in_its_configurations_outcome():
    done, broke = record(0, State.COMPLETE, 0.6), record(1, State.PRUNED, breach=KL, steps=6)
    out = combine([done, broke], 2, floor=0.0)
    assert (out.state, out.value, out.steps_run) == (State.COMPLETE, 0.3, 16)
    assert out.reason == "1 of 2 seeds broke (counted at 0); seed 1: kl above its bound"
    assert out.breach == KL  # the trial still records which rule stopped it
    # every seed broke: nothing completed, the configuration ends pruned (the judge counts it)
    assert combine([broke], 1, floor=0.0).state == State.PRUNED
    # no floor (an objective of unknown range), or a forecast's stop: pruned, as before
    assert combine([done, broke], 2).state == State.PRUNED
    forecast = record(1, State.PRUNED, breach=FORECAST)
    assert combine([done, forecast], 2, floor=0.0).state == State.PRUNED


def test_the_floor_is_the_worst_value_of_a_bounded_objective():
    t = trial(0, TrialState.COMPLETE, record(0, State.COMPLETE, 0.4))
    assert break_floor("eval/reward/mean", True, [t]) == 0.0
    assert break_floor("eval/reward/exact_match", False, [t]) == 1.0
    assert break_floor("eval/loss", True, [t]) is None  # its range is unknown
    above = trial(1, TrialState.COMPLETE, record(0, State.COMPLETE, 1.5))
    assert break_floor("eval/reward/mean", True, [t, above]) is None  # not in [0, 1]


def test_the_judge_counts_broken_seeds_and_trials_whose_every_seed_broke():
    some = trial(
        0, TrialState.COMPLETE, record(0, State.COMPLETE, 0.6), record(1, State.PRUNED, breach=KL)
    )
    kl = record(0, State.PRUNED, breach=KL), record(1, State.PRUNED, breach=KL)
    every = trial(1, TrialState.PRUNED, *kl)
    by_forecast = trial(2, TrialState.PRUNED, kl[0], record(1, State.PRUNED, breach=FORECAST))
    once = trial(3, TrialState.PRUNED, kl[0])  # one run that broke: not a mean (seeds=1)
    got = configs_from_trials([some, every, by_forecast, once], floor=0.0)
    assert [c.label for c in got] == ["t0", "t1"]  # a forecast's stop is not a break
    assert got[0].values == [0.6, 0.0] and got[0].broke == 1 and got[1].values == [0.0, 0.0]
    assert [c.label for c in configs_from_trials([some, every, by_forecast])] == ["t0"]
    assert config_of(some).values == [0.6]  # no floor: the broken seed has no value


def test_a_broken_seed_is_a_value_the_judge_pools_like_any_other():
    # Judged as any configuration: its spread joins the study's pooled seed variance, the
    # race's and the verdict's. A study where runs break has that much seed noise, and a
    # configuration whose drawn seeds passed may break too (bench/COST.md: judged apart, on
    # the pool of configurations whose runs all ended, held-out coverage fell below 90%)
    a = Config("a", seeds=(Seed(0, 0.5), Seed(1, 0.6)))
    c = Config("c", seeds=(Seed(0, 0.6), Seed(1, 0.0, broke=True)))
    # SS: a 0.005, c 0.18; over 2 df: 0.0925
    assert stats.pooled_variance([a.values, c.values]).variance == pytest.approx(0.0925)
    judge = Judge([a, c])
    assert judge.pool == stats.variance_bound(stats.pooled_variance([a.values, c.values]))
    assert judge.difference(a, c).method.startswith("unpaired, pooled t over seeds")


def test_the_race_gives_a_configuration_whose_first_seed_broke_its_second_seed():
    leader = trial(
        0, TrialState.COMPLETE, record(0, State.COMPLETE, 0.6), record(1, State.COMPLETE, 0.62)
    )
    me = trial(1, TrialState.RUNNING, record(0, State.PRUNED, breach=KL), lr=1e-2)
    step = racing.look([leader, me], me, 3, True, True, 0.02, floor=0.0)
    assert step.action == race.SEED  # one seed, at the floor: fewer than two to judge
    # at the floor twice it is far below the leader: its race ends
    both = trial(
        1,
        TrialState.RUNNING,
        record(0, State.PRUNED, breach=KL),
        record(1, State.PRUNED, breach=KL),
        lr=1e-2,
    )
    assert racing.look([leader, both], both, 3, True, True, 0.02, floor=0.0).action == race.STOP


def test_the_verdict_says_how_many_seeds_broke_and_every_run_broke_when_only_floors():
    good = Config("t0", {"lr": 1e-3}, (Seed(0, 0.6, 0.02), Seed(1, 0.62, 0.02)))
    half = Config("t1", {"lr": 1e-2}, (Seed(0, 0.58, 0.02), Seed(1, 0.0, broke=True)))
    close = Config("t2", {"lr": 2e-3}, (Seed(0, 0.58, 0.02), Seed(1, 0.61, 0.02)))
    v = verdict([good, half, close], max_seeds=3)
    row = interval_cells(next(s for s in v.ranked if s.label == "t1"))
    assert row[:2] == ["2 (1 broke)", "0.29"]
    assert "counts at the objective's floor" in v.text
    # t1 is no alternative to the best, whatever its interval: named apart, never tied
    assert v.tied_with_best == ["t2"] and v.decision.startswith(
        "Tied at this sample size: t0 and t2"
    )
    assert v.decision.endswith("t1: seeds broke (counted at the floor).")
    only = Config("t2", {}, (Seed(0, 0.0, broke=True),))
    assert verdict([only], broken=1).decision.startswith("Every run broke")


def test_a_studys_verdict_counts_the_configuration_whose_every_seed_broke():
    stable = [
        trial(n, TrialState.COMPLETE, record(0, State.COMPLETE, v), record(1, State.COMPLETE, w))
        for n, (v, w) in enumerate([(0.6, 0.62), (0.5, 0.53), (0.4, 0.41)])
    ]
    kl = record(0, State.PRUNED, breach=KL), record(1, State.PRUNED, breach=KL)
    broken = trial(3, TrialState.PRUNED, *kl, lr=1e-2)
    attrs = {StudyAttr.OBJECTIVE: "eval/reward/mean", StudyAttr.MAX_SEEDS: 3}
    v = sweep_verdict([*stable, broken], attrs, True)
    assert [s.label for s in v.ranked] == ["t0", "t1", "t2", "t3"] and v.ranked[-1].mean == 0.0
    assert "t3" not in v.tied_with_best  # both seeds at the floor: decided worse
    assert interval_cells(v.ranked[-1])[0] == "2 (2 broke)"


@pytest.mark.slow
def test_a_real_grid_runs_every_seed_of_a_configuration_that_broke_and_ranks_it(tmp_path):
    from conftest import run_sweep, study_in

    tiny = ["max_steps=3", "batch_size=4", "task.eval_size=16", "eval_every=2"]
    done = run_sweep(tmp_path, "lr=1e-3,0.5", "hydra.sweeper.seeds=2", *tiny)
    assert done.returncode == 0, done.stderr[-3000:]
    by_lr = {t.params["lr"]: t for t in study_in(tmp_path).trials}
    broken = by_lr[0.5]
    seeds = [r for k, r in broken.user_attrs.items() if k.startswith("replicate_")]
    # a seed broke, and the grid still ran both (a broken seed counts at the floor)
    assert len(seeds) == 2 and seeds[0]["state"] == "PRUNED" and seeds[0]["breach"]
    broke = sum(r["state"] == "PRUNED" for r in seeds)
    if broke == 2:  # every seed broke: pruned, and ranked at the floor
        assert broken.state.name == "PRUNED"
    else:  # told the mean over both seeds, the broken one at 0
        done_value = next(r["value"] for r in seeds if r["state"] == "COMPLETE")
        assert broken.state.name == "COMPLETE" and broken.value == pytest.approx(done_value / 2)
    label = f"t{broken.number}"
    row = next(line for line in done.stdout.splitlines() if line.startswith(f"{label} "))
    assert f"2 ({broke} broke)" in row
    assert broke == 2 or "1 of 2 seeds broke" in row  # a completed one's note says why
    assert f"{label}: seeds broke (counted at the floor)." in done.stdout
