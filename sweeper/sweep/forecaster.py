"""pruner=forecast inside a trial's job: at each eval step, the configuration's final objective
forecast from its curve so far (judge/forecast.py, the math), logged, and a breach once it
cannot reach the best completed configuration. The reporter (job.py) asks it after the health
rules."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import optuna

from analysis.load import history
from judge import forecast
from judge.compare import Judge
from judge.configs import config_of
from judge.forecast import FORECAST
from records.metrics import stderr_of
from records.sweep import FORECAST_HIGH, FORECAST_MEAN, StudyAttr, replicates
from records.tracking import MLflowRun
from sweeper import optuna_adapter as oa
from trainer.run.health import Action, Breach

log = logging.getLogger(__name__)


class Forecaster:
    """pruner=forecast: at each eval step, the configuration's final objective forecast from
    its curve so far (judge/forecast.py), logged, and a stop once its optimistic bound
    cannot reach the best completed configuration's pessimistic value.

    A configuration's seeds are pooled: each seed forecasts the configuration's curve, at each
    eval step up to its own the mean over the seeds that reached that step (the other seeds'
    evals read from their MLflow runs, found through their replicate records). So a seed that
    alone could not win is kept while its configuration's mean can, and a stop is the
    configuration's, whichever seed says it."""

    def __init__(
        self, trial: optuna.Trial, final_step: int, level: float, maximize: bool, seed: int = 0
    ):
        self.trial = trial
        self.final_step = final_step
        self.level = level
        self.sign = 1.0 if maximize else -1.0  # forecasts read higher-is-better
        self.seed = seed
        self.objective = trial.study.user_attrs[StudyAttr.OBJECTIVE]
        self.curve: dict[int, tuple[float, float | None]] = {}  # this seed's {step: (value, se)}
        self.said_no_incumbent = False  # said once per trial's job, not per eval

    def resume(self, step: int, run: MLflowRun) -> None:
        """After a resume from `step`'s checkpoint: this seed's points up to it, read back from
        its run (the same MLflow run continues), as an uninterrupted run holds them. Once:
        later points are this job's own."""
        if not self.curve:
            recorded = seed_curve(run.client, run.run_id, self.objective)
            self.curve = {s: point for s, point in sorted(recorded.items()) if s <= step}

    def judge(self, step: int, value: float, stderr: float | None, run: MLflowRun):
        self.curve[step] = (value, stderr)
        if step >= self.final_step:
            return None
        curves = [self.curve, *self.other_seeds(run.client)]
        steps, values, stderrs = forecast.pooled_curve(curves, up_to=step)
        signed = [self.sign * v for v in values]
        fc = forecast.forecast(steps, signed, stderrs, self.final_step, self.level)
        if fc is None:
            return None
        run.log_metrics(
            step,
            {
                FORECAST_MEAN: self.sign * fc.mean,
                FORECAST_HIGH: self.sign * fc.high,
            },
        )
        best = incumbent(self.trial.study)
        if best is None:
            if not self.said_no_incumbent:
                log.info("t%s: no incumbent yet: nothing is pruned by forecast", self.trial.number)
                self.said_no_incumbent = True
            return None
        number, best_value, best_stderr, best_seeds = best
        low = forecast.incumbent_low(
            self.sign * best_value,
            best_stderr,
            self.level,
            seed_variance(self.trial.study),
            (len(curves), best_seeds),
        )
        if not forecast.cannot_win(fc, low):
            return None
        text = f"{self.objective} {_signed(fc, self.sign)} < best {best_value:.3g} (t{number})"
        return Breach("forecast", "", self.sign * fc.mean, best_value, step, FORECAST, "",
                      Action.prune.value, text)  # fmt: skip

    def other_seeds(self, client: Any) -> list[dict[int, tuple[float, float | None]]]:
        """The configuration's other seeds' eval curves so far, from their MLflow runs."""
        trial = oa.fresh(self.trial.study, oa.trial_id(self.trial))
        runs = [r.run_id for r in replicates(trial) if r.seed != self.seed and r.run_id]
        return [seed_curve(client, run_id, self.objective) for run_id in runs]


def seed_curve(client: Any, run_id: str, objective: str) -> dict[int, tuple[float, float | None]]:
    """One seed's run as {eval step: (objective, its stderr)}."""
    errors = dict(history(client, run_id, stderr_of(objective)))
    return {
        step: (value, errors.get(step))
        for step, value in history(client, run_id, objective)
        if math.isfinite(value)
    }


def _signed(fc: forecast.Forecast, sign: float) -> str:
    return str(replace(fc, mean=sign * fc.mean, high=sign * fc.high))


def seed_variance(study: optuna.Study) -> float:
    """The objective's seed-to-seed variance as the race measures it (the judge's pool: pooled
    over the configurations with two or more completed seeds, raised to its upper bound);
    0 while none has two (a one-seed sweep never has an estimate)."""
    trials = study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)
    )
    pooled = Judge([config_of(t) for t in trials]).pool
    return pooled.variance if pooled.df and math.isfinite(pooled.variance) else 0.0


def incumbent(study: optuna.Study) -> tuple[int, float, float | None, int] | None:
    """The best completed trial: its number, value, standard error (pooled over seeds) and
    number of completed seeds."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        return None
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    best = max(done, key=lambda t: t.value if maximize else -t.value)
    stderr = forecast.pooled_stderr([r.stderr for r in replicates(best)])
    return best.number, best.value, stderr, max(1, len(config_of(best).values))
