"""The forecast of a trial's final objective (hand-computed fits), and the forecasting pruner in
a real sweep: a collapsing lr is stopped early with the forecast's reason, a learning one kept."""

from __future__ import annotations

import optuna
import pytest
from conftest import run_sweep, study_in

from analysis import forecast as fc
from analysis.records import TrialAttr
from sweeper.plan.breaches import breached


def test_flat_is_the_weighted_mean_of_the_last_half():
    x, se = fc.np.array([0, 10, 20, 30]), fc.np.array([0.1, 0.1, 0.1, 0.05])
    y = fc.np.array([0.2, 0.4, 0.5, 0.6])
    # last half: 0.5 (weight 100) and 0.6 (weight 400) -> (50 + 240) / 500
    assert fc.flat(x, y, se, 50) == pytest.approx(0.58)


def test_power_recovers_an_exact_power_law():
    x = fc.np.array([0.0, 3.0, 8.0, 15.0])
    y = 0.9 - 0.5 * (x + 1) ** -0.5  # 0.4, 0.65, 0.7333, 0.775
    se = fc.np.full(4, 0.05)
    assert fc.power(x, y, se, 99) == pytest.approx(0.9 - 0.5 * 0.1)


def test_forecast_needs_two_points_and_brackets_a_settled_curve():
    assert fc.forecast([0], [0.3], [0.05], 50) is None
    settled = fc.forecast([0, 10, 20, 30], [0.3, 0.3, 0.3, 0.3], [0.03] * 4, 50, level=0.9)
    assert settled.mean == pytest.approx(0.3)
    assert 0.3 < settled.high < 0.3 + 3 * 0.03  # one-sided 90%: about 1.3-1.9 stderr above
    assert str(settled).startswith("at step 50 predicted 0.3 (90% to 0.3")


def test_a_collapsed_curve_cannot_reach_an_incumbent_a_rising_one_can():
    best_low = fc.incumbent_low(0.33, 0.024, 0.9)  # 0.33 - 1.2816 x 0.024
    assert best_low == pytest.approx(0.33 - 1.2816 * 0.024, abs=1e-4)
    collapsed = fc.forecast([0, 10], [0.275, 0.0], [0.022, 0.0], 50)
    assert fc.cannot_win(collapsed, best_low)
    rising = fc.forecast([0, 10], [0.275, 0.31], [0.022, 0.023], 50)
    assert not fc.cannot_win(rising, best_low)


def test_pooled_stderr_over_seeds():
    assert fc.pooled_stderr([0.03, 0.04]) == pytest.approx(0.025)  # sqrt(0.0025) / 2
    assert fc.pooled_stderr([None]) is None


@pytest.mark.slow
def test_the_forecast_prunes_a_collapsing_lr_early_and_keeps_a_learning_one(tmp_path):
    """Health off: only the forecast can stop lr=3e-2 (it collapses to 0 by step 10)."""
    done = run_sweep(
        tmp_path, "lr=2e-3,3e-2", "hydra.sweeper.pruner=forecast", "hydra.sweeper.health=[]",
        timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {t.params["lr"]: t for t in study_in(tmp_path).trials}
    assert trials[2e-3].state == optuna.trial.TrialState.COMPLETE
    collapsed = trials[3e-2]
    assert collapsed.state == optuna.trial.TrialState.PRUNED
    assert collapsed.user_attrs[TrialAttr.STEPS_RUN] < 25  # of 50
    reason = collapsed.user_attrs[TrialAttr.PRUNE_REASON]
    line = reason["detail"]
    assert line.startswith("eval/reward/mean at step 50 predicted ") and "< best " in line
    assert f"(t{trials[2e-3].number})" in line
    assert f"forecast: {line}" in done.stdout  # the final table's note
    assert not breached(collapsed)  # a forecast's stop is not a health breach
