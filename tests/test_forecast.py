"""The forecast of a trial's final objective (hand-computed fits, a configuration's seeds
pooled), the reporter's order at an eval step (health rules first), "no incumbent" said once per
trial, and the forecasting pruner in real sweeps: the forecast logged at each eval step and
drawn on the report's eval curves, a collapsing lr stopped early with the forecast's reason, a
learning one kept."""

from __future__ import annotations

import logging

import optuna
import pytest
from conftest import mlflow_uri, run_sweep, study_in, study_uri
from mlflow.tracking import MlflowClient

from analysis.load import load_study
from analysis.plot_style import FORECAST_GID
from analysis.plots import reward_curves
from judge import forecast as fc
from judge.forecast import FORECAST, is_unsafe
from records.metrics import EVAL_REWARD, stderr_of
from records.sweep import (
    FORECAST_HIGH,
    FORECAST_MEAN,
    Replicate,
    StudyAttr,
    TrialAttr,
    replicate_key,
    replicates,
)
from sweeper.plan.breaches import breached
from sweeper.sweep.forecaster import Forecaster, seed_curve
from sweeper.sweep.job import TrialReporter
from sweeper.sweep.stopping import TrialPruned
from trainer.run.health import HealthMonitor, default_rules


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
    curve = ([0, 10, 20, 30], [0.3, 0.3, 0.3, 0.3], [0.03] * 4, 50)
    flattening = fc.forecast(*curve, level=0.9, models=("flat", "power"))
    assert 0.3 < flattening.high < 0.3 + 3 * 0.03  # one-sided 90%: about 1.3-1.9 stderr above
    settled = fc.forecast(*curve, level=0.9)  # a line through the last 3 points spreads more
    assert settled.mean == pytest.approx(0.3) and flattening.high < settled.high
    assert str(settled).startswith("at step 50 predicted 0.3 (90% to 0.4")


def test_a_collapsed_curve_cannot_reach_an_incumbent_a_rising_one_can():
    best_low = fc.incumbent_low(0.33, 0.024, 0.9)  # 0.33 - 1.2816 x 0.024
    assert best_low == pytest.approx(0.33 - 1.2816 * 0.024, abs=1e-4)
    collapsed = fc.forecast([0, 10, 20], [0.275, 0.0, 0.0], [0.022, 0.0, 0.0], 50)
    assert fc.cannot_win(collapsed, best_low)
    rising = fc.forecast([0, 10, 20], [0.275, 0.31, 0.31], [0.022, 0.023, 0.023], 50)
    assert not fc.cannot_win(rising, best_low)


def test_a_forecast_refuses_to_prune_before_its_minimum_points():
    # two points far below the incumbent: forecast (logged) but not allowed to prune
    best_low = fc.incumbent_low(0.33, 0.024, 0.9)
    two = fc.forecast([0, 10], [0.275, 0.0], [0.022, 0.0], 50)
    assert two.points == 2 < fc.MIN_PRUNE_POINTS and two.high < best_low
    assert not fc.cannot_win(two, best_low)
    three = fc.forecast([0, 10, 20], [0.275, 0.0, 0.0], [0.022, 0.0, 0.0], 50)
    assert three.points == fc.MIN_PRUNE_POINTS and fc.cannot_win(three, best_low)


def test_a_steady_climb_keeps_its_rate_in_the_optimistic_bound():
    # 0.30, 0.40, 0.50 at steps 0, 2, 4: the line reads 0.3 + 0.05 x 12 = 0.9 at step 12,
    # above the incumbent's 0.8 that the flattening models stay under
    x, y, se = fc.np.array([0.0, 2.0, 4.0]), fc.np.array([0.3, 0.4, 0.5]), fc.np.full(3, 0.05)
    assert fc.linear(x, y, se, 12) == pytest.approx(0.9)
    flattening = fc.forecast([0, 2, 4], [0.3, 0.4, 0.5], [0.05] * 3, 12, 0.75, 0, ("flat", "power"))
    climbing = fc.forecast([0, 2, 4], [0.3, 0.4, 0.5], [0.05] * 3, 12, 0.75)
    assert flattening.high < 0.8 < climbing.high and climbing.mean == flattening.mean
    assert fc.model_error(0.75) >= 0 and fc.model_error(0.99) == fc.model_error(0.95)


def test_a_dip_keeps_the_peak_training_reached_in_the_optimistic_bound():
    # SmolLM2 at lr=3e-3 (held-out seed 3): 0.453 at its baseline, up to 0.641, down to 0.312,
    # and it ended at 0.641. The peak leaves the baseline out: a run that only fell from its
    # start (0.7, 0.2, 0.3) peaks at 0.3.
    x = fc.np.array([0.0, 2.0, 4.0, 6.0, 8.0])
    y, se = fc.np.array([0.453, 0.484, 0.641, 0.562, 0.312]), fc.np.full(5, 0.06)
    assert fc.peak(x, y, se, 12) == pytest.approx(0.641)
    assert fc.peak(x, fc.np.array([0.7, 0.2, 0.3]), se[:3], 12) == pytest.approx(0.3)
    three = fc.forecast(x, y, se, 12, 0.95, 0, ("flat", "power", "linear"))
    four = fc.forecast(x, y, se, 12, 0.95)
    assert three.high < 0.641 < four.high and three.mean == four.mean  # peak: optimistic only


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


class LoggedRun:
    """What the reporter writes to MLflow, kept in memory."""

    def __init__(self, client=None) -> None:
        self.client = client  # where the other seeds' runs are read
        self.metrics: dict[str, dict[int, float]] = {}
        self.tags: dict[str, str] = {}

    def log_metrics(self, step, values) -> None:
        for key, value in values.items():
            self.metrics.setdefault(key, {})[step] = value

    def set_tags(self, tags) -> None:
        self.tags.update(tags)


def forecast_reporter(
    incumbent_value: float, seeds: int = 1, seed: int = 0, client=None, rules=None
):
    """A TrialReporter for `seed` on a live trial of an in-memory study whose best completed
    trial scored `incumbent_value` (stderr 0.02), with the default health rules and
    pruner=forecast (or `rules`)."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.OBJECTIVE, EVAL_REWARD)
    study.set_user_attr(StudyAttr.SEEDS, seeds)
    best = study.ask()
    best.set_user_attr(replicate_key(0), _replicate(0, incumbent_value))
    study.tell(best, incumbent_value)
    trial = study.ask()
    run = LoggedRun(client)
    reporter = TrialReporter(
        run,
        trial,
        EVAL_REWARD,
        HealthMonitor(default_rules() if rules is None else rules),
        True,
        False,
    )
    reporter.forecaster = Forecaster(trial, final_step=50, level=0.75, maximize=True, seed=seed)
    return reporter, run


def _replicate(seed: int, value: float | None, state: str = "COMPLETE") -> dict:
    return Replicate(seed, state, value, 0.02, 50, 0.3, "", None).as_attr()


def evals(value: float) -> dict[str, float]:
    return {EVAL_REWARD: value, stderr_of(EVAL_REWARD): 0.02}


def test_a_collapse_at_an_eval_step_is_a_health_breach_not_a_forecast_stop():
    """At steps 10 and 20 eval falls from 0.3 to 0: eval_collapse fires on its second eval in
    a row, and the forecast cannot reach the incumbent's 0.5 either; the health rule is checked
    first and is what prunes."""
    reporter, _ = forecast_reporter(0.5)
    reporter.report(0, evals(0.3))
    reporter.report(10, evals(0.0))  # one eval: a forecast needs 3 points, the rule 2 evals
    with pytest.raises(TrialPruned) as pruned:
        reporter.report(20, evals(0.0))
    assert pruned.value.breach.rule == "eval_collapse"
    assert is_unsafe(pruned.value.breach.as_dict())  # health_breach: its region is unsafe


def test_the_forecast_still_stops_a_healthy_run_that_cannot_win():
    reporter, run = forecast_reporter(0.5)
    reporter.report(0, evals(0.3))
    reporter.report(10, evals(0.25))  # 0.05 under its baseline: within eval_collapse's 3 se
    with pytest.raises(TrialPruned) as pruned:  # from its third eval point (MIN_PRUNE_POINTS)
        reporter.report(20, evals(0.25))
    assert pruned.value.breach.check == FORECAST
    assert set(run.metrics[FORECAST_MEAN]) == {10, 20}


@pytest.mark.slow
def test_a_forecast_sweep_logs_the_forecast_at_each_eval_step(tmp_path):
    """Evals at 0, 2, 4, 6: a forecast needs two points and none is made at the last step.
    Health rules off (`health=[]`): what the run's curve does cannot stop it, and with no
    incumbent the forecast prunes nothing, so the test reads the forecast alone."""
    done = run_sweep(
        tmp_path, "max_steps=6", "eval_every=2", "batch_size=8", "group_size=4",
        "task.eval_size=16", "hydra.sweeper.pruner=forecast", "hydra.sweeper.health=[]",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = study_in(tmp_path).trials
    client = MlflowClient(mlflow_uri(tmp_path))
    run_id = trial.user_attrs[TrialAttr.MLFLOW_RUN_ID]
    for name in (FORECAST_MEAN, FORECAST_HIGH):
        assert {m.step for m in client.get_metric_history(run_id, name)} == {2, 4}
    data = load_study(study_uri(tmp_path))
    _, evals = reward_curves(data).axes
    (line,) = [ln for ln in evals.lines if ln.get_gid() == FORECAST_GID]
    assert list(line.get_xdata()) == [2, 4]


def test_pooled_curve_is_the_mean_over_the_seeds_that_reached_each_step():
    a = {0: (0.3, 0.03), 10: (0.5, 0.04)}
    b = {0: (0.2, 0.04), 10: (0.3, 0.03), 20: (0.4, 0.02)}
    steps, values, stderrs = fc.pooled_curve([a, b], up_to=20)
    assert steps == [0, 10, 20]
    assert values == pytest.approx([0.25, 0.4, 0.4])  # step 20: b alone
    assert stderrs == pytest.approx([0.025, 0.025, 0.02])  # sqrt(0.03^2 + 0.04^2) / 2
    assert fc.pooled_curve([a, b], up_to=10)[0] == [0, 10]  # not past the asking seed's step


def test_a_seed_that_alone_cannot_win_is_kept_while_its_configuration_can(tmp_path):
    """Seed 1 collapses to 0 at step 10 (alone it cannot reach the incumbent's 0.5: the test
    above), seed 0 (its MLflow run) reached 0.9. Pooled: 0.3 at step 0, 0.45 at step 10; the
    power law through them, a + b / sqrt(s + 1) with b = -0.15 / (1 - 1/sqrt(11)) = -0.2147
    and a = 0.5147, reads 0.4847 at step 50, whose optimistic bound passes the incumbent's
    0.5 - 0.674 x 0.02 = 0.4865 at level 0.75."""
    alone, _ = forecast_reporter(0.5, rules=[])
    alone.report(0, evals(0.3))
    alone.report(10, evals(0.0))
    with pytest.raises(TrialPruned):
        alone.report(20, evals(0.0))
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    other = client.create_run(client.create_experiment("grpo")).info.run_id
    for step, value in ((0, 0.3), (10, 0.9)):
        client.log_metric(other, EVAL_REWARD, value, step=step)
        client.log_metric(other, stderr_of(EVAL_REWARD), 0.02, step=step)
    reporter, run = forecast_reporter(0.5, seeds=2, seed=1, client=client, rules=[])
    started = Replicate(0, "RUNNING", None, None, 10, 0.3, "", other)
    reporter.trial.set_user_attr(replicate_key(0), started.as_attr())
    reporter.report(0, evals(0.3))
    reporter.report(10, evals(0.0))  # health off: only the forecast could stop it
    assert run.metrics[FORECAST_MEAN][10] == pytest.approx(0.4847, abs=1e-3)


def test_no_incumbent_is_said_once_per_trial(caplog):
    """Until a configuration completes nothing is pruned by forecast: each trial's job says so
    once at INFO, however many evals it makes."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.OBJECTIVE, EVAL_REWARD)
    caplog.set_level(logging.INFO, logger="sweeper.sweep.forecaster")
    for _ in range(2):  # two trials, each forecasting at steps 10, 20, 30
        forecaster = Forecaster(study.ask(), final_step=50, level=0.75, maximize=True)
        for step, value in ((0, 0.3), (10, 0.0), (20, 0.0), (30, 0.0)):
            assert forecaster.judge(step, value, 0.02, LoggedRun()) is None
    said = [r for r in caplog.records if "no incumbent yet" in r.getMessage()]
    assert [r.getMessage() for r in said] == [
        "t0: no incumbent yet: nothing is pruned by forecast",
        "t1: no incumbent yet: nothing is pruned by forecast",
    ]
    assert {r.levelno for r in said} == {logging.INFO}


@pytest.mark.slow
def test_a_later_seed_forecasts_the_configurations_pooled_curve(tmp_path):
    """Two seeds, run one after the other: seed 1's forecast at step 2 is the forecast of the
    mean of both seeds' evals at steps 0 and 2 (read back from their MLflow runs). Health
    rules off, as above: neither seed can be stopped by its own curve."""
    done = run_sweep(
        tmp_path, "hydra.sweeper.seeds=2", "max_steps=4", "eval_every=2", "batch_size=8",
        "group_size=4", "task.eval_size=16", "hydra.sweeper.pruner=forecast",
        "hydra.sweeper.health=[]",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = study_in(tmp_path).trials
    client = MlflowClient(mlflow_uri(tmp_path))
    run_ids = [r.run_id for r in replicates(trial)]
    curves = [seed_curve(client, run_id, EVAL_REWARD) for run_id in run_ids]
    steps, values, stderrs = fc.pooled_curve(curves, up_to=2)
    assert steps == [0, 2]
    expected = fc.forecast(steps, values, stderrs, 4, level=0.75)
    logged = client.get_metric_history(run_ids[1], FORECAST_MEAN)
    assert {m.step: m.value for m in logged} == {2: pytest.approx(expected.mean)}


def test_once_seeds_are_measured_the_incumbent_low_allows_for_their_noise():
    """Eval stderr 0.024, seed variance 0.0009 (sd 0.03), a one-seed configuration against a
    two-seed incumbent at level 0.75: noise sqrt(0.024^2 + 0.0009 x (1 + 1/2)) = 0.043886, so
    the low is 0.33 - 0.67449 x 0.043886 = 0.30040 (0.31381 on the eval's noise alone). A curve
    flattening at 0.27 (optimistic 0.3074) is stopped on the eval's noise, kept on both."""
    eval_only = fc.incumbent_low(0.33, 0.024, 0.75)
    with_seeds = fc.incumbent_low(0.33, 0.024, 0.75, 0.0009, (1, 2))
    assert eval_only == pytest.approx(0.33 - 0.67449 * 0.024, abs=1e-5)
    assert with_seeds == pytest.approx(0.33 - 0.67449 * 0.043886, abs=1e-5)
    flat = fc.forecast([0, 10, 20], [0.275, 0.27, 0.27], [0.024] * 3, 50, 0.75)
    assert fc.cannot_win(flat, eval_only) and not fc.cannot_win(flat, with_seeds)


def test_the_seed_variance_the_forecast_allows_for_is_the_races():
    """Two configurations with two completed seeds each (0.40, 0.44 and 0.30, 0.34: pooled
    variance 0.0008 on 2 df): the forecast reads the race's spread (raised to its upper bound);
    a study where no configuration has two seeds has none."""
    from judge.compare import Judge
    from judge.configs import config_of
    from records.sweep import Replicate, replicate_key
    from sweeper.sweep.forecaster import seed_variance

    study = optuna.create_study(direction="maximize")
    assert seed_variance(study) == 0.0
    for values in ((0.40, 0.44), (0.30, 0.34), (0.5,)):
        trial = study.ask()
        for seed, value in enumerate(values):
            done = Replicate(seed, "COMPLETE", value, 0.02, 50, 0.3, "", f"run{seed}")
            trial.set_user_attr(replicate_key(seed), done.as_attr())
        study.tell(trial, sum(values) / len(values))
    configs = [config_of(t) for t in study.trials]
    assert Judge(configs).pool.variance == seed_variance(study) > 0.0008
    one_seed = optuna.create_study(direction="maximize")
    trial = one_seed.ask()
    trial.set_user_attr(
        replicate_key(0), Replicate(0, "COMPLETE", 0.5, 0.02, 50, 0.3, "", "r").as_attr()
    )
    one_seed.tell(trial, 0.5)
    assert seed_variance(one_seed) == 0.0
