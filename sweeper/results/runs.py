"""The sweep's MLflow runs: the study's parent run, and how every trial run ends.

`close_trial_run` is the one place a trial's run gets its final tags and status, whoever
closes it: the job when training ends, or the sweeper when the job could not (its process
died, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient
from optuna.trial import FrozenTrial

from analysis.mlflow_ui import objective_note, runs_view_url, study_link, view_key
from analysis.text import show, trial_note
from records.database import absolute_url
from records.sweep import (
    RUN_STATUS,
    ConfigMetric,
    Role,
    State,
    StudyMetric,
    Tag,
    TrialAttr,
)
from records.tracking import MLflowRun
from records.tracking_store import tracking_client

NOTE_TAG = "mlflow.note.content"  # a run's description in the MLflow UI


def tracking_uri() -> str:
    """MLflow's tracking URI with any SQLite path made absolute, for jobs in other dirs."""
    return absolute_url(mlflow.get_tracking_uri())


def trial_run_name(number: int, params: Mapping[str, Any], seed: int | None = None) -> str:
    """`t3 group_size=8 lr=2e-05` (`... seed=1` for one seed of several): readable in the UI."""
    seed_part = f" seed={seed}" if seed is not None else ""
    return f"t{number} {show(params)}".rstrip() + seed_part


def runs_link(experiment: str, study: str, attrs: Mapping[str, Any]) -> list[str]:
    """The lines that open the study's runs in the MLflow UI (analysis/mlflow_ui.py), its saved
    view written on the way; none when MLflow cannot be read (the sweep's result stands)."""
    uri = tracking_uri()
    try:
        return study_link(tracking_client(uri), uri, experiment, study, attrs)
    except Exception:  # an unreachable server: the link is a convenience
        return []


def start_parent_run(experiment: str, study: str, params: Mapping[str, Any], objective: str) -> str:
    run = MLflowRun(
        experiment,
        run_name=study,
        tags={Tag.ROLE: Role.STUDY, Tag.STUDY: study},
        client=tracking_client(tracking_uri()),
    )
    mark_objective(run, study, objective)
    run.log_params(params)
    return run.run_id


def start_config_run(
    experiment: str,
    parent_run_id: str,
    study: str,
    number: int,
    params: Mapping[str, Any],
    objective: str,
) -> str:
    """A configuration run with several seeds: its seeds' training runs nest under it."""
    run = MLflowRun(
        experiment,
        run_name=trial_run_name(number, params),
        parent_run_id=parent_run_id,
        tags={Tag.ROLE: Role.CONFIG, Tag.STUDY: study, Tag.TRIAL_NUMBER: str(number)},
        client=tracking_client(tracking_uri()),
    )
    mark_objective(run, study, objective)
    run.log_params(params)
    return run.run_id


def mark_objective(run: MLflowRun, study: str, objective: str, uri: str | None = None) -> None:
    """Which metric the sweep ranks by, on the run itself (a tag, and its description with
    the link to the study's runs): a seed run shows eval/greedy/mean beside the objective.
    uri: the run's tracking URI (the sweep's, unless told)."""
    experiment_id = run.client.get_run(run.run_id).info.experiment_id
    study_url = runs_view_url(uri or tracking_uri(), experiment_id, view_key=view_key(study))
    run.set_tags({Tag.OBJECTIVE: objective, NOTE_TAG: objective_note(objective, study_url)})


def log_intervals(trials: Sequence[FrozenTrial], ranked: Sequence[Any]) -> None:
    """Each configuration's 95% interval and seeds as the verdict gives them (`ranked`, its
    summaries), on its run: the study's view shows them as columns."""
    run_ids = {f"t{t.number}": t.user_attrs.get(TrialAttr.MLFLOW_RUN_ID) for t in trials}
    for summary in ranked:
        if not (run_id := run_ids.get(summary.label)):
            continue
        metrics = {ConfigMetric.SEEDS_ENDED: len(summary.config.values)}
        if summary.interval.known:
            metrics[ConfigMetric.CI_LOW] = summary.interval.low
            metrics[ConfigMetric.CI_HIGH] = summary.interval.high
        _retried(lambda r=run_id, m=metrics: existing_run(r).log_metrics(0, m))


def existing_run(run_id: str) -> MLflowRun:
    """A run of the sweep's tracking store, to write to (tags, metrics, its ending)."""
    return MLflowRun.existing(run_id, tracking_client(tracking_uri()))


def running_trial_runs(study: str, number: int | None = None) -> dict[str, int]:
    """The study's trial and configuration runs still RUNNING ({run id: its trial number}),
    found by their tags (set as each run is created), of one trial or of all: a worker
    interrupted between creating or reopening a run and recording its id in the trial would
    otherwise leave it RUNNING for good."""
    client = tracking_client(tracking_uri())
    which = f" and tags.`{Tag.TRIAL_NUMBER}` = '{number}'" if number is not None else ""
    found = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{Tag.STUDY}` = '{study}'{which} and attributes.status = 'RUNNING'",
    )
    return {
        run.info.run_id: int(run.data.tags[Tag.TRIAL_NUMBER])
        for run in found
        if Tag.TRIAL_NUMBER in run.data.tags  # the study's own run has none
    }


def set_run_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    existing_run(run_id).set_tags(tags)


def close_config_run(run_id: str, outcome: Any, seeds: Sequence[Any]) -> None:
    """The configuration's mean objective and seeds, then its ending (as a trial run's)."""
    run = existing_run(run_id)
    if outcome.value is not None:
        run.log_metrics(0, {ConfigMetric.OBJECTIVE_MEAN: outcome.value})
    run.log_metrics(0, {ConfigMetric.SEEDS_ENDED: len(seeds)})
    close_trial_run(run_id, outcome.state, outcome.reason, client=run.client)


def reopen_run(run_id: str) -> None:
    """A resumed sweep marks its parent run RUNNING again until it ends."""
    existing_run(run_id).reopen()


def discard_run(run_id: str) -> None:
    """Delete a run made in vain (another worker's study came first)."""
    existing_run(run_id).delete()


def close_trial_run(
    run_id: str | None,
    state: str,
    reason: str = "",
    killed: bool = False,
    client: MlflowClient | None = None,
) -> None:
    """Tag a trial run with its outcome and end it; a run already ended keeps its status.

    state: State.*; killed ends a FAIL as KILLED (a person stopped it, nothing broke).
    """
    if not run_id:
        return
    run = MLflowRun.existing(run_id, client or tracking_client(tracking_uri()))
    tags = {Tag.STATE: state}
    if state == State.PRUNED:
        tags[Tag.PRUNE_REASON] = reason
    elif state == State.FAIL:
        tags[Tag.FAIL_REASON] = reason
    run.set_tags(tags)
    if run.status == "RUNNING":
        run.end("KILLED" if killed else RUN_STATUS[state])


def finish_parent_run(
    run_id: str, trials: Sequence[FrozenTrial], best: FrozenTrial | None, status: str, verdict: str
) -> None:
    """Best trial, the verdict, trials.csv and the final status on the study's parent run.

    Every worker of a study finishes it; two finishing at once race to insert the same tag
    (MLflow's set_tag reads, then inserts), so each write is retried: the retry updates.
    """
    run = existing_run(run_id)
    writes = []
    if best is not None:
        writes += [
            lambda: run.log_metrics(0, {StudyMetric.BEST_VALUE: best.value}),
            lambda: run.log_metrics(0, {StudyMetric.BEST_TRIAL: best.number}),
            lambda: run.set_tags({Tag.BEST_PARAMS: json.dumps(best.params)}),
        ]
    if verdict:
        writes += [
            lambda: run.set_tags({Tag.VERDICT: verdict[:5000]}),
            lambda: run.set_tags({NOTE_TAG: verdict_note(run, verdict)}),
            lambda: run.save_text(verdict + "\n", "verdict.txt"),
        ]
    writes += [
        lambda: run.save_text(trials_csv(trials), "trials.csv"),
        lambda: run.end(status),
    ]
    for write in writes:
        _retried(write)


def verdict_note(run: MLflowRun, verdict: str) -> str:
    """The study run's description (shown in the MLflow UI): the verdict, its statistics as a
    list, then the description it had (the objective and the link to the study's runs)."""
    first, *rest = verdict.splitlines()
    before = run.client.get_run(run.run_id).data.tags.get(NOTE_TAG, "")
    before = before.split("\n\n---\n\n")[-1]  # a second finish replaces the verdict
    listed = "\n".join(f"- {line}" for line in rest)
    return f"**Verdict:** {first}\n\n{listed}\n\n---\n\n{before}"[:5000]


def _retried(write: Callable[[], Any], attempts: int = 4) -> None:
    for attempt in range(attempts):
        try:
            write()
            return
        except Exception:  # a write racing another worker's: the next try sees its row
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def trials_csv(trials: Sequence[FrozenTrial]) -> str:
    names = sorted({k for t in trials for k in t.params})
    out = io.StringIO()
    writer = csv.writer(out)
    header = [
        "number",
        "state",
        "value",
        *names,
        TrialAttr.STEPS_RUN,
        "note",
        TrialAttr.MLFLOW_RUN_ID,
    ]
    writer.writerow(header)
    for t in trials:
        params = [t.params.get(n, "") for n in names]
        attrs = t.user_attrs
        row = [t.number, t.state.name, t.value, *params, attrs.get(TrialAttr.STEPS_RUN, "")]
        writer.writerow([*row, trial_note(t), attrs.get(TrialAttr.MLFLOW_RUN_ID, "")])
    return out.getvalue()
