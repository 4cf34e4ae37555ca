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

Each configuration in flight moves through explicit phases (training, broken, holding, told:
the diagram is in flights.py); `_take_configuration`, `_job_ended`, `_look` and `_look_again`
make the moves, and nothing else changes a phase.

Beside it: start.py opens the study, flights.py says what each job runs, tell.py records a
configuration's outcome (or queues its point again), tuned.py writes the tuned file.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from analysis.verdict import named_trial, study_verdict
from judge import race
from judge.configs import counts_broken
from records.database import DatabaseUnreachable
from records.sweep import State, StudyAttr, TrialAttr, is_interrupted, replicates
from sweeper import SweepError
from sweeper import optuna_adapter as oa
from sweeper.plan.preflight import one_line
from sweeper.plan.settings_schema import GRPOSweeperConf
from sweeper.plan.sweep_plan import SweepPlan
from sweeper.results import display, runs
from sweeper.results.display import final_table, progress_line, say
from sweeper.study import slots
from sweeper.study.heartbeat import Heartbeat
from sweeper.sweep import packs, racing, terminator, trial_process
from sweeper.sweep.devices import DevicePool
from sweeper.sweep.flights import InFlight, Job, Phase, planned, quote, seed_job, seeds_of
from sweeper.sweep.signals import SignalInterrupt, end_child_processes, leave, signals_interrupt
from sweeper.sweep.start import start_sweep
from sweeper.sweep.tell import (
    close_runs_left_running,
    floor_of,
    give_back_interrupted,
    give_back_lost,
    tell_if_still_ours,
)
from sweeper.sweep.tuned import TunedFile
from trainer.model import cpu_threads

log = logging.getLogger(__name__)

HOLD_POLL_S = 1.0  # how often a held leader looks again for the others' seeds


class FailureRateExceeded(SweepError):
    pass


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
        self.plan = plan
        self.s, self.space, self.name = plan.settings, plan.space, plan.name
        self.search_sampler = plan.search_sampler
        self.conf = conf
        self.config = config
        self.hydra_context, self.task_function = hydra_context, task_function
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.in_flight: dict[int, InFlight] = {}
        self.tuned = TunedFile(self.name, self.s, hydra_context.config_loader, config)
        self.last_progress = ""  # the progress line said last, so the end does not repeat it

    def sweep(self) -> list[JobReturn]:
        try:
            return self._sweep()
        except DatabaseUnreachable as e:  # the trials in flight are queued again on resume
            end_child_processes()
            # Nothing more can be recorded: leave at once, so that no job thread still waiting
            # on the database speaks after this line (an orderly exit joins those threads).
            leave(f"error: {e}; resume with the same command once it is back")

    def _sweep(self) -> list[JobReturn]:
        # Jobs run in the trial process when the command started one (trial_process.py).
        self.in_trial_process = self.inline and trial_process.usable(self.task_function)
        if not self.in_trial_process:
            trial_process.stop()
            if self.inline:
                trial_process.import_in_background()
        if self.inline:
            display.trials_run_here()
        processes = self.config.backend.processes  # devices a trial takes
        self.devices = DevicePool.from_setting(self.conf.devices, self.lanes, processes)
        # Each run shares the host's cores with the others at once (launcher workers start
        # after this, so they inherit it): trainer/model/cpu_threads.py.
        os.environ[cpu_threads.RUNS_AT_ONCE] = str(self.lanes)
        display.quiet_third_party(self.config.hydra.verbose)
        study, self.parent_run_id = start_sweep(self.plan, self.config.experiment)
        with signals_interrupt():
            try:
                self._loop(study)
            except KeyboardInterrupt as e:
                self._interrupted(study, e)
            except FailureRateExceeded:
                self._finish(study, "FAILED")
                raise
            finally:  # the last job has ended: the verdict needs none of its imports
                trial_process.stop()
        self._finish(study, "FINISHED")
        return []

    @functools.cached_property  # its warnings said once
    def lanes(self) -> int:
        """Runs at once: the basic launcher runs jobs in this process, one at a time."""
        if type(self.launcher).__name__ == "BasicLauncher":
            if self.s.n_jobs > 1:
                log.warning(
                    "hydra.sweeper.n_jobs=%(n)d with the basic launcher runs one trial at a time; "
                    "use hydra/launcher=joblib for %(n)d at once",
                    {"n": self.s.n_jobs},
                )
            return 1
        if self.s.pack > 1:
            log.warning("hydra.sweeper.pack=%d packs the basic launcher's jobs only", self.s.pack)
        return self.s.n_jobs

    def _finish(self, study: optuna.Study, status: str) -> None:
        close_runs_left_running(study)
        trials = study.get_trials(deepcopy=False)
        verdict = study_verdict(study, study.user_attrs, self.s.maximize)
        best = named_trial(trials, verdict, self.s.maximize)
        runs.finish_parent_run(self.parent_run_id, trials, best, status, verdict.text)
        runs.log_intervals(trials, verdict.ranked)  # the study's MLflow view shows them
        self.tuned.update(study, rewrite=True, named=verdict)  # its notes carry the final verdict
        link = runs.runs_link(self.config.experiment, self.name, study.user_attrs)
        table = final_table(study, verdict, self.config.hydra.verbose)
        if self.search_sampler.is_grid:
            floor = floor_of(trials, self.s)
            table += "\n" + display.cost_line(trials, self.config.max_steps, floor)
        print("\n".join([table, *(["", *link] if link else [])]), flush=True)
        stopped = study.user_attrs.get(StudyAttr.STOPPED)
        line = progress_line(study, self.search_sampler.planned, self.s.maximize)
        if stopped or line != self.last_progress:  # the verdict above holds the rest
            say(f"{line}; {stopped}" if stopped else line)

    # --- the loop ---------------------------------------------------------------------

    @property
    def inline(self) -> bool:
        """Jobs run in this process, one at a time (the basic launcher)."""
        return self.lanes == 1 and type(self.launcher).__name__ == "BasicLauncher"

    def _loop(self, study: optuna.Study) -> None:
        pending: deque[Job] = deque()
        running: dict[Future, Job] = {}
        inline = self.inline
        with (
            ThreadPoolExecutor(self.lanes, thread_name_prefix="lane") as pool,
            Heartbeat(study, self._in_flight_ids) as self.heartbeat,
        ):
            while True:
                give_back_lost(study, self.s, self.name)
                self._check_failures(study)
                job = None
                while len(running) < self.lanes and (job := self._next_job(study, pending)):
                    if inline:  # in this thread, so Ctrl-C and SIGTERM reach the training loop
                        self._run_here(job, study, pending)
                        break
                    running[pool.submit(self._launch, [job])] = job
                if running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        self._job_ended(study, running.pop(future), future.result()[0], pending)
                elif job is None and self.in_flight:  # only held ones, waiting for others to end
                    time.sleep(HOLD_POLL_S)
                    self._look_again(study, pending)
                elif job is None and not self._wait_for_others(study):
                    return

    def _say_progress(self, study: optuna.Study) -> None:
        self.last_progress = progress_line(study, self.search_sampler.planned, self.s.maximize)
        say(self.last_progress)

    def _in_flight_ids(self) -> list[int]:
        return [oa.trial_id(f.trial) for f in list(self.in_flight.values())]

    def _wait_for_others(self, study: optuna.Study) -> bool:
        """Nothing left to take; trials of other workers still run. True: look again."""
        if not display.Counts.of(study).running and not slots.never_queued_again(
            study.get_trials(deepcopy=False)
        ):  # nothing running, and no point a killed worker left to queue again
            return False
        say(
            progress_line(study, self.search_sampler.planned, self.s.maximize)
            + "; waiting for other workers"
        )
        time.sleep(self.s.heartbeat_interval)
        return True

    def _check_failures(self, study: optuna.Study) -> None:
        failed = display.Counts.of(study).failed
        if failed > self.s.max_failure_rate * self.search_sampler.planned:
            raise FailureRateExceeded(
                f"{failed} of {self.search_sampler.planned} planned trials failed, more than "
                f"max_failure_rate={self.s.max_failure_rate} allows; see the table above"
            )

    def _next_job(self, study: optuna.Study, pending: deque[Job]) -> Job | None:
        """A seed still to run of a configuration in flight, else one of a new configuration."""
        while True:
            while pending:
                job = pending.popleft()
                flight = self.in_flight.get(job.trial.number)  # gone: it was told
                if flight is not None and flight.phase is Phase.TRAINING:
                    flight.started += 1
                    return job
            if not self._take_configuration(study, pending):
                return None

    def _take_configuration(self, study: optuna.Study, pending: deque[Job]) -> bool:
        """The plan's next slot into flight, its seeds' jobs queued. False: none to take."""
        if self.s.terminator and study.user_attrs.get(StudyAttr.STOPPED):
            return False  # nothing more to gain (any worker may have found it): take no slot
        trial = slots.take(study, self.s.storage, self.space.distributions)
        if trial is None:
            return False
        trial.set_user_attr(TrialAttr.OVERRIDES, self.space.overrides(trial.params))
        seeds = seeds_of(self.config.seed, self.s.seeds)
        # Seeds an interrupted run of this configuration completed are kept, not run again.
        carried = [r.seed for r in replicates(trial) if r.state == State.COMPLETE]
        config_run = None
        if len(seeds) > 1:
            config_run = runs.start_config_run(
                self.config.experiment,
                self.parent_run_id,
                self.name,
                trial.number,
                trial.params,
                self.s.objective,
            )
            trial.set_user_attr(TrialAttr.MLFLOW_RUN_ID, config_run)
        flight = InFlight(trial, seeds, config_run, len(carried), dict.fromkeys(carried))
        self.in_flight[trial.number] = flight
        self.heartbeat.beat([oa.trial_id(trial)])  # at once: a trial never beaten is never stale
        display.say_started(self.name, trial.number, trial.params, self.inline)
        pending.extend(self._job(flight, s) for s in seeds if s not in carried)
        if flight.seeds_ended:  # every seed carried over: the race goes on from there
            self._settle(study, flight, pending)
        return True

    def _job(self, flight: InFlight, seed: int) -> Job:
        return seed_job(
            flight,
            seed,
            settings=self.s,
            study_name=self.name,
            parent_run_id=self.parent_run_id,
            space=self.space,
        )

    def _run_here(self, job: Job, study: optuna.Study, pending: deque[Job]) -> None:
        """`job` and the next ones, up to hydra.sweeper.pack, run in this thread as one
        (packs.py); a pack member's end is processed as it ends, and the next job (a seed
        its race adds, the next trial) takes its slot."""

        def next_job() -> Job | None:  # as the loop's turn does
            give_back_lost(study, self.s, self.name)
            self._check_failures(study)
            return self._next_job(study, pending)

        jobs = [job]
        while len(jobs) < self.s.pack and (more := self._next_job(study, pending)):
            jobs.append(more)
        ended = functools.partial(self._job_ended, study, pending=pending)
        packs.run_refilled(jobs, self._launch, ended, next_job)

    def _launch(self, jobs: list[Job], more=None) -> list[JobReturn]:
        """Their JobReturns: one job (in a lane's thread, or this one), or a pack (packs.py)
        and the jobs `more` adds to it."""
        with self.devices.lease() as device:
            on_device = [f"model.device={quote(device)}"] if device else []
            overrides = [job.overrides + on_device for job in jobs]
            numbers = [job.trial.number for job in jobs]
            args = (self.hydra_context, self.task_function, self.config, overrides, numbers)

            def next_job(index: int, ret: JobReturn) -> tuple[list[str], int] | None:
                job = more(index, ret)  # packs.launch's `more`: the Job's, on this device
                return (job.overrides + on_device, job.trial.number) if job else None

            refill = next_job if more else None
            try:
                if self.in_trial_process:
                    return trial_process.launch(*args, refill)
                if len(jobs) > 1:
                    return packs.launch(*args, refill)
                return list(self.launcher.launch(overrides, initial_job_idx=numbers[0]))
            except Exception as e:  # the launcher itself failed (e.g. a worker process died)
                if self.in_trial_process and not trial_process.usable(self.task_function):
                    trial_process.stop()  # killed (out of memory?): the next jobs run here
                    self.in_trial_process = False
                return [oa.failed_return(RuntimeError(one_line(e))) for _ in jobs]

    def _job_ended(self, study: optuna.Study, job: Job, ret: JobReturn, pending: deque) -> None:
        flight = self.in_flight[job.trial.number]
        flight.ended[job.seed] = ret
        if oa.job_error(ret) is not None and not counts_broken(
            oa.fresh(study, oa.trial_id(job.trial)),
            job.seed,
            floor_of(study.get_trials(deepcopy=False), self.s),
        ):  # failed, or stopped and not counted at the floor: its outcome is in
            flight.phase = Phase.BROKEN
        if flight.seeds_ended:
            self._settle(study, flight, pending)

    def _settle(self, study: optuna.Study, flight: InFlight, pending: deque) -> None:
        """`flight`'s started seeds have all ended: its look, and if that told its trial, the
        held leaders' looks (a tell can end another's hold)."""
        if self._look(study, flight, pending):
            self._look_again(study, pending)

    def _look(self, study: optuna.Study, flight: InFlight, pending: deque) -> bool:
        """The next phase of a configuration none of whose seeds runs (flights.py): one more
        seed, a hold, or told. True: told, and out of flight."""
        step = None
        if self.s.race and flight.phase is not Phase.BROKEN:
            trials = study.get_trials(deepcopy=False)
            me = oa.fresh(study, oa.trial_id(flight.trial))
            grid = self.search_sampler.is_grid
            settings = (self.s.max_seeds, self.s.maximize, grid, self.s.min_difference)
            cap = racing.Budget(self.s.budget_seeds, self.config.max_steps, planned(self.in_flight))
            step = racing.look(trials, me, *settings, floor=floor_of(trials, self.s), budget=cap)
            if step.action == race.SEED:
                flight.phase = Phase.TRAINING
                flight.seeds.append(max(flight.seeds) + 1)
                pending.appendleft(self._job(flight, flight.seeds[-1]))  # before new configs
                return False
            if step.action == race.HOLD:
                flight.phase = Phase.HOLDING
                return False
        del self.in_flight[flight.trial.number]
        tell_if_still_ours(study, flight, step.why if step else "", self.s, self.name)
        told = oa.fresh(study, oa.trial_id(flight.trial))
        if told.state.is_finished() and not is_interrupted(told):  # else tell said why
            counts = display.progress_counts(study, self.search_sampler.planned)
            say(display.end_line(self.name, told, counts))
            self.last_progress = progress_line(study, self.search_sampler.planned, self.s.maximize)
        else:
            self._say_progress(study)
        terminator.stop_if_nothing_to_gain(
            study, self.s, self.search_sampler.planned, self.parent_run_id, self.name
        )
        self.tuned.update(study)
        return True

    def _look_again(self, study: optuna.Study, pending: deque) -> None:
        """Held leaders look again, from the first, after each one told, until none is."""
        while True:
            held = [f for f in self.in_flight.values() if f.phase is Phase.HOLDING]
            if not any(self._look(study, f, pending) for f in held):  # stops at the first told
                return

    def _interrupted(self, study: optuna.Study, signal_: KeyboardInterrupt) -> None:
        """Ctrl-C or SIGTERM: stop the runs, fail them (queued again), close every MLflow run."""
        what = str(signal_) if isinstance(signal_, SignalInterrupt) else "Ctrl-C"
        end_child_processes()
        reason = f"interrupted ({what}); queued again"
        give_back_interrupted(study, list(self.in_flight.values()), reason, self.s, self.name)
        runs.finish_parent_run(
            self.parent_run_id, study.get_trials(deepcopy=False), None, "KILLED", verdict=""
        )
        self._say_progress(study)
        # Everything is recorded: leave without the interpreter's teardown, which collects
        # the model's garbage and, on a busy host, can outlast a preemption's grace period.
        leave(f"interrupted ({what}): study {self.name!r} is saved; resume with the same command")
