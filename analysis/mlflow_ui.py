"""The link that opens a study's runs in the MLflow UI, and the saved view it opens.

MLflow 3.17's UI decides between its GenAI pages and its runs table from a global switch
(the `workflowType` URL parameter, else the browser's last choice, else GenAI): the
experiment's `mlflow.experimentKind` tag no longer decides, so `#/experiments/<id>` opens an
empty GenAI overview. `#/experiments/<id>/runs?workflowType=machine_learning` opens the runs.

The columns of the runs table are not URL parameters; MLflow keeps them in the browser, or in
a saved view: an experiment tag `mlflow.sharedViewState.<key>` that the UI lists under "Views"
and that `viewStateShareKey=<key>` opens. Each study gets one: its trial runs (its configuration
runs with several seeds) as flat rows, best first, with the objective, the swept parameters and
each run's outcome as columns. Verified in headless Chromium against `mlflow ui` 3.17.2.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from records.metrics import readable
from records.sweep import ConfigMetric, Role, StudyAttr, Tag
from records.tracking import TRAINING_PAGES, is_server, run_url, ui_base

__all__ = ["run_url", "runs_view_url", "study_link", "ui_command"]

VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # the UI's saved views (its "Views" menu)
CONFIG_OBJECTIVE = ConfigMetric.OBJECTIVE_MEAN


def runs_view_url(
    tracking_uri: str,
    experiment_id: str,
    view_key: str | None = None,
    facets: Mapping[str, Any] | None = None,
) -> str:
    """The runs table of an experiment: a tracking server's own address, else where `mlflow ui`
    serves by default (run `ui_command` first). view_key opens a saved view (the UI ignores
    it when the link carries facets); facets: searchFilter, orderByKey, orderByAsc."""
    params: dict[str, str] = dict([TRAINING_PAGES])
    if view_key:
        params["viewStateShareKey"] = view_key
    for key, value in (facets or {}).items():
        params[key] = str(value).lower() if isinstance(value, bool) else str(value)
    base = ui_base(tracking_uri)
    query = urlencode(params, quote_via=quote)
    return f"{base}/#/experiments/{quote(str(experiment_id), safe='')}/runs?{query}"


def objective_note(objective: str, study_url: str) -> str:
    """A sweep run's description (MLflow's note): which of its metrics the sweep ranks by, and
    the link back to the study's runs."""
    name = readable(objective)
    what = f" ({name})" if name != objective else ""
    return (
        f"**Objective: `{objective}`**{what}: the value the sweep ranks runs by, its last "
        "eval. The other metrics (greedy eval, training reward, KL) are diagnostics. "
        f"[The study's runs]({study_url})"
    )


def ui_command(tracking_uri: str) -> str | None:
    """The command that serves a store with no server in front of it (None for a server)."""
    if is_server(tracking_uri):
        return None
    return f"mlflow ui --backend-store-uri {shlex.quote(_shown(tracking_uri))}"


def _shown(uri: str) -> str:
    """A database URL with any password masked (the user types their own)."""
    from records.database import shown_url

    return shown_url(uri) if "://" in uri and not uri.startswith("file:") else uri


# --- the study's saved view ----------------------------------------------------------------


def view_key(study: str) -> str:
    """The saved view's key: URL- and tag-safe, one per study."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", study)
    if safe != study:
        safe += "-" + hashlib.sha1(study.encode()).hexdigest()[:8]
    return f"sweep-{safe}"


def view_facets(study: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The rows and their order: the study's trial runs (its configuration runs when it runs
    several seeds a configuration), best objective first."""
    several = int(attrs.get(StudyAttr.SEEDS) or 1) > 1
    role = Role.CONFIG if several else Role.TRIAL
    metric = CONFIG_OBJECTIVE if several else attrs.get(StudyAttr.OBJECTIVE, "")
    quoted = study.replace("'", "\\'")
    return {
        "searchFilter": f"tags.`{Tag.STUDY}` = '{quoted}' AND tags.`{Tag.ROLE}` = '{role}'",
        "orderByKey": f"metrics.`{metric}`",
        "orderByAsc": attrs.get(StudyAttr.DIRECTION) == "minimize",
    }


def view_state(study: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The saved view: view_facets, and as columns the objective, its 95% interval and the
    seeds as the verdict gives them, the swept parameters and the outcome (sweeper.state)."""
    facets = view_facets(study, attrs)
    params = [f"params.`{name}`" for name in attrs.get(StudyAttr.SEARCH_SPACE) or {}]
    interval = [f"metrics.`{m}`" for m in (ConfigMetric.CI_LOW, ConfigMetric.CI_HIGH)]
    seeds = f"metrics.`{ConfigMetric.SEEDS_ENDED}`"
    columns = [facets["orderByKey"], *interval, seeds, *params, f"tags.`{Tag.STATE}`"]
    return {**facets, "selectedColumns": columns}


def save_view(client: Any, experiment_id: str, study: str, attrs: Mapping[str, Any]) -> str:
    """Write (or refresh) the study's saved view on its experiment; its key."""
    from records.tracking import tag_experiment

    key = view_key(study)
    tag = VIEW_TAG_PREFIX + key
    now = int(time.time() * 1000)
    old = client.get_experiment(experiment_id).tags.get(tag)
    created = _created_at(old) or now
    envelope = {
        "name": f"sweep {study}",
        "createdAt": created,
        "updatedAt": now,
        "state": json.dumps(view_state(study, attrs)),
    }
    tag_experiment(client, experiment_id, tag, json.dumps(envelope))
    return key


def _created_at(envelope: str | None) -> int | None:
    try:
        return int(json.loads(envelope or "")["createdAt"])
    except (ValueError, KeyError, TypeError):
        return None


def study_link(
    client: Any,
    tracking_uri: str,
    experiment: str,
    study: str,
    attrs: Mapping[str, Any],
    write: bool = True,
) -> list[str]:
    """What to print: the link to the study's runs, and how to serve the store when no server
    does; empty when the experiment is unknown. write: save the study's view (its columns)
    first; without it, or where it cannot be written, the link carries the same rows and
    order without the columns."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    url = runs_view_url(tracking_uri, found.experiment_id, facets=view_facets(study, attrs))
    if write:
        try:
            key = save_view(client, found.experiment_id, study, attrs)
            url = runs_view_url(tracking_uri, found.experiment_id, view_key=key)
        except Exception:  # a read-only store, a server refusing the tag: the link above
            pass
    command = ui_command(tracking_uri)
    return [f"MLflow runs: {url}", *([f"  (serve them first: {command})"] if command else [])]
