"""Packed jobs (`hydra.sweeper.pack=K`): up to K jobs of the basic launcher run as one, in
lockstep on one base model (trainer/packed/host.py), each still a trial of its own.

Each member runs exactly what the basic launcher runs for a job: Hydra's run_job (its output
folder, saved config, the task function, sweeper/sweep/job.py), in a thread of the pack's.
The trainer's train() finds the member it trains as (trainer/packed/members.py), so a member
gets a solo job's MLflow run, Optuna reports, health rules and record. A member that fails or
is pruned leaves the pack, the others go on; a signal stops every member at its next request
(each records itself interrupted) and then goes on here, as a solo job's does. Each member
logs to its own job's log file. Jobs that cannot share a base model (check_packable) run one
at a time, as without packing.

Slot refill: as a member ends, the sweep processes its end at once (run_refilled: its trial
told, its race's look) and gives the next queued job, which joins the running pack in its
slot (launch's `more`, between the host's rounds), so a pack stays at K members while work
is queued: a seed the race adds, or the trial Optuna asks next, need not wait for the pack.
A job that cannot join (its config no longer composes) fails alone, as a member that fails
in training does, and the next queued job is given its slot.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, configure_log, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from sweeper import optuna_adapter as oa
from sweeper.plan.preflight import one_line
from sweeper.results import display
from trainer.base.errors import ConfigError

log = logging.getLogger(__name__)


# Called as each pack member ends, with its place among the jobs launched (those it added
# counting on) and its JobReturn: the next job's (overrides, id) to take its slot, or None.
More = Callable[[int, JobReturn], "tuple[list[str], int] | None"]


def launch(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[list[str]],
    job_ids: Sequence[int],
    more: More | None = None,
) -> list[JobReturn]:
    """Each job's JobReturn, in order: one job through the basic launcher, several packed
    where they can share a base model; then those `more` added, in the order it added them.

    `more` is called on this thread, between the pack's rounds (no member runs meanwhile). A
    job it gives that cannot share the pack's model runs after the pack, which then takes no
    more (so that job does not wait for a pack that never ends)."""
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=hydra_context, task_function=task_function, config=config
    )
    if len(job_overrides) == 1:
        return list(launcher.launch([job_overrides[0]], initial_job_idx=job_ids[0]))
    setup_globals()
    jobs = _Jobs(hydra_context, config, list(job_overrides), list(job_ids))
    returns: dict[int, JobReturn] = {}
    for group in packable_groups(list(jobs.configs)):
        if len(group) == 1:
            (i,) = group
            returns[i] = launcher.launch([jobs.overrides[i]], initial_job_idx=jobs.ids[i])[0]
        else:
            packed = _run_pack(hydra_context, task_function, jobs, group, more)
            returns.update(zip(group, packed, strict=True))  # group: its members, joined too
    returns.update(jobs.failed)  # handed on as they failed to join
    for i in jobs.later:
        returns[i] = launcher.launch([jobs.overrides[i]], initial_job_idx=jobs.ids[i])[0]
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)  # as the launcher does
    return [returns[i] for i in range(len(jobs.configs))]


def run_refilled(
    jobs: list[Any],
    launch: Callable[[list[Any], Callable | None], list[JobReturn]],
    job_ended: Callable[[Any, JobReturn], None],
    next_job: Callable[[], Any],
) -> None:
    """The sweep's side: run `jobs` (one, or a pack) by `launch(jobs, more)`, and hand each
    one's end to `job_ended`. A pack member's is handed on as it ends, and the job `next_job`
    gives then (a seed the race adds, the next trial) joins the pack in its slot; both run
    on the thread that calls launch (launch's `more`). An error either raises meanwhile is
    raised once the pack has ended (its members go on)."""
    ended: set[int] = set()
    errors: list[Exception] = []

    def more(index: int, ret: JobReturn) -> Any:
        if errors:  # the rest are handed on once the pack has ended
            return None
        try:
            job_ended(jobs[index], ret)
            ended.add(index)
            job = next_job()
        except Exception as e:
            errors.append(e)
            return None
        if job is not None:
            jobs.append(job)
        return job

    returns = launch(jobs, more if len(jobs) > 1 else None)
    lost = oa.failed_return(RuntimeError("the pack ended without the job's return"))
    for i, job in enumerate(jobs):
        if i not in ended:
            job_ended(job, returns[i] if i < len(returns) else lost)
    if errors:
        raise errors[0]


def packable_groups(configs: list[DictConfig]) -> list[list[int]]:
    """The jobs' indices in packs: each job joins the first pack it can share a model with, in
    order; one that can share it with none runs alone."""
    from trainer.packed.packable import check_packable

    groups: list[list[int]] = []
    for i, cfg in enumerate(configs):
        for group in groups:
            try:
                check_packable([configs[group[0]], cfg])
            except ConfigError:
                continue
            group.append(i)
            break
        else:
            groups.append([i])
    for group in groups:  # a pack of one that cannot pack at all says why, once
        if len(group) == 1 and len(configs) > 1:
            try:
                check_packable([configs[group[0]]])
            except ConfigError as e:
                log.info("job %d runs unpacked: %s", group[0], e)
    return groups


def _job_config(
    hydra_context: HydraContext, config: DictConfig, overrides: list[str], idx: int
) -> DictConfig:
    """A job's config as the basic launcher composes it, its output folder filled in."""
    job = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(job):
        job.hydra.job.id = idx
        job.hydra.job.num = idx
    with read_write(job.hydra.runtime), open_dict(job.hydra.runtime):  # as run_job sets it
        folder = os.path.join(str(job.hydra.sweep.dir), str(job.hydra.sweep.subdir))
        job.hydra.runtime.output_dir = os.path.abspath(folder)
    return job


class _Jobs:
    """The jobs of one launch, by their place: those launched, then those `more` adds."""

    def __init__(self, hydra_context, config, overrides: list[list[str]], ids: list[int]):
        self.hydra_context, self.config = hydra_context, config
        self.overrides, self.ids = overrides, ids
        self.configs = [
            _job_config(hydra_context, config, o, i) for o, i in zip(overrides, ids, strict=True)
        ]
        self.later: list[int] = []  # added, but could not share the pack's model
        self.failed: dict[int, JobReturn] = {}  # added, but could not join (failed alone)

    def add(self, overrides: list[str], idx: int) -> int:
        """A job `more` gave, its place kept before its config composes (if it does not, the
        job fails alone, in that place)."""
        self.overrides.append(overrides)
        self.ids.append(idx)
        self.configs.append(None)
        return len(self.configs) - 1

    def compose(self, i: int) -> DictConfig:
        self.configs[i] = _job_config(
            self.hydra_context, self.config, self.overrides[i], self.ids[i]
        )
        return self.configs[i]


def _run_pack(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    jobs: _Jobs,
    group: list[int],
    more: More | None,
) -> list[JobReturn]:
    """The pack's JobReturns, in `group`'s order; `group` grows by the jobs that join it."""
    from trainer.packed.host import PackHost
    from trainer.packed.packable import check_packable

    def body(cfg: DictConfig) -> Callable[[], Any]:
        return functools.partial(
            run_job,
            task_function=_resolved_first(task_function),
            config=cfg,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
            hydra_context=hydra_context,
            configure_logging=False,  # one set of handlers for all: _log_by_member
        )

    def member_ended(member: int, result: Any) -> Callable[[], Any] | None:
        """The job that takes the ended member's slot, if `more` gives one that fits. One that
        cannot join (its config does not compose, its log file does not open) fails alone,
        as a member that fails in training: its end is handed on at once, and the job `more`
        gives then is asked to take the slot in its stead."""
        index, ret = group[member], _job_return(result)
        while more and not jobs.later and (job := more(index, ret)) is not None:
            index = jobs.add(*job)
            try:
                return join(index)
            except Exception as e:  # before its body runs: the pack's own thread, not its
                error = one_line(e)
                ret = jobs.failed[index] = oa.failed_return(RuntimeError(error))
                log.warning("trial %d's job cannot join the pack: %s", jobs.ids[index], error)
        return None

    def join(i: int) -> Callable[[], Any] | None:
        """Job i's body, to join the pack; None when it cannot share the pack's model."""
        cfg = jobs.compose(i)
        try:
            check_packable([members[0], cfg])
        except ConfigError as e:
            log.info("%s runs after the pack: %s", cfg.hydra.sweep.subdir, e)
            jobs.later.append(i)
            return None
        by_member.add(_log_path(cfg))  # first: its own log says when it joined
        log.info("%s joins the pack at round %d", cfg.hydra.sweep.subdir, host.round)
        group.append(i)
        members.append(cfg)
        return body(cfg)

    members = [jobs.configs[i] for i in group]
    hydra_cfg = HydraConfig.instance().cfg
    try:
        with _log_by_member(members) as by_member:  # said in every member's log file
            names = ", ".join(str(c.hydra.sweep.subdir) for c in members)  # t<trial>[-s<seed>]
            log.info("packing %s on one base model", names)
            display.trial_output_to_log(members[0].hydra.verbose)  # before the model loads
            host = PackHost(members)
            results = host.run_bodies([body(cfg) for cfg in members], member_ended)
    except Exception as e:  # the pack's own failure (e.g. its model did not load)
        return [oa.failed_return(RuntimeError(one_line(e))) for _ in group]
    finally:
        HydraConfig.instance().cfg = hydra_cfg  # each member's run_job set its own
    return [_job_return(r) for r in results]


def _job_return(result: Any) -> JobReturn:
    return result if isinstance(result, JobReturn) else oa.failed_return(result)


def _resolved_first(task_function: TaskFunction) -> Callable[[DictConfig], Any]:
    """The task function on its config resolved at once: `${hydra:...}` values read Hydra's
    one global config, which is this member's only until the next member's turn."""

    def run(cfg: DictConfig) -> Any:
        with read_write(cfg):
            OmegaConf.resolve(cfg)
        return task_function(cfg)

    return run


class _ByMember(logging.Handler):
    """Each member thread's records to its job's log file; the host's own to all of them."""

    def __init__(self, files: list[Path], formatter: logging.Formatter | None) -> None:
        super().__init__()
        self.file_formatter = formatter
        self.handlers: dict[str, logging.Handler] = {}
        for path in files:
            self.add(path)

    def add(self, path: Path) -> None:
        """The next member's file (a member that joins the pack later gets its own too)."""
        from trainer.packed.turns import member_thread

        path.parent.mkdir(parents=True, exist_ok=True)  # a member that joins: not made yet
        handler = logging.FileHandler(path)
        handler.setFormatter(self.file_formatter)
        self.handlers[member_thread(len(self.handlers))] = handler

    def emit(self, record: logging.LogRecord) -> None:
        handler = self.handlers.get(record.threadName)
        for h in [handler] if handler is not None else list(self.handlers.values()):
            h.emit(record)

    def close(self) -> None:
        for handler in self.handlers.values():
            handler.close()
        super().close()


@contextlib.contextmanager
def _log_by_member(configs: list[DictConfig]) -> Iterator[_ByMember]:
    """Hydra's job logging (its console handler, a file per job) for the pack's members."""
    paths = [_log_path(c) for c in configs]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    first = configs[0]
    HydraConfig.instance().set_config(first)  # the file handler's path reads it
    configure_log(first.hydra.job_logging, first.hydra.verbose)
    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    formatter = files[0].formatter if files else None
    for handler in files:  # the first job's file alone: replaced by one per member
        root.removeHandler(handler)
        handler.close()
    by_member = _ByMember(paths, formatter)
    root.addHandler(by_member)
    try:
        yield by_member
    finally:
        root.removeHandler(by_member)
        by_member.close()


def _log_path(cfg: DictConfig) -> Path:
    return Path(cfg.hydra.runtime.output_dir) / f"{cfg.hydra.job.name}.log"
