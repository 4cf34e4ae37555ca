"""The edge of stability: a configuration next to one whose runs broke (issue 72).

Two seeds that passed do not show a setting's break risk; its neighbour's breaks do. Along a
numeric parameter (lr, kl_penalty_coef, group_size) break risk changes with the value, so a
setting beside one where a health rule stopped a seed is at the edge of what trains. Among
settings the verdict cannot separate, it names one away from that edge (analysis/verdict.py):
the 2-seed race picked lr=7e-3, next to a breaking 1e-2, in 5 of 60 replays of a held-out set
where 7e-3 ends 0.09 below the best over 23 seeds (bench/COST.md). Pure: params in, a name out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Setting:
    """A configuration as the edge sees it: its name, its parameters, whether a seed broke."""

    label: str
    params: Params
    broke: bool = False


def neighbours(me: Setting, everyone: Sequence[Setting]) -> list[Setting]:
    """The nearest setting below and above `me` along each numeric parameter, among those
    equal to `me` in every other parameter (a grid's row or column through it)."""
    out = []
    for name, value in me.params.items():
        if not _numeric(value):
            continue
        line = [
            s
            for s in everyone
            if s.label != me.label
            and set(s.params) == set(me.params)
            and _numeric(s.params[name])
            and all(s.params[k] == v for k, v in me.params.items() if k != name)
        ]
        below = [s for s in line if s.params[name] < value]
        above = [s for s in line if s.params[name] > value]
        if below:
            out.append(max(below, key=lambda s: s.params[name]))
        if above:
            out.append(min(above, key=lambda s: s.params[name]))
    return out


def broken_neighbour(me: Setting, everyone: Sequence[Setting]) -> Setting | None:
    """The first neighbour of `me` whose runs broke (None: `me` is away from the edge)."""
    return next((s for s in neighbours(me, everyone) if s.broke), None)


def away_from_edge(order: Sequence[str], everyone: Sequence[Setting]) -> str | None:
    """The first of `order` (labels, best first: the top and those tied with it) that is not
    next to a setting that broke; None when the first already is, or when all are at it."""
    known = {s.label: s for s in everyone}
    if not order or broken_neighbour(known[order[0]], everyone) is None:
        return None
    return next(
        (label for label in order[1:] if broken_neighbour(known[label], everyone) is None), None
    )


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
