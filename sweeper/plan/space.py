"""The search space, read from Hydra overrides with Hydra's own override parser.

Accepted forms, as on the command line or in `hydra.sweeper.params`:
  group_size=4,8  /  choice(4,8)         discrete choices (also config groups: loss=ppo,dapo)
  range(1,5) / range(0,1,0.25)           discrete steps, stop excluded (as Python's range)
  interval(0.7,1.0)                      continuous uniform
  int(interval(1,16))                    integer uniform
  tag(log, interval(1e-4,1e-2))          log scale; both bounds must be > 0
Any other override (`max_steps=5`, `+tuned=abc`) is fixed: passed to every trial unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
)
from hydra.errors import HydraException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from sweeper import SweepError
from sweeper.optuna_adapter import format_override_value

Value = str | int | float | bool | None


@dataclass(frozen=True)
class Param:
    """One swept key: its Optuna distribution and the values checked before the sweep."""

    key: str  # the override key as typed, with any prefix: "lr", "+foo"
    name: str  # the name in trial.params: "lr", "foo"
    spec: str  # the value as typed: "tag(log, interval(1e-4, 1e-2))"
    distribution: BaseDistribution
    values: tuple[Value, ...] | None  # every value of a discrete param; None for a range
    endpoints: tuple[Value, ...]  # what preflight composes: all values, or low and high
    log: bool = False

    def override(self, value: Value) -> str:
        return f"{self.key}={format_value(value)}"


@dataclass
class SearchSpace:
    params: dict[str, Param] = field(default_factory=dict)  # by name, in the order given
    fixed: list[str] = field(default_factory=list)  # fixed overrides, as typed

    @property
    def is_discrete(self) -> bool:
        return all(p.values is not None for p in self.params.values())

    @property
    def grid_size(self) -> int:
        return math.prod(len(p.values or ()) for p in self.params.values())

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: p.distribution for name, p in self.params.items()}

    @property
    def specs(self) -> dict[str, str]:
        return {name: p.spec for name, p in self.params.items()}

    @property
    def log_params(self) -> list[str]:
        return [name for name, p in self.params.items() if p.log]

    def overrides(self, values: Mapping[str, Value]) -> list[str]:
        """The overrides of one trial: fixed ones first, then its swept values."""
        return self.fixed + [self.params[name].override(v) for name, v in values.items()]


def format_value(value: Value) -> str:
    """A value as Hydra parses it back to the same thing (strings escaped as needed)."""
    return format_override_value(value)


def parse_space(preset: Mapping[str, str], arguments: Iterable[str]) -> SearchSpace:
    """Preset params (`hydra.sweeper.params`) first; a command-line key replaces a preset one."""
    by_name: dict[str, str] = {}
    for key, spec in preset.items():
        by_name[_strip_prefix(str(key))] = f"{key}={spec}"
    given: dict[str, str] = {}
    for argument in arguments:
        name = _strip_prefix(argument.split("=", 1)[0])
        if name in given:  # Hydra would let the last one win: a grid silently shrinks
            raise SweepError(f"{name} is given twice ({given[name]} and {argument}); keep one")
        given[name] = by_name[name] = argument
    parser = OverridesParser.create()
    space = SearchSpace()
    for text in by_name.values():
        override = _parse(parser, text)
        if override.is_sweep_override():
            param = to_param(override)
            space.params[param.name] = param
        else:
            space.fixed.append(text)
    return space


def _strip_prefix(key: str) -> str:
    return key.lstrip("+~")


def _parse(parser: OverridesParser, text: str) -> Override:
    try:
        return parser.parse_override(text)
    except HydraException as e:
        raise SweepError(f"{text}: malformed override ({e})") from None


def to_param(override: Override) -> Param:
    """Turn one sweep override into a Param; reject what cannot be searched."""
    key = override.get_key_element()
    name = override.key_or_group
    spec = override.get_value_string()
    value = override.value()
    log = "log" in getattr(value, "tags", set())
    if isinstance(value, ChoiceSweep):
        values = _distinct(list(override.sweep_iterator()), key, spec)
        dist = CategoricalDistribution(values)
        return Param(key, name, spec, dist, tuple(values), tuple(values), log)
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator())
        if not values:
            raise SweepError(f"{key}={spec}: the range is empty (start must be below stop)")
        if all(isinstance(v, int) for v in values):
            step = int(value.step)
            dist = IntDistribution(values[0], values[-1], step=step)
        else:
            dist = CategoricalDistribution(values)
        return Param(key, name, spec, dist, tuple(values), tuple(values), log)
    if isinstance(value, IntervalSweep):
        dist = _interval(key, spec, value.start, value.end, log)
        return Param(key, name, spec, dist, None, (value.start, value.end), log)
    raise SweepError(f"{key}={spec}: unsupported sweep (use choices, range or interval)")


def _distinct(values: list[Any], key: str, spec: str) -> list[Value]:
    out: list[Value] = []
    for v in values:
        if not isinstance(v, (str, int, float, bool, type(None))):
            raise SweepError(f"{key}={spec}: choices must be plain values, got {v!r}")
        if not any(v == o and type(v) is type(o) for o in out):  # 1 and True stay distinct
            out.append(v)
    return out


def _interval(key: str, spec: str, low: float, high: float, log: bool) -> BaseDistribution:
    if not low < high:
        raise SweepError(f"{key}={spec}: interval bounds must satisfy low < high")
    if log and low <= 0:
        raise SweepError(f"{key}={spec}: a log interval must stay above 0 (low={low})")
    if isinstance(low, int) and isinstance(high, int):
        return IntDistribution(low, high, log=log)
    return FloatDistribution(float(low), float(high), log=log)
