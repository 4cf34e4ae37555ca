"""What a worker does once before its loop: check where it records, open the study (created,
or joined with the other workers') and its MLflow parent run, and say what it runs."""

from __future__ import annotations

import optuna

from records.database import set_retry_window
from records.errors import StoreUnusable
from records.optuna_storage import open_storage
from records.sweep import StudyAttr
from records.tracking_store import check_tracking_uri
from sweeper import SweepError
from sweeper.plan.sweep_plan import SweepPlan
from sweeper.results import runs
from sweeper.results.display import say
from sweeper.study.create import StudySpec, open_study


def start_sweep(plan: SweepPlan, experiment: str) -> tuple[optuna.Study, str]:
    """The plan's study and its parent run id, the study's runs link and plan said."""
    s, name, search_sampler = plan.settings, plan.name, plan.search_sampler
    set_retry_window(s.db_retry_seconds)
    spec = StudySpec(name, plan.space, search_sampler, s, experiment)
    try:
        check_tracking_uri()
        storage = open_storage(s.storage, s.heartbeat_interval, s.grace_period, patient=False)
        study, parent_run_id = open_study(storage, spec)  # opens (or creates) MLflow's store
    except StoreUnusable as e:
        raise SweepError(str(e)) from None
    for line in runs.runs_link(experiment, name, study.user_attrs):
        say(f"[sweep {name}] {line.strip()}")
    if not s.terminator and study.user_attrs.get(StudyAttr.STOPPED):
        study.set_user_attr(StudyAttr.STOPPED, "")  # run on: the stop no longer holds
        say(f"[sweep {name}] terminator=false: the study runs on past its stop")
    swept = " ".join(f"{p.key}={p.spec}" for p in plan.space.params.values()) or "defaults"
    if s.race:
        seeds = f", seeds raced: {s.seeds} each, up to {s.max_seeds}"
    else:
        seeds = f" x {s.seeds} seeds" if s.seeds > 1 else ""
    say(
        f"[sweep {name}] {search_sampler.name} over {swept}: {search_sampler.planned} trials{seeds}"
    )
    return study, parent_run_id
