"""The task function of `python -m sweeper`: one training run, reported to MLflow and Optuna.

In a sweep the sweeper passes the binding to a live trial (`trial.id`, `trial.storage`, ...)
in the job's overrides, so this may run in any process or host: it opens the trial from the
storage, reads the study's health rules, and after every step logs to MLflow, reports the
objective to Optuna and checks the rules (a rule that fires, or the objective pruner,
prunes it: `TrialPruned`). It records its own outcome (a `Replicate`: one
seed of the trial) and closes its MLflow run, then lets any exception propagate: the sweeper
reads it from Hydra's JobReturn and tells the study once every seed has ended. Without a
binding (no `-m`) it is one plain training run, exactly `python -m trainer`.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig
from optuna.trial import TrialState

from analysis.load import history
from analysis.sweep_job import training_config
from judge.forecast import FORECAST
from records.database import DatabaseUnreachable, set_retry_window
from records.metrics import EVAL_REWARD, EVAL_TRUNCATED, is_finite_number, stderr_of
from records.optuna_storage import open_storage
from records.sweep import (
    WARNING_METRIC_PREFIX,
    Replicate,
    Role,
    State,
    StudyAttr,
    Tag,
    TrialAttr,
    replicate_key,
)
from records.tracking import MLflowRun
from records.tracking_store import tracking_client
from sweeper import optuna_adapter as oa
from sweeper.plan.eval_power import truncation_warning
from sweeper.results.display import TrialLine, short
from sweeper.results.runs import close_trial_run, mark_objective, trial_run_name
from sweeper.sweep.forecaster import Forecaster, seed_curve
from sweeper.sweep.stopping import TakenOver, TrialPruned, make_pruner
from trainer.backends import configured, resumed_step, train
from trainer.backends.logged_run import train_and_log
from trainer.backends.run_params import run_params
from trainer.base.errors import RankLost, fail_reason
from trainer.run.health import (
    Action,
    Breach,
    HealthMonitor,
    HealthRule,
    first_to_prune,
    rules_from_settings,
)

log = logging.getLogger(__name__)


class TrialReporter:
    """Per step: metrics to MLflow, the objective to Optuna, then the health rules."""

    def __init__(
        self,
        run: MLflowRun,
        trial: optuna.Trial,
        objective: str,
        monitor: HealthMonitor,
        reports_to_optuna: bool,
        prune_on_objective: bool,
        record: Replicate | None = None,
    ) -> None:
        self.run = run
        self.run.still_ours = self._still_ours  # checked again before a write is retried
        self.trial = trial
        self.objective = objective
        self.monitor = monitor
        self.reports_to_optuna = reports_to_optuna  # one seed per trial: Optuna keeps one curve
        self.prune_on_objective = prune_on_objective
        self.last: dict[str, float] = {}  # last value of every metric
        self.steps_run = 0
        self.baseline: float | None = None
        self.warnings: dict[str, str] = {}  # rule -> its first firing's line
        self.forecaster: Forecaster | None = None  # pruner=forecast
        self.record = record  # this seed's record while it trains (None: kept elsewhere)
        self.line: TrialLine | None = None  # the trial's live line on the sweep's terminal
        self.restored = False  # a resumed run's earlier reports read back (restore_reports)
        # The sweep's first baseline eval: what it says the sweep cannot learn (eval_power)
        self.baseline_check: Callable[[Mapping[str, float]], str | None] | None = None

    @property
    def health_rules(self) -> list[HealthRule]:
        """The study's rules this trial is checked by (a backend names those it cannot feed)."""
        return self.monitor.rules

    def resumed(self, step: int | None) -> None:
        """The checkpoint step training loaded (None: step 0). The records made before
        training name the newest checkpoint that reads, which may not fit the run: they are
        set right here, the MLflow tag and the seed's record alike. The health monitor came
        back with the checkpoint; the rest is read back from the run (restore_reports)."""
        if step is not None:
            self.restore_reports(step)
        if self.record is None or step == self.record.resumed_from_step:
            return
        self._still_ours()
        if step is not None:
            self.run.set_tags({Tag.RESUMED_FROM_STEP: step})
        elif self.record.resumed_from_step is not None:  # the tag the guess set
            self.run.remove_tag(Tag.RESUMED_FROM_STEP)
        self.record = replace(self.record, resumed_from_step=step, steps_run=step or 0)
        self.trial.set_user_attr(replicate_key(self.record.seed), self.record.as_attr())

    def restore_reports(self, step: int) -> None:
        """A resume from `step`'s checkpoint continues the lost attempt's MLflow run: what
        that attempt reported up to the checkpoint is read back from it, so that this trial
        holds it as an uninterrupted one would: the objective's points in Optuna (a pruned
        trial's value is its last point; the objective pruner compares them), the baseline
        eval, the warnings already fired (each said and logged once), the forecaster's
        points. Once: a second call (the backend said it, then the job's end) changes nothing."""
        if self.restored:
            return
        self.restored = True
        client, run_id = self.run.client, self.run.run_id
        if self.reports_to_optuna:
            for s, (value, _) in sorted(seed_curve(client, run_id, self.objective).items()):
                if s <= step:
                    self.trial.report(value, s)
        self.baseline = dict(history(client, run_id, EVAL_REWARD)).get(0)
        tags = client.get_run(run_id).data.tags
        prefix = Tag.WARNING_PREFIX
        self.warnings.update(
            {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)}
        )
        if self.forecaster is not None:
            self.forecaster.resume(step, self.run)

    def params(self, params: Mapping[str, Any]) -> None:
        """What the run decided on this host (threads, oneDNN), beside its hyperparameters."""
        self.run.log_decided(params)

    def _still_ours(self) -> None:
        # Taken over (another worker saw it stale and queued its point): stop writing at once.
        if oa.fresh(self.trial.study, oa.trial_id(self.trial)).state != TrialState.RUNNING:
            raise TakenOver(f"t{self.trial.number} was taken over by another worker")

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self._still_ours()
        self.run.log_metrics(step, metrics)
        self.last.update(metrics)
        self.steps_run = step
        if self.line is not None:
            self.line.step(step, metrics)
        if step == 0:
            self.baseline = metrics.get(EVAL_REWARD)
            truncated = metrics.get(EVAL_TRUNCATED)
            if self.reports_to_optuna and is_finite_number(truncated):  # its first seed's
                # what the verdict's next step reads (analysis/next_step.py)
                self.trial.set_user_attr(TrialAttr.BASELINE_TRUNCATED, truncated)
            if self.baseline_check is not None and (line := self.baseline_check(metrics)):
                log.warning(line)
        value = metrics.get(self.objective)
        known = value is not None and math.isfinite(value)
        if known and self.reports_to_optuna:
            self.trial.report(value, step)
        # Health first: a run collapsing at an eval step is a health breach (it marks its
        # configuration unsafe), not a forecast's or the objective pruner's stop.
        fired = self.monitor.breaches(step, metrics)
        breach = first_to_prune(fired)
        if breach is not None:  # its step's warnings would repeat what the prune says
            raise TrialPruned(breach)
        self.record_warnings(step, fired)
        if not known:
            return
        if self.prune_on_objective and self.trial.should_prune():
            raise TrialPruned(None)
        if self.forecaster is not None:
            stderr = metrics.get(stderr_of(self.objective))
            stop = self.forecaster.judge(step, value, stderr, self.run)
            if stop is not None:
                raise TrialPruned(stop)

    def record_warnings(self, step: int, fired: list[Breach]) -> None:
        """A warning rule's first firing: a tag with its line and a metric at its step."""
        for breach in fired:
            if breach.action != Action.warn.value or breach.rule in self.warnings:
                continue
            self.warnings[breach.rule] = str(breach)
            log.warning("t%s warning: %s", self.trial.number, breach)
            self.run.set_tags({Tag.WARNING_PREFIX + breach.rule: str(breach)})
            self.run.log_metrics(step, {WARNING_METRIC_PREFIX + breach.rule: 1.0})


def run(cfg: DictConfig) -> float:
    """Hydra's task function: a sweep trial's run when bound to one, else a single run."""
    if cfg.trial.id is None:
        return train_and_log(training_config(cfg))
    return run_trial(cfg)


def run_trial(cfg: DictConfig) -> float:
    cfg = configured(cfg)  # a `trl grpo` recipe's values, where the overrides set none
    binding = cfg.trial
    if binding.db_retry_seconds is not None:
        set_retry_window(binding.db_retry_seconds)
    study = load_study(binding.storage, binding.study)
    trial = optuna.Trial(study, binding.id)
    attrs = study.user_attrs
    several_seeds = attrs.get(StudyAttr.SEEDS, 1) > 1
    # Each host reaches the tracking store at its own address: this process's
    # MLFLOW_TRACKING_URI when set, else the one the study's creator recorded.
    uri = os.environ.get("MLFLOW_TRACKING_URI") or attrs[StudyAttr.MLFLOW_TRACKING_URI]
    client = tracking_client(uri)
    resumed_from = resumed_step(cfg)
    earlier = trial.user_attrs.get(TrialAttr.RESUME_DIRS, {}).get(str(cfg.seed), {})
    if earlier.get("run_id"):  # checkpoint or not: one run per point, one unbroken curve
        run = MLflowRun.attach(earlier["run_id"], client)
    else:
        run = MLflowRun(
            cfg.experiment,
            trial_run_name(binding.number, trial.params, cfg.seed if several_seeds else None),
            parent_run_id=binding.parent_run_id,
            tags={
                Tag.ROLE: Role.TRIAL,
                Tag.STUDY: binding.study,
                Tag.TRIAL_NUMBER: str(binding.number),
                Tag.SEED: str(cfg.seed),
            },
            client=client,
        )
        mark_objective(run, binding.study, attrs[StudyAttr.OBJECTIVE], uri)
    if earlier.get("run_id") or resumed_from is not None:  # the guess's tag, fixed on load
        resumed = {} if resumed_from is None else {Tag.RESUMED_FROM_STEP: resumed_from}
        run.set_tags({Tag.TRIAL_NUMBER: str(binding.number), **resumed})
    if not several_seeds:  # with several, the trial's run is its configuration run
        trial.set_user_attr(TrialAttr.MLFLOW_RUN_ID, run.run_id)
    started = Replicate(
        seed=cfg.seed,
        state=State.RUNNING,
        value=None,
        stderr=None,
        steps_run=resumed_from or 0,
        baseline=None,
        reason="",
        run_id=run.run_id,
        output_dir=str(Path(cfg.output_dir).absolute()),
        resumed_from_step=resumed_from,
        device=str(cfg.model.device),
    )
    trial.set_user_attr(replicate_key(cfg.seed), started.as_attr())
    train_cfg = training_config(cfg)
    run.log_training_config(train_cfg, run_params(train_cfg))
    first = binding.replicate == 0
    reporter = trial_reporter(run, trial, attrs, started, first, train_cfg.max_steps, cfg.seed)
    if binding.number == 0 and first:  # once a sweep, at its first baseline
        reporter.baseline_check = functools.partial(
            truncation_warning, max_tokens=train_cfg.max_tokens
        )
    seed = f" s{cfg.seed}" if several_seeds else ""
    reporter.line = TrialLine(
        f"[sweep {binding.study}] t{binding.number}{seed} {short(trial.params)}".rstrip(),
        train_cfg.max_steps,
    )
    error: BaseException | None = None
    result = None
    try:
        result = train(train_cfg, reporter)
        return objective_value(reporter)
    except BaseException as e:
        error = e
        raise
    finally:
        # A store that stayed away (nothing can be recorded) or a rank that died: the sweep
        # sees the run lost and queues it again. Taken over: the trial and its run are the
        # other worker's now.
        if not isinstance(error, DatabaseUnreachable | RankLost | TakenOver):
            if result is not None:  # what the backend loaded, had it not said so already
                reporter.resumed(result.resumed_from_step)
            replicate = ended_replicate(reporter.record or started, reporter, result, error)
            trial.set_user_attr(replicate_key(cfg.seed), replicate.as_attr())
            interrupted = isinstance(error, KeyboardInterrupt)
            close_trial_run(run.run_id, replicate.state, replicate.reason, interrupted, client)


def trial_reporter(
    run: Any,
    trial: optuna.Trial,
    attrs: Mapping[str, Any],
    record: Replicate,
    first: bool,
    max_steps: int,
    seed: int,
) -> TrialReporter:
    """One seed's reporter, from the study's attrs: its health rules, the objective pruner on
    the first seed only (Optuna keeps one curve a trial), the forecaster with pruner=forecast.
    bench/bench_cost.py replays recorded runs through it."""
    reporter = TrialReporter(
        run,
        trial,
        attrs[StudyAttr.OBJECTIVE],
        HealthMonitor(
            rules_from_settings(attrs[StudyAttr.HEALTH_RULES], attrs[StudyAttr.KL_THRESHOLD])
        ),
        reports_to_optuna=first,
        prune_on_objective=first and attrs[StudyAttr.PRUNER] not in ("none", FORECAST),
        record=record,
    )
    if attrs[StudyAttr.PRUNER] == FORECAST:
        reporter.forecaster = Forecaster(
            trial,
            max_steps,
            attrs[StudyAttr.FORECAST_LEVEL],
            attrs[StudyAttr.DIRECTION] == "maximize",
            seed,
        )
    return reporter


def objective_value(reporter: TrialReporter) -> float:
    value = reporter.last.get(reporter.objective)
    if value is None:
        known = ", ".join(sorted(reporter.last)) or "none"
        raise KeyError(f"objective {reporter.objective!r} was never reported (metrics: {known})")
    if not math.isfinite(value):
        raise FloatingPointError(f"objective {reporter.objective}={value}")
    return float(value)


def ended_replicate(
    started: Replicate,
    reporter: TrialReporter,
    result: Any,
    error: BaseException | None,
) -> Replicate:
    """This seed's record (a `Replicate`) as it ended: completed, pruned or failed."""
    objective = reporter.objective
    per_problem = None
    if result is not None:
        per_problem = getattr(result, "final_eval_rewards", {}).get(objective)
    if error is None:
        state, reason, breach = State.COMPLETE, "", None
    elif isinstance(error, TrialPruned):
        state, reason = State.PRUNED, str(error)
        breach = error.breach.as_dict() if error.breach is not None else None
    elif isinstance(error, KeyboardInterrupt):
        state, reason, breach = State.FAIL, "interrupted", None
    else:
        state, reason, breach = State.FAIL, fail_reason(error), None
    return replace(
        started,
        state=state,
        value=reporter.last.get(objective) if state == State.COMPLETE else None,
        stderr=reporter.last.get(stderr_of(objective)),
        steps_run=max(reporter.steps_run, started.steps_run),
        baseline=reporter.baseline,
        reason=reason,
        breach=breach,
        per_problem=tuple(per_problem) if per_problem is not None else None,
        warnings=tuple(reporter.warnings.values()),
    )


@functools.cache
def load_study(storage: str, name: str) -> optuna.Study:
    """The study as a job sees it: a no-op sampler, the objective pruner the study recorded.

    Cached per process, so a launcher that runs many jobs in one process opens the storage
    once.
    """
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    attrs = study.user_attrs
    pruner = make_pruner(attrs[StudyAttr.PRUNER], attrs[StudyAttr.PRUNER_WARMUP_STEPS])
    study.pruner = pruner
    study.sampler = optuna.samplers.RandomSampler()
    return study
