"""A run's health state across a restart: the monitor saved with a checkpoint decides as one
never stopped, a saved state that is not one is refused, and a resumed trial's forecaster and
reporter read back what the lost attempt had."""

from __future__ import annotations

import json

import pytest

from records.metrics import EVAL_REWARD as EVAL
from records.metrics import KL_PRE_POST_V2 as KL2
from records.metrics import REWARD, stderr_of
from trainer.run.health import HealthMonitor, default_rules

EVAL_SE = stderr_of(EVAL)

# --- the monitor's state: saved with a checkpoint, a resumed run decides as one never stopped


def collapse() -> dict[int, dict[str, float]]:
    """Learns, then breaks: every kind of reference a rule keeps (baseline, first value, peak,
    guard window, streak) is in play."""
    steps = {0: {EVAL: 0.30}}
    for step in range(1, 21):
        broke = step > 10
        steps[step] = {
            KL2: 0.5 if broke else 0.05,
            REWARD: 0.2 + 0.04 * step if not broke else 0.1,
            "entropy": 1.0 if not broke else 0.05,
            "completions/mean_length": 4.0 if step < 14 else 15.0,
            "groups/frac_zero_advantage": 0.5 if not broke else 1.0,
        }
        if step % 4 == 0:
            steps[step][EVAL] = 0.30 + 0.05 * step if not broke else 0.10
            steps[step][EVAL_SE] = 0.03
    steps[0][EVAL_SE] = 0.03
    return steps


def test_a_monitor_restored_from_its_saved_state_decides_as_one_never_stopped():
    run = collapse()
    straight = HealthMonitor(default_rules(0.01))
    expected = {step: straight.breaches(step, run[step]) for step in sorted(run)}
    assert any(b.action == "prune" for b in expected[20])  # the stream does fire
    assert any(expected.values()) and not all(expected.values())
    for stop in sorted(run)[:-1]:  # interrupted after each step in turn
        first = HealthMonitor(default_rules(0.01))
        for step in range(stop + 1):
            first.breaches(step, run[step])
        resumed = HealthMonitor(default_rules(0.01))
        resumed.load_state(json.loads(json.dumps(first.state())))  # as the checkpoint holds it
        later = {step: resumed.breaches(step, run[step]) for step in sorted(run) if step > stop}
        assert later == {step: expected[step] for step in later}, stop
        fresh = HealthMonitor(default_rules(0.01))  # what a resume did before: it forgot
        if stop >= 4:
            forgot = {step: fresh.breaches(step, run[step]) for step in sorted(run) if step > stop}
            assert forgot != {step: expected[step] for step in forgot}, stop


def test_a_saved_monitor_state_that_is_not_one_is_refused_in_one_line():
    good = HealthMonitor(default_rules(0.01)).state()
    for bad, message in [
        ([], "health state is not"),
        ({**good, "streaks": {"kl": -1}}, "streaks.kl=-1 is not a number"),
        ({**good, "peaks": {"x": "1"}}, "peaks.x='1' is not a number"),
        ({**good, "recent": {"x": [1.0, float("nan")]}}, "recent.x=.* is not a number"),
        ({**good, "recent": {"x": 1.0}}, "recent.x is not a list"),
    ]:
        with pytest.raises(ValueError, match=message):
            HealthMonitor(default_rules(0.01)).load_state(bad)


def test_a_resumed_forecaster_reads_its_points_back_and_forecasts_as_one_never_stopped(tmp_path):
    """pruner=forecast: the points up to the checkpoint come back from the seed's MLflow run
    (which the resume continues); a point logged past the checkpoint by the lost attempt is
    not one of them."""
    import optuna
    from mlflow.tracking import MlflowClient

    from records.metrics import stderr_of
    from records.sweep import FORECAST_MEAN, StudyAttr, replicate_key
    from sweeper.sweep.forecaster import Forecaster

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("grpo")).info.run_id

    class Run:
        def __init__(self) -> None:
            self.client, self.run_id, self.metrics = client, run_id, {}

        def log_metrics(self, step, values) -> None:
            for key, value in values.items():
                self.metrics.setdefault(key, {})[step] = value

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.OBJECTIVE, EVAL)
    best = study.ask()
    best.set_user_attr(replicate_key(0), {"seed": 0, "state": "COMPLETE", "stderr": 0.02})
    study.tell(best, 0.9)
    trial = study.ask()
    points = {0: 0.3, 10: 0.4, 20: 0.42, 30: 0.45}
    straight, straight_run = Forecaster(trial, 50, 0.75, True), Run()
    for step, value in points.items():
        straight.judge(step, value, 0.02, straight_run)
    for step, value in [*points.items()][:3]:  # the lost attempt logged up to step 20
        client.log_metric(run_id, EVAL, value, step=step)
        client.log_metric(run_id, stderr_of(EVAL), 0.02, step=step)
    resumed, resumed_run = Forecaster(trial, 50, 0.75, True), Run()
    resumed.resume(10, resumed_run)  # its checkpoint was step 10's
    assert resumed.curve == {0: (0.3, 0.02), 10: (0.4, 0.02)}
    for step in (20, 30):
        resumed.judge(step, points[step], 0.02, resumed_run)
    forecasts = straight_run.metrics[FORECAST_MEAN]
    assert resumed_run.metrics[FORECAST_MEAN] == {s: forecasts[s] for s in (20, 30)}


def test_a_resumed_reporter_holds_what_the_lost_attempt_reported_before_its_checkpoint(tmp_path):
    """Resumed from step 20's checkpoint (the lost attempt got to step 25), a trial's reporter
    reads back from the run it continues what that attempt reported: the objective's points
    up to the checkpoint go to Optuna, so the trial pruned later has the value of one never
    stopped (Optuna gives a pruned trial its last point); the step-0 baseline; and the warning
    already fired, which is not fired, said or logged again. Found by the chaos benchmark."""
    import optuna
    from mlflow.tracking import MlflowClient

    from records.metrics import EVAL_REWARD, GROUPS_ZERO_ADVANTAGE
    from records.sweep import WARNING_METRIC_PREFIX, StudyAttr
    from records.tracking import MLflowRun
    from sweeper.sweep.job import trial_reporter

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    study = optuna.create_study(direction="maximize")
    attrs = {
        StudyAttr.OBJECTIVE: EVAL_REWARD,
        StudyAttr.HEALTH_RULES: [rule.as_dict() for rule in default_rules(0.01)],
        StudyAttr.KL_THRESHOLD: 0.01,
        StudyAttr.PRUNER: "none",
    }

    def metrics(step: int) -> dict[str, float]:  # every group alike: no_learning_signal warns
        evals = {EVAL_REWARD: 0.3 + step / 1000} if step % 10 == 0 else {}
        return {GROUPS_ZERO_ADVANTAGE: 1.0, **evals} if step else evals

    def reporter(run: MLflowRun):
        return trial_reporter(run, study.ask(), attrs, None, True, 40, 0)

    straight = reporter(MLflowRun("grpo", "straight", client=client))
    lost = reporter(MLflowRun("grpo", "lost", client=client))
    checkpoint = None
    for step in range(41):
        straight.report(step, metrics(step))
        if step <= 25:
            lost.report(step, metrics(step))
        if step == 20:  # what the checkpoint saves with the weights
            checkpoint = lost.monitor.state()
    resumed = reporter(MLflowRun.attach(lost.run.run_id, client))
    resumed.monitor.load_state(checkpoint)
    resumed.resumed(20)
    for step in range(21, 41):
        resumed.report(step, metrics(step))

    def held(r) -> optuna.trial.FrozenTrial:
        return study.trials[r.trial.number]

    assert held(resumed).intermediate_values == held(straight).intermediate_values
    assert resumed.baseline == straight.baseline == 0.3
    assert resumed.warnings == straight.warnings
    assert list(resumed.warnings) == ["no_learning_signal"]
    warned = WARNING_METRIC_PREFIX + "no_learning_signal"
    assert [m.step for m in client.get_metric_history(lost.run.run_id, warned)] == [5]
    for r in (straight, resumed):
        study.tell(r.trial, state=optuna.trial.TrialState.PRUNED)
    assert held(resumed).value == held(straight).value == pytest.approx(0.34)
