"""The edge of stability (judge/edge.py): which settings sit next to one whose runs broke, and
the verdict that names the best of a tie away from that edge, and the trial the tuned file
then holds (issue 72)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from analysis.verdict import Config, Seed, named_trial, sweep_verdict, verdict
from judge.edge import Setting, away_from_edge, broken_neighbour, neighbours
from records.sweep import Replicate, State, StudyAttr, replicate_key

LRS = (1e-3, 2e-3, 5e-3, 7e-3, 1e-2)


def lr_line(broken: tuple[float, ...] = ()) -> list[Setting]:
    return [Setting(f"lr={lr:g}", {"lr": lr}, lr in broken) for lr in LRS]


def labels(settings: list[Setting]) -> list[str]:
    return [s.label for s in settings]


def test_neighbours_are_the_nearest_values_along_each_numeric_parameter():
    line = lr_line()
    assert labels(neighbours(line[2], line)) == ["lr=0.002", "lr=0.007"]
    assert labels(neighbours(line[0], line)) == ["lr=0.002"]  # the lowest has one
    grid = [
        Setting(f"g{g} lr={lr:g}", {"group_size": g, "lr": lr})
        for g in (4, 8)
        for lr in (1e-3, 2e-3)
    ]
    # g4 lr=1e-3: along group_size g8 lr=1e-3, along lr g4 lr=2e-3; never the diagonal
    assert labels(neighbours(grid[0], grid)) == ["g8 lr=0.001", "g4 lr=0.002"]


def test_a_parameter_that_is_not_a_number_has_no_neighbours_along_it():
    settings = [Setting(n, {"loss": n, "lr": 1e-3}) for n in ("grpo", "dr_grpo")]
    settings.append(Setting("flag", {"loss": "grpo", "lr": True}))  # a bool is not a value
    assert neighbours(settings[0], settings) == []


def test_broken_neighbour_names_the_one_that_broke():
    line = lr_line(broken=(1e-2,))
    assert broken_neighbour(line[3], line).label == "lr=0.01"
    assert broken_neighbour(line[2], line) is None  # 5e-3: its neighbours 2e-3, 7e-3 passed


def test_away_from_edge_names_the_first_tied_setting_not_next_to_a_break():
    line = lr_line(broken=(1e-2,))
    # the top (7e-3) is next to 1e-2; of those tied with it, 5e-3 is not
    assert away_from_edge(["lr=0.007", "lr=0.005", "lr=0.002"], line) == "lr=0.005"
    # the top away from the edge, or every tied one at it: the top stands (None)
    assert away_from_edge(["lr=0.002", "lr=0.007"], line) is None
    both = lr_line(broken=(1e-2, 2e-3))
    assert away_from_edge(["lr=0.007", "lr=0.001"], both) is None
    assert away_from_edge([], line) is None


def two_seeds(lr: float, a: float, b: float, broke: bool = False) -> Config:
    seeds = (Seed(1, a, 0.02), Seed(2, b, 0.02, broke=broke))
    return Config(f"t{LRS.index(lr)}", {"lr": lr}, seeds)


# A 2-seed race on 5 lrs: 7e-3 leads on two seeds that passed, tied with the rest; 1e-2
# broke on its second seed (counted at the floor, 0).
RACE = [
    two_seeds(1e-3, 0.31, 0.33),
    two_seeds(2e-3, 0.33, 0.35),
    two_seeds(5e-3, 0.32, 0.34),
    two_seeds(7e-3, 0.35, 0.36),
    two_seeds(1e-2, 0.30, 0.0, broke=True),
]


def test_the_verdict_names_the_best_of_a_tie_away_from_the_edge():
    v = verdict(RACE, True, 3, (0.0, 1.0))
    assert v.best.label == "t1"  # 2e-3: the best of those tied with 7e-3 not next to 1e-2
    assert "t3" in v.tied_with_best
    assert v.decision.startswith("Tied at this sample size")
    assert "t1 is named over t3 (lr=0.007), which ranks higher but sits next to t4 (lr=0.01)" in (
        v.decision
    )
    # without the rule (or before it), the top-ranked is named
    assert verdict(RACE, True, 3, (0.0, 1.0), left_out=None).best.label == "t3"


def test_a_setting_left_out_of_the_verdict_still_marks_the_edge():
    passed = [c for c in RACE if c.label != "t4"]  # 1e-2 uncounted: its one seed broke
    assert verdict(passed, True, 3, (0.0, 1.0)).best.label == "t3"
    out = verdict(passed, True, 3, (0.0, 1.0), left_out=[Setting("t4", {"lr": 1e-2}, True)])
    assert out.best.label == "t1"


def test_a_top_separated_from_the_rest_is_named_even_at_the_edge():
    clear = [
        two_seeds(2e-3, 0.20, 0.21),
        two_seeds(5e-3, 0.22, 0.22),
        two_seeds(7e-3, 0.60, 0.61),
        two_seeds(1e-2, 0.0, 0.0, broke=True),
    ]
    v = verdict(clear, True, 3, (0.0, 1.0))
    assert v.best.label == "t3" and v.tied_with_best == []
    assert "named over" not in v.decision


def test_a_replayed_sweep_reads_its_grid_labels_as_parameters():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_cost import params_of

    assert params_of("group_size=4 lr=0.001") == {"group_size": 4.0, "lr": 0.001}
    assert params_of("a") == {}  # a test pool's label: no parameters, no edge


def test_a_configuration_the_race_stopped_is_not_named_over_the_top():
    stopped = replace(RACE[1], race="cannot beat t3 after 2 seeds: by at most 0.01")
    race = [RACE[0], stopped, *RACE[2:]]
    assert verdict(race, True, 3, (0.0, 1.0)).best.label == "t2"  # 5e-3, the next tied one


KL = {"rule": "post_update_kl", "check": "post_update_kl", "step": 6, "action": "prune"}


def recorded(number: int, lr: float, *values: float | None) -> FrozenTrial:
    """A grid trial as a sweep stores it: a seed a value, or None for one that broke."""
    seeds = [
        Replicate(s, State.COMPLETE, v, 0.02, 50, 0.2, "", None, None)
        if v is not None
        else Replicate(s, State.PRUNED, None, 0.02, 6, 0.2, "kl above its bound", None, KL)
        for s, v in enumerate(values)
    ]
    done = all(v is not None for v in values)
    t = create_trial(
        state=TrialState.COMPLETE if done else TrialState.PRUNED,
        value=sum(values) / len(values) if done else None,
        params={"lr": lr},
        distributions={"lr": FloatDistribution(1e-5, 1.0, log=True)},
        user_attrs={replicate_key(r.seed): r.as_attr() for r in seeds},
    )
    t.number = number
    return t


def test_the_tuned_file_and_report_hold_the_trial_the_verdict_names():
    # 1e-2's one seed broke and its trial was pruned: out of the comparison, still the edge
    trials = [
        recorded(0, 2e-3, 0.33, 0.35),
        recorded(1, 5e-3, 0.32, 0.34),
        recorded(2, 7e-3, 0.35, 0.36),
        recorded(3, 1e-2, None),
    ]
    attrs = {StudyAttr.OBJECTIVE: "eval/reward/mean", StudyAttr.MAX_SEEDS: 3}
    v = sweep_verdict(trials, attrs, True)
    assert v.best.label == "t0" and "sits next to t3 (lr=0.01)" in v.decision
    assert named_trial(trials, v, True).number == 0  # not t2, the best completed value
    top = sweep_verdict(trials, attrs, True, edge=False)
    assert named_trial(trials, top, True).number == 2
