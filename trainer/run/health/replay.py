"""Health rules replayed on a recorded run ({step: metrics}): the breach a sweep would prune
at, and the warnings before it (analysis/ and bench/ read recorded curves through these).

`evals` ({step: eval metrics}) are the evals a trainer would run on demand
(HealthMonitor.wants_eval): given, a step that asks for one gets them, as a trainer's does;
without them the early gate decides, as in a run whose trainer cannot evaluate."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from trainer.run.health.monitor import HealthMonitor, first_to_prune
from trainer.run.health.rules import Action, Breach, HealthRule

Curve = Mapping[int, Mapping[str, float]]


def replay(rules: Iterable[HealthRule], curve: Curve, evals: Curve | None = None) -> Breach | None:
    """The pruning breach a monitor finds on a recorded run ({step: metrics}), or None."""
    return replay_run(rules, curve, evals)[0]


def warnings(rules: Iterable[HealthRule], curve: Curve, evals: Curve | None = None) -> list[Breach]:
    """Each warning rule's first firing on a recorded run, before the step of any pruning
    breach (a sweep records no warning at the step it prunes: the prune says it)."""
    return replay_run(rules, curve, evals)[1]


def replay_run(
    rules: Iterable[HealthRule], curve: Curve, evals: Curve | None = None
) -> tuple[Breach | None, list[Breach]]:
    """Both in one pass: the pruning breach (or None) and the warnings before it."""
    seen: dict[str, Breach] = {}
    for fired in _fired(HealthMonitor(rules), curve, evals):
        breach = first_to_prune(fired)
        if breach is not None:
            return breach, list(seen.values())
        for warning in fired:
            if warning.action == Action.warn.value:
                seen.setdefault(warning.rule, warning)
    return None, list(seen.values())


def _fired(monitor: HealthMonitor, curve: Curve, evals: Curve | None) -> Iterator[list[Breach]]:
    """Every step's breaches, in step order, with an eval on demand where one is asked for."""
    for step in sorted(curve):
        metrics = curve[step]
        if evals is not None and step in evals and monitor.wants_eval(step, metrics):
            metrics = {**metrics, **evals[step]}
        yield monitor.breaches(step, metrics)
