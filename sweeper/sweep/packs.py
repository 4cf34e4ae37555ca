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


def launch(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[list[str]],
    job_ids: Sequence[int],
) -> list[JobReturn]:
    """Each job's JobReturn, in order: one job through the basic launcher, several packed
    where they can share a base model."""
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=hydra_context, task_function=task_function, config=config
    )
    if len(job_overrides) == 1:
        return list(launcher.launch([job_overrides[0]], initial_job_idx=job_ids[0]))
    setup_globals()
    configs = [
        _job_config(hydra_context, config, overrides, idx)
        for overrides, idx in zip(job_overrides, job_ids, strict=True)
    ]
    returns: dict[int, JobReturn] = {}
    for group in packable_groups(configs):
        if len(group) == 1:
            (i,) = group
            returns[i] = launcher.launch([job_overrides[i]], initial_job_idx=job_ids[i])[0]
        else:
            packed = _run_pack(hydra_context, task_function, configs, group)
            returns.update(zip(group, packed, strict=True))
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)  # as the launcher does
    return [returns[i] for i in range(len(configs))]


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


def _run_pack(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    configs: list[DictConfig],
    group: list[int],
) -> list[JobReturn]:
    from trainer.packed.host import PackHost

    members = [configs[i] for i in group]
    hydra_cfg = HydraConfig.instance().cfg
    bodies = [
        functools.partial(
            run_job,
            task_function=_resolved_first(task_function),
            config=cfg,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
            hydra_context=hydra_context,
            configure_logging=False,  # one set of handlers for all: _log_by_member
        )
        for cfg in members
    ]
    try:
        with _log_by_member(members):  # said in every member's log file
            jobs = ", ".join(str(c.hydra.sweep.subdir) for c in members)  # t<trial>[-s<seed>]
            log.info("packing %s on one base model", jobs)
            display.trial_output_to_log(members[0].hydra.verbose)  # before the model loads
            results = PackHost(members).run_bodies(bodies)
    except Exception as e:  # the pack's own failure (e.g. its model did not load)
        return [oa.failed_return(RuntimeError(one_line(e))) for _ in members]
    finally:
        HydraConfig.instance().cfg = hydra_cfg  # each member's run_job set its own
    return [r if isinstance(r, JobReturn) else oa.failed_return(r) for r in results]


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
        from trainer.packed.host import member_thread

        super().__init__()
        self.handlers = {}
        for i, path in enumerate(files):
            handler = logging.FileHandler(path)
            handler.setFormatter(formatter)
            self.handlers[member_thread(i)] = handler

    def emit(self, record: logging.LogRecord) -> None:
        handler = self.handlers.get(record.threadName)
        for h in [handler] if handler is not None else self.handlers.values():
            h.emit(record)

    def close(self) -> None:
        for handler in self.handlers.values():
            handler.close()
        super().close()


@contextlib.contextmanager
def _log_by_member(configs: list[DictConfig]) -> Iterator[None]:
    """Hydra's job logging (its console handler, a file per job) for the pack's members."""
    paths = [Path(c.hydra.runtime.output_dir) / f"{c.hydra.job.name}.log" for c in configs]
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
        yield
    finally:
        root.removeHandler(by_member)
        by_member.close()
