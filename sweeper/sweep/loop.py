"""The sweep: open the study of a checked plan (sweeper/plan/sweep_plan.py), then keep `n_jobs` runs going.

Several sweeper processes may run the same command against one storage (a shared
PostgreSQL, or one SQLite file on a machine); the study is the only shared state. Its plan
is a queue of slots (sweeper/study/slots.py), one per configuration, that each worker takes from,
so a grid is covered once and TPE runs n_trials in total, whatever the number of workers.

Within a worker, each configuration runs as `seeds` jobs (one per seed), and `n_jobs` lanes
launch jobs one at a time through Hydra's launcher: when a run ends or is pruned, its lane
takes the next job at once, so no slot waits for a batch-mate (hydra#1954). Interrupted
trials (kill -9, Ctrl-C, SIGTERM) are failed and their points queued again for any worker;
with `save_every` set, the point resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import Trial, TrialState

from analysis import records
from analysis.records import BREACH_CONSTRAINT, Replicate, State, StudyAttr, Tag, TrialAttr
from analysis.text import show
from analysis.tuned_file import tuned_notes, tuned_path, write_tuned
from analysis.verdict import study_verdict
from hydra_plugins.grpo_sweeper.config import GRPOSweeperConf
from sweeper import SweepError
from sweeper import optuna_adapter as oa
from sweeper.plan.preflight import compose, one_line
from sweeper.plan.space import format_value
from sweeper.plan.sweep_plan import SweepPlan
from sweeper.results import runs
from sweeper.results.display import final_table, progress_line, say
from sweeper.study import recovery, slots
from sweeper.study.create import StudySpec, open_study
from sweeper.study.storage import Heartbeat, exclusive, open_storage
from sweeper.sweep import racing, terminator
from sweeper.sweep.devices import DevicePool
from sweeper.sweep.outcome import combine, seeds_of
from sweeper.sweep.signals import SignalInterrupt, end_child_processes, signals_interrupt
from trainer.base.errors import fail_reason
from trainer.run.database import DatabaseUnreachable, set_retry_window
from trainer.run.tracking import check_tracking_uri, tracking_client
from trainer.run.validation import ConfigError

log = logging.getLogger(__name__)

HOLD_POLL_S = 1.0  # how often a held leader looks again for the others' seeds
STALE_REASON = "its sweeper stopped (killed or lost) while it ran"


class FailureRateExceeded(SweepError):
    pass


@dataclass
class Job:
    """One training run: one seed of one configuration."""

    trial: Trial
    seed: int
    replicate: int  # 0 for the first seed
    overrides: list[str]


@dataclass
class InFlight:
    """A configuration being trained: which of its seeds started and ended."""

    trial: Trial
    seeds: list[int]
    config_run_id: str | None  # its MLflow run when it has several seeds
    started: int = 0
    ended: dict[int, JobReturn | None] = field(default_factory=dict)  # None: carried over
    stop: bool = False  # a seed broke: start no more seeds of it
    hold: bool = False  # seeds=auto: it leads, and waits for the configurations still to come

    @property
    def done(self) -> bool:
        all_started = self.stop or self.started == len(self.seeds)
        return all_started and len(self.ended) == self.started


class SweepRunner:
    """Runs a checked plan (sweeper/plan/sweep_plan.py); GRPOSweeper.sweep hands over to it."""

    def __init__(
        self,
        plan: SweepPlan,
        conf: GRPOSweeperConf,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.s, self.space, self.name = plan.settings, plan.space, plan.name
        self.search_sampler = plan.search_sampler
        self.conf = conf
        self.config = config
        self.config_loader = hydra_context.config_loader
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.in_flight: dict[int, InFlight] = {}
        self.best_written: int | None = None

    def sweep(self) -> list[JobReturn]:
        try:
            return self._sweep()
        except DatabaseUnreachable as e:  # the trials in flight are queued again on resume
            end_child_processes()
            # Nothing more can be recorded: leave at once, so that no job thread still waiting
            # on the database speaks after this line (an orderly exit joins those threads).
            print(f"error: {e}; resume with the same command once it is back", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)

    def _sweep(self) -> list[JobReturn]:
        self.devices = DevicePool.from_setting(self.conf.devices, self.lanes)
        set_retry_window(self.s.db_retry_seconds)
        try:
            check_tracking_uri()
        except ConfigError as e:
            raise SweepError(str(e)) from None
        storage = open_storage(
            self.s.storage, self.s.heartbeat_interval, self.s.grace_period, patient=False
        )
        spec = StudySpec(self.name, self.space, self.search_sampler, self.s, self.config.experiment)
        study, self.parent_run_id = open_study(storage, spec)
        for line in runs.runs_link(self.config.experiment, self.name, study.user_attrs):
            say(f"[sweep {self.name}] {line.strip()}")
        if not self.s.terminator and study.user_attrs.get(StudyAttr.STOPPED):
            study.set_user_attr(StudyAttr.STOPPED, "")  # run on: the stop no longer holds
            say(f"[sweep {self.name}] terminator=false: the study runs on past its stop")
        swept = " ".join(f"{p.key}={p.spec}" for p in self.space.params.values()) or "defaults"
        seeds = f" x {self.s.seeds} seeds" if self.s.seeds > 1 else ""
        say(
            f"[sweep {self.name}] {self.search_sampler.name} over {swept}: {self.search_sampler.planned} trials{seeds}"
        )
        with signals_interrupt():
            try:
                self._loop(study)
            except KeyboardInterrupt as e:
                self._interrupted(study, e)
            except FailureRateExceeded:
                self._finish(study, "FAILED")
                raise
        self._finish(study, "FINISHED")
        return []

    @property
    def lanes(self) -> int:
        """Runs at once: the basic launcher runs jobs in this process, one at a time."""
        if type(self.launcher).__name__ == "BasicLauncher":
            if self.s.n_jobs > 1:
                log.warning(
                    "hydra.sweeper.n_jobs=%d with the basic launcher runs one trial at a time; "
                    "use hydra/launcher=joblib for %d at once",
                    self.s.n_jobs,
                    self.s.n_jobs,
                )
            return 1
        return self.s.n_jobs

    def _finish(self, study: optuna.Study, status: str) -> None:
        trials = study.get_trials(deepcopy=False)
        best = records.best_trial(trials, self.s.maximize)
        verdict = study_verdict(study, study.user_attrs, self.s.maximize)
        runs.finish_parent_run(self.parent_run_id, trials, best, status, verdict.text)
        self.best_written = None  # the tuned file's notes carry the final verdict
        self._update_tuned(study)
        link = runs.runs_link(self.config.experiment, self.name, study.user_attrs)
        print("\n".join([final_table(study, verdict), *(["", *link] if link else [])]), flush=True)
        stopped = study.user_attrs.get(StudyAttr.STOPPED)
        line = progress_line(study, self.search_sampler.planned, self.s.maximize)
        say(f"{line}; {stopped}" if stopped else line)

    # --- the loop ---------------------------------------------------------------------

    def _loop(self, study: optuna.Study) -> None:
        pending: deque[Job] = deque()
        running: dict[Future, Job] = {}
        inline = self.lanes == 1 and type(self.launcher).__name__ == "BasicLauncher"
        with (
            ThreadPoolExecutor(self.lanes, thread_name_prefix="lane") as pool,
            Heartbeat(study, self._in_flight_ids) as self.heartbeat,
        ):
            while True:
                self._recover_stale(study)
                self._check_failures(study)
                job = None
                while len(running) < self.lanes and (job := self._next_job(study, pending)):
                    if inline:  # in this thread, so Ctrl-C and SIGTERM reach the training loop
                        self._job_ended(study, job, self._launch(job), pending)
                        break
                    running[pool.submit(self._launch, job)] = job
                if running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        self._job_ended(study, running.pop(future), future.result(), pending)
                elif job is None and self.in_flight:  # only leaders held for others to end
                    time.sleep(HOLD_POLL_S)
                    self._look_again(study, pending)
                elif job is None and not self._wait_for_others(study):
                    return

    def _in_flight_ids(self) -> list[int]:
        return [oa.trial_id(f.trial) for f in list(self.in_flight.values())]

    def _recover_stale(self, study: optuna.Study) -> None:
        if not self.s.fail_stale_trials or not oa.stale_trial_ids(study):
            return
        with exclusive(self.s.storage):  # a worker filling the plan sees each point queued again
            for trial in recovery.fail_stale_trials(study, STALE_REASON, self.s.max_lost_in_a_row):
                self._give_back(study, trial)

    def _wait_for_others(self, study: optuna.Study) -> bool:
        """Nothing left to take; trials of other workers still run. True: look again."""
        if not slots.Counts.of(study).running:
            return False
        say(
            progress_line(study, self.search_sampler.planned, self.s.maximize)
            + "; waiting for other workers"
        )
        time.sleep(self.s.heartbeat_interval)
        return True

    def _check_failures(self, study: optuna.Study) -> None:
        failed = slots.Counts.of(study).failed
        if failed > self.s.max_failure_rate * self.search_sampler.planned:
            raise FailureRateExceeded(
                f"{failed} of {self.search_sampler.planned} planned trials failed, more than "
                f"max_failure_rate={self.s.max_failure_rate} allows; see the table above"
            )

    def _next_job(self, study: optuna.Study, pending: deque[Job]) -> Job | None:
        """A seed still to run of a configuration in flight, else a new configuration."""
        while pending:
            job = pending.popleft()
            flight = self.in_flight.get(job.trial.number)  # gone: a seed broke, it was told
            if flight is not None and not flight.stop:
                flight.started += 1
                return job
        if self.s.terminator and study.user_attrs.get(StudyAttr.STOPPED):
            return None  # nothing more to gain (any worker may have found it): take no slot
        trial = slots.take(study, self.s.storage, self.space.distributions)
        if trial is None:
            return None
        trial.set_user_attr(TrialAttr.OVERRIDES, self.space.overrides(trial.params))
        seeds = seeds_of(self.config.seed, self.s.seeds)
        # Seeds an interrupted run of this configuration completed are kept, not run again.
        carried = [r.seed for r in records.replicates(trial) if r.state == State.COMPLETE]
        config_run = None
        if len(seeds) > 1:
            config_run = runs.start_config_run(
                self.config.experiment, self.parent_run_id, self.name, trial.number, trial.params
            )
            trial.set_user_attr(TrialAttr.MLFLOW_RUN_ID, config_run)
        flight = InFlight(trial, seeds, config_run, len(carried), dict.fromkeys(carried))
        self.in_flight[trial.number] = flight
        self.heartbeat.beat([oa.trial_id(trial)])  # at once: a trial never beaten is never stale
        say(f"[sweep {self.name}] t{trial.number} {show(trial.params)} started")
        pending.extend(self._job(flight, s) for s in seeds if s not in carried)
        if flight.done:  # every seed carried over: the race goes on from there
            self._seeds_ended(study, flight, pending)
        return self._next_job(study, pending)

    def _job(self, flight: InFlight, seed: int) -> Job:
        replicate = flight.seeds.index(seed)
        return Job(flight.trial, seed, replicate, self._job_overrides(flight, seed, replicate))

    def _launch(self, job: Job) -> JobReturn:
        """One job through the launcher (a lane's thread, or this one for the basic launcher)."""
        with self.devices.lease() as device:
            overrides = job.overrides + ([f"model.device={_quote(device)}"] if device else [])
            try:
                return self.launcher.launch([overrides], initial_job_idx=job.trial.number)[0]
            except Exception as e:  # the launcher itself failed (e.g. a worker process died)
                return oa.failed_return(RuntimeError(one_line(e)))

    def _job_overrides(self, flight: InFlight, seed: int, replicate: int) -> list[str]:
        trial = flight.trial
        binding = {
            "trial.id": oa.trial_id(trial),
            "trial.number": trial.number,
            "trial.replicate": replicate,
            "trial.storage": self.s.storage,
            "trial.study": self.name,
            "trial.parent_run_id": flight.config_run_id or self.parent_run_id,
            "trial.db_retry_seconds": self.s.db_retry_seconds,
        }
        quoted = [f"{k}={_quote(v)}" for k, v in binding.items()]
        several = len(flight.seeds) > 1
        seeded = [f"seed={seed}"] if several else []
        subdir = f"hydra.sweep.subdir=t{trial.number}" + (f"-s{seed}" if several else "")
        # A retried point continues in the interrupted run's folder, from its last checkpoint.
        resume = trial.user_attrs.get(TrialAttr.RESUME_DIRS, {}).get(str(seed))
        resumed = [f"output_dir={_quote(resume['output_dir'])}", "resume=true"] if resume else []
        return [*self.space.overrides(trial.params), *seeded, *quoted, subdir, *resumed]

    def _job_ended(self, study: optuna.Study, job: Job, ret: JobReturn, pending: deque) -> None:
        flight = self.in_flight[job.trial.number]
        flight.ended[job.seed] = ret
        if oa.job_error(ret) is not None:  # a seed broke: the configuration's verdict is in
            flight.stop = True
        if flight.done:
            self._seeds_ended(study, flight, pending)

    def _seeds_ended(self, study: optuna.Study, flight: InFlight, pending: deque) -> None:
        """Every started seed ended: with seeds=auto one more seed, a hold, or the end of its
        race (sweeper/sweep/racing.py); then the study is told."""
        step = None
        if self.s.race and not flight.stop:
            trials = study.get_trials(deepcopy=False)
            me = oa.fresh(study, oa.trial_id(flight.trial))
            step = racing.look(
                trials, me, self.s.max_seeds, self.s.maximize, self.search_sampler.is_grid
            )
            flight.hold = step.action == racing.HOLD
            if step.action == racing.SEED:
                flight.seeds.append(max(flight.seeds) + 1)
                pending.appendleft(self._job(flight, flight.seeds[-1]))  # before new configs
            if step.action != racing.STOP:
                return
        del self.in_flight[flight.trial.number]
        self._tell_if_still_ours(study, flight, step.why if step else "")
        say(progress_line(study, self.search_sampler.planned, self.s.maximize))
        self._stop_if_nothing_to_gain(study)
        self._update_tuned(study)
        self._look_again(study, pending)

    def _stop_if_nothing_to_gain(self, study: optuna.Study) -> None:
        """terminator=true: once the best cannot plausibly be beaten by more than its noise,
        record why on the study (every worker reads it before taking a slot) and its MLflow
        run; configurations already started finish, queued slots stay queued."""
        if not self.s.terminator or study.user_attrs.get(StudyAttr.STOPPED):
            return
        if not slots.Counts.of(study).waiting:  # nothing left to stop
            return
        reason = terminator.stop_reason(
            study.get_trials(deepcopy=False),
            self.s.maximize,
            self.s.terminator_min_trials,
            self.search_sampler.planned,
            self.s.seed,
        )
        if reason is None:
            return
        study.set_user_attr(StudyAttr.STOPPED, reason)
        tracking_client(runs.tracking_uri()).set_tag(self.parent_run_id, Tag.STOPPED, reason)
        say(f"[sweep {self.name}] {reason}")

    def _look_again(self, study: optuna.Study, pending: deque) -> None:
        """A leader held for the configurations still to come looks again."""
        for flight in [f for f in self.in_flight.values() if f.hold]:
            if flight.trial.number in self.in_flight:
                self._seeds_ended(study, flight, pending)

    def _tell_if_still_ours(self, study: optuna.Study, flight: InFlight, race: str) -> None:
        """Tell the study, unless another worker found the trial stale meanwhile (it missed
        this worker's heartbeats) and queued its point again: that run counts, this is dropped."""
        try:
            if oa.fresh(study, oa.trial_id(flight.trial)).state == TrialState.RUNNING:
                self._tell(study, flight, race)
                return
        except UpdateFinishedTrialError:  # taken over between the look and the tell
            pass
        say(
            f"[sweep {self.name}] t{flight.trial.number} was taken over by another worker "
            "(its heartbeats were missed); this worker's result of it is dropped"
        )

    def _tell(self, study: optuna.Study, flight: InFlight, race: str = "") -> None:
        """The configuration's outcome, from what its seeds recorded, into the study."""
        trial = flight.trial
        if race:
            trial.set_user_attr(TrialAttr.RACE, race)
            say(f"[sweep {self.name}] t{trial.number}: {race}")
        recorded = {r.seed: r for r in records.replicates(oa.fresh(study, oa.trial_id(trial)))}
        # A seed carried over from an interrupted run has no job here (None): it completed.
        errors = {seed: ret and oa.job_error(ret) for seed, ret in flight.ended.items()}
        lost = recovery.lost_reason(errors, recorded)
        if lost:  # the infrastructure, not the configuration: run it again
            with exclusive(self.s.storage):
                if recovery.lose(study, oa.trial_id(trial), lost, self.s.max_lost_in_a_row):
                    self._give_back(study, oa.fresh(study, oa.trial_id(trial)))
            return
        for seed, ret in flight.ended.items():
            mine = recorded.get(seed)
            if mine is None or mine.state == State.RUNNING:  # its process died before recording
                error = (ret and oa.job_error(ret)) or RuntimeError(
                    "the job ended without a record"
                )
                recorded[seed] = _died(seed, mine, fail_reason(error))
                runs.close_trial_run(recorded[seed].run_id, State.FAIL, recorded[seed].reason)
        out = combine([recorded[s] for s in flight.ended], len(flight.seeds))
        trial.set_user_attr(TrialAttr.STEPS_RUN, out.steps_run)
        if out.baseline is not None:
            trial.set_user_attr(TrialAttr.BASELINE, out.baseline)
        if out.state == State.COMPLETE:
            study.tell(trial, values=out.value)
        elif out.state == State.PRUNED:
            if out.breach is not None:
                trial.set_user_attr(TrialAttr.PRUNE_REASON, out.breach)
                trial.set_constraint(BREACH_CONSTRAINT, 1.0)  # see records.BREACH_CONSTRAINT
            study.tell(trial, state=TrialState.PRUNED)
        else:
            log.warning("t%d failed: %s", trial.number, out.reason)
            trial.set_user_attr(TrialAttr.FAIL_REASON, out.reason)
            study.tell(trial, state=TrialState.FAIL)
        if flight.config_run_id:
            if race:
                tracking_client(runs.tracking_uri()).set_tag(flight.config_run_id, Tag.RACE, race)
            runs.close_config_run(flight.config_run_id, out, list(recorded.values()))

    def _give_back(self, study: optuna.Study, trial, killed: bool = False) -> None:
        """An interrupted trial: close its runs and queue its point again (to resume); one
        lost too often in a row (recovery.lose failed it): close its runs only."""
        reason = trial.user_attrs.get(TrialAttr.FAIL_REASON, STALE_REASON)
        resume_dirs, carried = {}, {}
        for rep in records.replicates(trial):
            if rep.state == State.COMPLETE:  # a seed that ended is kept, not run again
                carried[records.replicate_key(rep.seed)] = rep.as_attr()
                continue
            runs.close_trial_run(rep.run_id, State.FAIL, reason, killed=killed)
            if rep.output_dir:
                resume_dirs[str(rep.seed)] = {"output_dir": rep.output_dir, "run_id": rep.run_id}
        runs.close_trial_run(
            trial.user_attrs.get(TrialAttr.MLFLOW_RUN_ID), State.FAIL, reason, killed
        )
        if not records.is_interrupted(trial):
            say(f"[sweep {self.name}] t{trial.number} failed: {reason}")
            return
        slots.give_back(study, trial, resume_dirs, carried)
        say(f"[sweep {self.name}] t{trial.number} was interrupted; its point is queued again")

    def _interrupted(self, study: optuna.Study, signal_: KeyboardInterrupt) -> None:
        """Ctrl-C or SIGTERM: stop the runs, fail them (queued again), close every MLflow run."""
        what = str(signal_) if isinstance(signal_, SignalInterrupt) else "Ctrl-C"
        end_child_processes()
        reason = f"interrupted ({what}); queued again"
        with exclusive(self.s.storage):  # a worker filling the plan sees each point queued again
            for flight in list(self.in_flight.values()):
                trial_id = oa.trial_id(flight.trial)
                if recovery.interrupt(study, trial_id, reason):
                    self._give_back(study, oa.fresh(study, trial_id), killed=True)
        runs.finish_parent_run(
            self.parent_run_id, study.get_trials(deepcopy=False), None, "KILLED", verdict=""
        )
        say(progress_line(study, self.search_sampler.planned, self.s.maximize))
        sys.exit(
            f"interrupted ({what}): study {self.name!r} is saved; resume with the same command"
        )

    def _update_tuned(self, study: optuna.Study) -> None:
        """Rewrite tuned/<study>.yaml whenever the study has a new best trial."""
        best = records.best_trial(study.get_trials(deepcopy=False), self.s.maximize)
        if best is None or best.number == self.best_written:
            return
        overrides = best.user_attrs[TrialAttr.OVERRIDES]
        cfg = compose(self.config_loader, self.config, overrides, keep_hydra=True)
        verdict = study_verdict(study, study.user_attrs, self.s.maximize).text
        notes = tuned_notes(
            self.name, self.s.storage, best, self.s.objective, self.s.direction, verdict
        )
        path = tuned_path(self.name)
        write_tuned(path, cfg, overrides, notes)
        self.best_written = best.number
        say(f"[sweep {self.name}] new best t{best.number}: wrote {path}")


def _died(seed: int, started: Replicate | None, reason: str) -> Replicate:
    """The record of a seed whose job ended without writing one."""
    return Replicate(
        seed=seed,
        state=State.FAIL,
        value=None,
        stderr=None,
        steps_run=started.steps_run if started else 0,
        baseline=started.baseline if started else None,
        reason=reason,
        run_id=started.run_id if started else None,
    )


def _quote(value: Any) -> str:
    """A binding value as an override: strings quoted (URLs hold ':', '@', '?')."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return format_value(value)
