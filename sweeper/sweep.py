"""The sweep: check everything, open the study, then take -> launch -> tell until done.

Several sweeper processes may run the same command against one storage (a shared
PostgreSQL, or one SQLite file on a machine); the study is the only shared state. Its plan
is a queue of slots (sweeper/slots.py) that each worker takes from, so a grid is covered
once and TPE runs n_trials in total, whatever the number of workers. Interrupted trials
(kill -9, Ctrl-C) are failed and their points queued again for any worker to take.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from typing import Any

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.trial import Trial, TrialState

from hydra_plugins.grpo_sweeper.config import GRPOSweeperConf
from sweeper import records, slots
from sweeper.display import final_table, progress_line, say
from sweeper.errors import SweepError, fail_reason
from sweeper.preflight import check_points, compose, one_line
from sweeper.pruning import PRUNERS, KLPruneRule
from sweeper.samplers import SamplerChoice, choose_sampler
from sweeper.space import SearchSpace, format_value, parse_space, show
from sweeper.storage import Heartbeat, fail_stale_trials, open_storage, resolve_url
from sweeper.study import StudySpec, open_study
from sweeper.tuned import tuned_notes, tuned_path, write_tuned
from trainer.tracking import check_tracking_uri
from trainer.validation import ConfigError

log = logging.getLogger(__name__)

STALE_REASON = "interrupted: its sweeper stopped (killed or lost) while it ran; queued again"
CTRL_C_REASON = "interrupted (Ctrl-C); queued again"


class FailureRateExceeded(SweepError):
    pass


class SweepRunner:
    """What GRPOSweeper.setup/sweep hand over to."""

    def __init__(
        self,
        settings: GRPOSweeperConf,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.s = settings
        self.config = config
        self.config_loader = hydra_context.config_loader
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.in_flight: list[Trial] = []
        self.best_written: int | None = None

    def sweep(self, arguments: list[str]) -> list[JobReturn]:
        try:
            return self._sweep(arguments)
        except SweepError as e:
            sys.exit(f"error: {e}")

    def _sweep(self, arguments: list[str]) -> list[JobReturn]:
        self.space, self.plan, rule = self._plan(arguments)
        self.url = resolve_url(self.s.storage)
        self.name = self.s.study_name or default_study_name(self.space, self.plan, self.s)
        checked = check_points(self.config_loader, self.config, self.space)
        log.info("Checked %d configurations of the search space", checked)
        if self.plan.is_grid and self.plan.planned > self.s.max_grid_size:
            raise SweepError(
                f"hydra.sweeper.max_grid_size={self.s.max_grid_size}: the grid has "
                f"{self.plan.planned} points; to run them all, confirm with "
                f"hydra.sweeper.max_grid_size={self.plan.planned}"
            )
        try:
            check_tracking_uri()
        except ConfigError as e:
            raise SweepError(str(e)) from None
        self.storage = open_storage(self.url, self.s.heartbeat_interval, self.s.grace_period)
        spec = StudySpec(self.name, self.space, self.plan, rule, self.s, self.config.experiment)
        study, self.parent_run_id = open_study(self.storage, spec)
        swept = " ".join(f"{p.key}={p.spec}" for p in self.space.params.values()) or "defaults"
        say(f"[sweep {self.name}] {self.plan.name} over {swept}: {self.plan.planned} trials")
        returns: list[JobReturn] = []
        try:
            self._loop(study, returns)
        except KeyboardInterrupt:
            self._interrupted(study)
        except FailureRateExceeded:
            self._finish(study, "FAILED")
            raise
        self._finish(study, "FINISHED")
        return returns

    def _plan(self, arguments: list[str]) -> tuple[SearchSpace, SamplerChoice, KLPruneRule]:
        s = self.s
        space = parse_space(OmegaConf.to_container(OmegaConf.create(s.params)), arguments)
        plan = choose_sampler(s.sampler, space, s.n_trials, s.seed)
        for ok, name, rule in [
            (s.direction in ("maximize", "minimize"), "direction", "maximize or minimize"),
            (s.n_jobs >= 1, "n_jobs", "must be >= 1"),
            (0 <= s.max_failure_rate <= 1, "max_failure_rate", "must be in [0, 1]"),
            (s.pruner in PRUNERS, "pruner", f"must be one of {PRUNERS}"),
            (s.heartbeat_interval >= 1, "heartbeat_interval", "must be >= 1"),
        ]:
            if not ok:
                raise SweepError(f"hydra.sweeper.{name}={getattr(s, name)!r}: {rule}")
        threshold = s.kl_threshold if s.kl_threshold is not None else self.config.kl_threshold
        try:
            rule = KLPruneRule(s.kl_metric, threshold, s.kl_patience, s.kl_warmup_steps)
        except ValueError as e:
            raise SweepError(f"hydra.sweeper.{e}") from None
        return space, plan, rule

    def _finish(self, study: optuna.Study, status: str) -> None:
        records.finish_parent_run(self.parent_run_id, study, status)
        print(final_table(study), flush=True)
        say(progress_line(study, self.plan.planned))

    # --- the loop ---------------------------------------------------------------------

    def _loop(self, study: optuna.Study, returns: list[JobReturn]) -> None:
        while True:
            if self.s.fail_stale_trials:
                for trial in fail_stale_trials(study, STALE_REASON):
                    self._give_back(study, trial, "FAILED")
            counts = slots.Counts.of(study)
            self._check_failures(counts)
            trials = []
            while len(trials) < self.s.n_jobs:
                trial = self._take(study)
                if trial is None:
                    break
                trials.append(trial)
            if trials:
                returns.extend(self._run_batch(study, trials))
            elif counts.running and self.storage.heartbeat_interval:
                say(progress_line(study, self.plan.planned) + "; waiting for other workers")
                time.sleep(self.storage.heartbeat_interval)
            else:
                return

    def _check_failures(self, counts: slots.Counts) -> None:
        if counts.failed > self.s.max_failure_rate * self.plan.planned:
            raise FailureRateExceeded(
                f"{counts.failed} of {self.plan.planned} planned trials failed, more than "
                f"max_failure_rate={self.s.max_failure_rate} allows; see the table above"
            )

    def _take(self, study: optuna.Study) -> Trial | None:
        trial = slots.take(study, self.url, self.space.distributions)
        if trial is not None:
            if self.storage.heartbeat_interval:  # at once: a trial never beaten is never stale
                self.storage.record_heartbeat(trial._trial_id)
            trial.set_user_attr("overrides", self.space.overrides(trial.params))
        return trial

    def _run_batch(self, study: optuna.Study, trials: list[Trial]) -> list[JobReturn]:
        self.in_flight = trials
        jobs = [self._job_overrides(t) for t in trials]
        for t in trials:
            say(f"[sweep {self.name}] t{t.number} {show(t.params)} started")
        with Heartbeat(self.storage, [t._trial_id for t in trials]):
            try:
                returns = list(self.launcher.launch(jobs, initial_job_idx=trials[0].number))
            except Exception as e:  # the launcher itself failed (e.g. a worker process died)
                returns = [_failed_return(e) for _ in trials]
        for trial, ret in zip(trials, returns, strict=True):
            self._tell(study, trial, ret)
            say(progress_line(study, self.plan.planned))
        self.in_flight = []
        self._update_tuned(study)
        return returns

    def _job_overrides(self, trial: Trial) -> list[str]:
        binding = {
            "trial.id": trial._trial_id,
            "trial.number": trial.number,
            "trial.storage": self.url,
            "trial.study": self.name,
            "trial.parent_run_id": self.parent_run_id,
        }
        quoted = [f"{k}={_quote(v)}" for k, v in binding.items()]
        subdir = f"hydra.sweep.subdir=t{trial.number}"  # outputs by trial number, across resumes
        return [*self.space.overrides(trial.params), *quoted, subdir]

    def _tell(self, study: optuna.Study, trial: Trial, ret: JobReturn) -> None:
        """The job's outcome into the study; its MLflow run the job closed itself."""
        error = ret._return_value if ret.status == JobStatus.FAILED else None
        if isinstance(error, optuna.TrialPruned):
            study.tell(trial, state=TrialState.PRUNED)
            return
        if error is None:
            value = _as_float(ret.return_value)
            if value is not None:
                study.tell(trial, values=value)
                return
            error = ValueError(f"objective {ret.return_value!r} is not a finite number")
        reason = fail_reason(error)
        log.warning("t%d failed: %s", trial.number, reason)
        trial.set_user_attr("fail_reason", reason)
        study.tell(trial, state=TrialState.FAIL)
        records.end_trial_run(trial.user_attrs.get("mlflow_run_id"), "FAILED", reason)

    def _give_back(self, study: optuna.Study, trial, run_status: str) -> None:
        """An interrupted trial: close its MLflow run and queue its point again."""
        reason = trial.user_attrs.get("fail_reason", STALE_REASON)
        records.end_trial_run(trial.user_attrs.get("mlflow_run_id"), run_status, reason)
        slots.give_back(study, trial)
        say(f"[sweep {self.name}] t{trial.number} was interrupted; its point is queued again")

    def _interrupted(self, study: optuna.Study) -> None:
        """Ctrl-C: fail the trials in flight (queued again), close the runs, exit non-zero."""
        for trial in self.in_flight:
            if study._storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
                continue
            trial.set_user_attr("fail_reason", CTRL_C_REASON)
            trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL)
            self._give_back(study, study._storage.get_trial(trial._trial_id), "KILLED")
        records.finish_parent_run(self.parent_run_id, study, "KILLED")
        say(progress_line(study, self.plan.planned))
        sys.exit(f"interrupted: study {self.name!r} is saved; resume with the same command")

    def _update_tuned(self, study: optuna.Study) -> None:
        """Rewrite tuned/<study>.yaml whenever the study has a new best trial."""
        best = records.best_trial(study)
        if best is None or best.number == self.best_written:
            return
        overrides = best.user_attrs["overrides"]
        cfg = compose(self.config_loader, self.config, overrides, keep_hydra=True)
        notes = tuned_notes(self.name, self.url, best, self.s.objective, self.s.direction)
        path = tuned_path(self.name)
        write_tuned(path, cfg, overrides, notes)
        self.best_written = best.number
        say(f"[sweep {self.name}] new best t{best.number}: wrote {path}")


def default_study_name(space: SearchSpace, plan: SamplerChoice, s: GRPOSweeperConf) -> str:
    """Stable for the same command: a hash of the sorted overrides and search settings."""
    swept = [f"{p.key}={p.spec}" for p in space.params.values()]
    key = {
        "overrides": sorted([*space.fixed, *swept]),
        "sampler": plan.name,
        "objective": s.objective,
        "direction": s.direction,
    }
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"grpo-{digest[:8]}"


def _quote(value: Any) -> str:
    """A binding value as an override: strings quoted (URLs hold ':', '@', '?')."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return format_value(value)


def _as_float(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _failed_return(error: Exception) -> JobReturn:
    ret = JobReturn()
    ret.status = JobStatus.FAILED
    ret._return_value = RuntimeError(one_line(error))
    return ret
