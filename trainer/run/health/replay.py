"""Health rules replayed on a recorded run ({step: metrics}): the breach a sweep would prune
at, and the warnings before it (analysis/ and bench/ read recorded curves through these)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainer.run.health.monitor import HealthMonitor, first_to_prune
from trainer.run.health.rules import Action, Breach, HealthRule


def replay(rules: Iterable[HealthRule], curve: Mapping[int, Mapping[str, float]]) -> Breach | None:
    """The pruning breach a monitor finds on a recorded run ({step: metrics}), or None."""
    monitor = HealthMonitor(rules)
    for step in sorted(curve):
        breach = monitor.check(step, curve[step])
        if breach is not None:
            return breach
    return None


def warnings(rules: Iterable[HealthRule], curve: Mapping[int, Mapping[str, float]]) -> list[Breach]:
    """Each warning rule's first firing on a recorded run, before the step of any pruning
    breach (a sweep records no warning at the step it prunes: the prune says it)."""
    monitor, seen = HealthMonitor(rules), {}
    for step in sorted(curve):
        fired = monitor.breaches(step, curve[step])
        if first_to_prune(fired):
            break
        for breach in fired:
            if breach.action == Action.warn.value:
                seen.setdefault(breach.rule, breach)
    return list(seen.values())
