"""bench/default_coverage.py on hand-computed numbers: a coverage clustered by replay, one
interval against the truth (plain and with its noise allowed), which configurations are
unstable and which pairs scattered, and one replayed verdict counted."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from judge.stats import Interval

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_cost as bc  # noqa: E402  (bench/ is scripts, not a package)
import default_coverage as dc  # noqa: E402
from test_bench_cost import evals, flat, train  # noqa: E402


def pool(**configs: list[bc.Curve]) -> bc.Pool:
    return bc.Pool("hand", 4, {c: dict(enumerate(runs)) for c, runs in configs.items()})


def test_a_coverage_is_clustered_by_replay_and_leaves_out_replays_that_judged_none():
    replays = [
        Counter({"all judged": 4, "all covered": 4, "all width": 0.8}),
        Counter({"all judged": 4, "all covered": 2, "all width": 1.2}),
        Counter({"shown judged": 1}),  # judged no pair of this kind: not a cluster of it
    ]
    got = dc.coverage(replays, "all")
    assert got["replays"] == 2 and got["judged"] == 8 and got["mean width"] == pytest.approx(0.25)
    plain = got["covered"]
    assert plain["covered"] == 6 and plain["coverage"] == 0.75
    # p = 0.75; sum((h - p n)^2) k/(k-1) = (1 + 1) x 2 = 4; half = 1.96 x 2 / 8 = 0.49
    assert plain["clustered"] == pytest.approx([0.26, 1.0], abs=1e-4)
    assert plain["wilson"] == pytest.approx([0.409, 0.929], abs=1e-3)  # narrower: independent
    assert dc.kinds_of(replays) == ["all", "shown"]


def test_an_interval_misses_a_truth_its_noise_allowance_reaches():
    out: Counter = Counter()
    # truth 0.25 over two seeds, its stderr 0.15: the interval's upper side 0.1 widens in
    # quadrature with 1.96 x 0.15 to 0.1 + hypot(0.1, 0.294) = 0.4105, past the truth
    dc.tallied(out, ["all", "all, stable"], Interval(0.1, 0.0, 0.2, "m"), [0.1, 0.4])
    assert out["all judged"] == out["all, stable judged"] == 1
    assert out["all covered"] == 0 and out["all covered, truth noise allowed"] == 1
    assert out["all width"] == pytest.approx(0.2)


def collapsed(value: float = 0.3) -> bc.Curve:
    """A run 0.25 below its baseline on two evals in a row: the eval_collapse rule stops it."""
    curve = flat(value)
    curve[2] = {**train(), **evals(value - 0.25)}
    curve[4] = {**train(), **evals(value - 0.25)}
    return curve


def test_a_configuration_is_unstable_on_every_seed_the_rules_stop_not_only_the_first():
    p = pool(a=[flat(0.3)] * 3, b=[collapsed(), flat(0.3), collapsed()])
    assert dc.unstable_configs(p, 2) == {"b": [0, 2]}  # a grid would stop b after seed 0


def test_the_scattered_pairs_are_those_above_the_median_seed_paired_sd():
    p = pool(
        a=[flat(0.5), flat(0.5), flat(0.5)],
        b=[flat(0.3), flat(0.35), flat(0.3)],
        c=[flat(0.1), flat(0.5), flat(0.9)],
    )
    # paired sds: a-b 0.029, a-c 0.400, b-c 0.401; the median 0.400
    assert dc.scattered_pairs(p) == {frozenset(("b", "c"))}


def test_a_replayed_verdict_counts_its_pair_as_shown_and_against_the_unseen_seeds():
    p = pool(
        a=[flat(0.5), flat(0.52), flat(0.5), flat(0.52)],
        b=[flat(0.2), flat(0.21), flat(0.2), flat(0.21)],
    )
    study = bc.Sweep(p, bc.Policy("fixed2", 2), ["b", "a"], [0, 1, 2, 3], "s", 2).run()
    got = dc.verdict_coverage(p, study, [2, 3], {"b": [5]})  # stopped on a seed not drawn
    # two configurations of two seeds: the blocked fit has too few to pair them, Welch's t
    for kind in ("all", "all, unstable", "all, fewest seeds 2", "all, unpaired", "shown"):
        assert got[f"{kind} judged"] == got[f"{kind} covered"] == 1, kind
    assert got["shown at its level, all judged"] == 1  # fixed seeds: its level is 95%
    assert got["configurations without a value"] == 0
    assert got["all, with a judged"] == got["all, with b judged"] == 1
    assert got["in the verdict: a"] == got["in the verdict: b"] == 1
    assert got["all, unstable, kept runs' truth judged"] == 1  # seeds 2 and 3 both kept
    stopped_in_truth = dc.verdict_coverage(p, study, [2, 3], {"b": [2]})
    assert stopped_in_truth["all, unstable, kept runs' truth judged"] == 0  # one seed left
