"""What the sweep's terminal shows of a trial: its parameters, its live line, its end."""

import io
import logging
from datetime import datetime, timedelta

from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from analysis.text import trial_note
from records.sweep import Replicate, State, TrialAttr, replicate_key
from sweeper.results.display import (
    OnceASweep,
    OverLiveLine,
    TrialLine,
    cost_line,
    end_line,
    short,
    trials_run_here,
)


def test_a_searched_float_shows_four_significant_digits():
    params = {"lr": 0.0023456789012345678, "group_size": 4, "model.device": "cuda:1"}
    assert short(params) == "lr=0.002346 group_size=4 model.device=cuda:1"
    assert short({"lr": 1e-3, "temperature": 0.7, "x": None}) == "lr=0.001 temperature=0.7 x=null"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_trial_line_redraws_in_place_with_its_rate_and_eta():
    trials_run_here()  # as the sweep says when its launcher runs trials in its own process
    now = [100.0]
    screen = Terminal()
    line = TrialLine("[sweep s] t1 lr=0.002", 50, stream=screen, clock=lambda: now[0])
    line.step(0, {"eval/reward/mean": 0.3})  # the baseline eval: the clock starts here
    assert screen.getvalue() == ""
    now[0] = 104.0
    line.step(10, {"reward/mean": 0.3125})  # 10 steps in 4 s: 2.5 step/s, 40 left: 16 s
    assert screen.getvalue() == (
        "\r\x1b[K[sweep s] t1 lr=0.002 step 10/50, 2.5 step/s, ETA 16 s, reward 0.31"
    )
    now[0] = 104.1  # within the redraw interval: not drawn
    line.step(11, {})
    assert screen.getvalue().count("\r") == 1


def test_a_trial_line_is_silent_on_a_pipe():
    pipe = io.StringIO()
    line = TrialLine("[sweep s] t1", 5, stream=pipe, clock=lambda: 0.0)
    for step in range(6):
        line.step(step, {"reward/mean": 0.5})
    assert pipe.getvalue() == ""


def frozen(state: TrialState, **attrs) -> FrozenTrial:
    start = datetime(2026, 11, 26, 23, 0, 0)
    trial = create_trial(
        state=state,
        value=0.4375 if state == TrialState.COMPLETE else None,
        params={"lr": 0.002, "group_size": 4},
        distributions={
            "lr": FloatDistribution(1e-4, 1e-1, log=True),
            "group_size": IntDistribution(2, 8),
        },
        user_attrs=attrs,
    )
    trial.number = 3
    trial.datetime_start, trial.datetime_complete = start, start + timedelta(seconds=21)
    return trial


def test_a_trial_ends_in_one_line_with_its_value_or_why():
    done = frozen(TrialState.COMPLETE, steps_run=50)
    assert (
        end_line("s", done) == "[sweep s] t3 lr=0.002 group_size=4: 0.4375 after 50 steps in 21 s"
    )
    breach = {"rule": "eval_collapse", "step": 2, "text": "eval fell"}
    pruned = frozen(TrialState.PRUNED, steps_run=2, prune_reason=breach)
    assert end_line("s", pruned).startswith("[sweep s] t3 lr=0.002 group_size=4: pruned at step 2")
    assert trial_note(pruned) in end_line("s", pruned)
    failed = frozen(TrialState.FAIL, steps_run=0, fail_reason="RuntimeError: no cuda:99")
    assert end_line("s", failed).endswith(": failed at step 0 in 21 s: RuntimeError: no cuda:99")


def test_a_warning_on_a_terminal_clears_the_live_line_first():
    record = logging.LogRecord("trainer", logging.WARNING, "", 0, "t0 warning: %s", ("x",), None)
    inner = logging.Formatter("[%(levelname)s] - %(message)s")
    assert OverLiveLine(inner).format(record) == "\r\x1b[K[WARNING] - t0 warning: x"


def test_a_warning_every_trial_gives_is_said_once_a_sweep():
    # backend=trl warns at every trial's start that a rule's metric is missing: once is enough
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(OnceASweep())
    log = logging.getLogger("test_display.once")
    log.addHandler(handler)
    try:
        for trial in range(3):
            log.warning("these health rules never fire: sampler_kl")
            log.warning("t%d: its own warning", trial)
    finally:
        log.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "these health rules never fire: sampler_kl",
        "t0: its own warning",
        "t1: its own warning",
        "t2: its own warning",
    ]


def _spent(
    steps_by_seed: dict[int, int],
    params: dict | None = None,
    run: str = "",
    pruned: int = -1,
    breach: dict | None = None,
) -> FrozenTrial:
    """A trial with a completed seed run of `steps` for each seed (the seed `pruned`: stopped
    there, by the health rule `breach` if given); run: the runs' MLflow ids start with it (a
    seed carried over to a configuration queued again keeps its run)."""
    runs = {
        replicate_key(seed): Replicate(
            seed,
            State.PRUNED if seed == pruned else State.COMPLETE,
            None if seed == pruned else 0.3,
            None,
            steps,
            None,
            "",
            f"{run}{seed}" if run else None,
            breach if seed == pruned else None,
        ).as_attr()
        for seed, steps in steps_by_seed.items()
    }
    steps = sum(steps_by_seed.values())
    dists = {k: IntDistribution(1, 10**7) for k in params or {}}
    return create_trial(
        value=0.3, params=params or {}, distributions=dists,
        user_attrs={TrialAttr.STEPS_RUN: steps, **runs},
    )  # fmt: skip


def test_a_grid_sweep_s_cost_is_against_the_three_seed_grid_with_its_health_rules_first():
    # 3 configurations of 50 steps: raced 50+50, 50+50+50, and one pruned at step 20 of its
    # first seed: 270 steps in 6 runs. The 3-seed grid with the same rules: 50+50+50 (the
    # third seed estimated at the two's mean, 50), 150, and 20 (its first seed pruned, so no
    # other seed started): 320, 84%. The plain grid's 450 (60%) would take the line past 120
    # characters, so it is left out.
    trials = [
        _spent({0: 50, 1: 50}, {"group_size": 2}),
        _spent({0: 50, 1: 50, 2: 50}, {"group_size": 4}),
        _spent({0: 20}, {"group_size": 8}, pruned=0),
    ]
    assert cost_line(trials, 50) == (
        "Cost: 270 training steps in 6 runs, 84% of the 320 a 3-seed grid takes with these "
        "health rules (50 estimated)."
    )
    # interrupted and queued again: the new trial carries the first one's seed runs; still
    # one configuration, and each run counted once
    again = [_spent({0: 50, 1: 50}, {"group_size": 2}, run="a"), trials[1], trials[2]]
    again.append(_spent({0: 50, 1: 50}, {"group_size": 2}, run="a"))
    assert cost_line(again, 50) == cost_line(trials, 50)
    # raced to 5 seeds (250 steps), and one pruned at its second seed (step 10): the grid's
    # seeds are the first 3 (150), and 50 + 10 with none after the pruned one: 310 of 210,
    # 148%; of the plain 300, 103%
    raced = [
        _spent(dict.fromkeys(range(5), 50), {"lr": 1}),
        _spent({0: 50, 1: 10}, {"lr": 2}, pruned=1),
    ]
    assert cost_line(raced, 50) == (
        "Cost: 310 training steps in 7 runs, 148% of the 210 a 3-seed grid takes with these "
        "health rules; 103% without."
    )
    # a seed a health rule stopped counts at the floor: the grid goes on to the next seeds.
    # A config broken at step 20 of its first seed and 10 of its second: the grid's third seed
    # is estimated at their mean, 15; 20 + 10 + 15 = 45, with 50+50+50 for the other: 195
    kl = {"rule": "post_update_kl", "check": "post_update_kl", "step": 10, "action": "prune"}
    broken = _spent({0: 20, 1: 10}, {"lr": 2}, pruned=1, breach=kl)
    first = Replicate(0, State.PRUNED, None, None, 20, None, "", None, kl).as_attr()
    broken.user_attrs[replicate_key(0)] = first
    counted = [raced[0], broken]
    assert cost_line(counted, 50, floor=0.0) == (
        "Cost: 280 training steps in 7 runs, 144% of the 195 a 3-seed grid takes with these "
        "health rules (15 estimated)."
    )
    # nothing pruned: the two grids are one; a swept max_steps is each configuration's own,
    # and a seed not run is estimated at its configuration's completed seeds' mean (10, 30)
    mixed = [_spent({0: 10}, {"max_steps": 10}), _spent({0: 30, 1: 30}, {"max_steps": 30})]
    assert cost_line(mixed, 50) == (
        "Cost: 70 training steps in 3 runs, 58% of the 120 a 3-seed grid takes, health rules "
        "or not (50 estimated)."
    )
    # no room for the plain grid's figure within 120 characters: the with-rules one alone.
    # 3,400,000 steps; the grid 1,000,000 + 400,000 (pruned) and 3 x 1,000,000 (one
    # estimated): 4,400,000, 77%
    big = {"max_steps": 1_000_000}
    huge = [
        _spent({0: 1_000_000, 1: 400_000}, {**big, "lr": 1}, pruned=1),
        _spent({0: 1_000_000, 1: 1_000_000}, {**big, "lr": 2}),
    ]
    assert cost_line(huge, 50) == (
        "Cost: 3,400,000 training steps in 4 runs, 77% of the 4,400,000 a 3-seed grid takes "
        "with these health rules (1,000,000 estimated)."
    )
