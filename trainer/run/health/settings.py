"""Health rules from their settings (the sweeper's `health` list, a study's recorded rules):
each field checked, with a one-line error naming the rule, the field and the rule it broke."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from records.metrics import is_finite_number
from trainer.run.health.rules import (
    GUARD_WINDOW,
    MAX_WINDOW,
    Action,
    Check,
    Guard,
    HealthRule,
    Unit,
)


def rules_from_settings(
    given: Sequence[Mapping[str, Any]], kl_threshold: float
) -> list[HealthRule]:
    """Rules from their settings (a list of dicts, e.g. the sweeper's `health`); threshold
    checks without a bound take kl_threshold. Errors are one line naming the rule
    (`health[<index>]`, the caller says where it was configured), the field and the rule
    broken."""
    return [_rule(i, dict(item), kl_threshold) for i, item in enumerate(given)]


def _rule(index: int, item: dict[str, Any], kl_threshold: float) -> HealthRule:
    where = f"health[{index}]"
    known = {f.name for f in fields(HealthRule)}
    unknown = sorted(set(item) - known)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field; rules have {sorted(known)}")
    for key in ("name", "metric"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ValueError(f"{where}.{key}={item.get(key)!r}: must be a non-empty string")
    if item.get("check") == Check.mean_below_start.value:
        item.setdefault("unit", Unit.stderr.value)  # its windows' own spread: nothing else
    for key, kind, default in (
        ("check", Check, Check.above),
        ("action", Action, Action.prune),
        ("guard", Guard, Guard.none),
        ("unit", Unit, Unit.absolute),
        ("guard_unit", Unit, Unit.absolute),
    ):
        value = item.get(key, default)
        try:
            item[key] = kind(value)
        except ValueError:
            allowed = ", ".join(c.value for c in kind)
            raise ValueError(f"{where}.{key}={value!r}: must be one of {allowed}") from None
    if item["check"] in (Check.above, Check.below) and item.get("bound") is None:
        item["bound"] = kl_threshold
    below = (Check.below_baseline, Check.below_peak, Check.fell_from_peak, Check.mean_below_start)
    if item["check"] in below and item.get("bound") is None:
        item["bound"] = 0.0
    if item["check"] == Check.mean_below_start and item["unit"] != Unit.stderr:
        raise ValueError(f"{where}.unit={item['unit'].value!r}: mean_below_start counts in stderr")
    if item["check"] in (Check.ratio_below, Check.ratio_above) and item.get("bound") is None:
        raise ValueError(f"{where}.bound: a {item['check'].value} rule needs a bound (a factor)")
    for key in ("bound", "guard_fall"):
        value = item.get(key)
        if value is not None and not is_finite_number(value):
            raise ValueError(f"{where}.{key}={value!r}: must be a finite number")
    for key, low, high in (
        ("patience", 1, None),
        ("warmup_steps", 0, None),
        ("fall_evals", 1, GUARD_WINDOW),
        ("early_patience", 1, GUARD_WINDOW),
        ("window", 2 if item["check"] == Check.mean_below_start else 1, MAX_WINDOW),
    ):
        value = item.get(key, low)
        if not isinstance(value, int) or value < low or (high is not None and value > high):
            rule = f">= {low}" if high is None else f"from {low} to {high}"
            raise ValueError(f"{where}.{key}={value!r}: must be an integer {rule}")
    return HealthRule(**item)
