"""The monitor: a run's health rules checked after every step, with the state a resume keeps
(streaks, baselines, first values and windows, peaks, recent values)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from records.metrics import is_finite_number, stderr_of
from trainer.run.health.rules import (
    EARLY_FACTOR,
    GUARD_WINDOW,
    LEARNED_STDERRS,
    MAX_WINDOW,
    Action,
    Breach,
    Check,
    Guard,
    HealthRule,
    Unit,
    guard_words,
)

LISTS = ("recent", "starts")  # the state's parts that hold a list of values by metric
KEPT = max(GUARD_WINDOW, MAX_WINDOW)  # recent values kept by metric


class HealthMonitor:
    """Checks the rules on each step's metrics; keeps each rule's streak, the baselines (step
    0), each metric's first values after step 0 (up to MAX_WINDOW), its best so far (with the
    standard error logged beside it there) and its recent values."""

    def __init__(self, rules: Iterable[HealthRule]) -> None:
        self.rules = list(rules)
        self.streaks = {rule.name: 0 for rule in self.rules}
        self.baselines: dict[str, float] = {}
        self.firsts: dict[str, float] = {}
        self.starts: dict[str, list[float]] = {}
        self.peaks: dict[str, float] = {}
        self.peak_stderrs: dict[str, float] = {}
        self.recent: dict[str, list[float]] = {}

    def state(self) -> dict[str, Any]:
        """Everything a decision depends on, as JSON: saved with a checkpoint, so a resumed
        run decides exactly as one never interrupted (`load_state`)."""
        return {
            "streaks": dict(self.streaks),
            "baselines": dict(self.baselines),
            "firsts": dict(self.firsts),
            "starts": {k: list(v) for k, v in self.starts.items()},
            "peaks": dict(self.peaks),
            "peak_stderrs": dict(self.peak_stderrs),
            "recent": {k: list(v) for k, v in self.recent.items()},
        }

    def load_state(self, state: Any) -> None:
        """Continue from a saved `state()` (read from a shared folder: checked, ValueError
        saying what is wrong). A rule the state does not know starts with no streak; a state
        saved before peaks kept their standard errors has none, one saved before the monitor
        kept first windows has none (mean_below_start is not judged on those metrics)."""
        if isinstance(state, dict):
            optional = {"peak_stderrs", "starts"}
            state = {**{k: {} for k in optional - set(state)}, **state}
        if not isinstance(state, dict) or set(state) != set(self.state()):
            raise ValueError(f"health state is not {sorted(self.state())}")
        for key in LISTS + ("streaks", "baselines", "firsts", "peaks", "peak_stderrs"):
            part = state[key]
            if not isinstance(part, dict) or not all(isinstance(k, str) for k in part):
                raise ValueError(f"health state's {key} is not a dict by name")
            for name, value in part.items():
                values = value if key in LISTS and isinstance(value, list) else [value]
                kind = int if key == "streaks" else float
                if key in LISTS and not isinstance(value, list):
                    raise ValueError(f"health state's {key}.{name} is not a list")
                if not all(_number(v, kind) for v in values):
                    raise ValueError(f"health state's {key}.{name}={value!r} is not a number")
        self.streaks = {rule.name: int(state["streaks"].get(rule.name, 0)) for rule in self.rules}
        self.baselines = dict(state["baselines"])
        self.firsts = dict(state["firsts"])
        self.starts = {k: list(v) for k, v in state["starts"].items()}
        self.peaks = dict(state["peaks"])
        self.peak_stderrs = dict(state["peak_stderrs"])
        self.recent = {k: list(v) for k, v in state["recent"].items()}

    def check(self, step: int, metrics: Mapping[str, float]) -> Breach | None:
        """The first pruning rule that fires at this step (a sweep prunes there), or None."""
        return first_to_prune(self.breaches(step, metrics))

    def breaches(self, step: int, metrics: Mapping[str, float]) -> list[Breach]:
        """Every rule that fires at this step (warnings too), in the rules' order."""
        if step == 0:  # before any update: the baseline, never a breach
            self.baselines.update({k: v for k, v in metrics.items() if is_finite_number(v)})
            return []
        fired = []
        for rule in self.rules:
            value = metrics.get(rule.metric)
            if value is None or step <= rule.warmup_steps:
                continue  # not logged this step: neither counts nor resets the streak
            holds = self._holds(rule, value, metrics)
            if holds is None:
                continue
            self.streaks[rule.name] = self.streaks[rule.name] + 1 if holds else 0
            if self.streaks[rule.name] >= rule.patience and self._gate(rule, metrics, value):
                fired.append(self._breach(rule, value, step))
        self._remember(metrics)
        return fired

    def wants_eval(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Whether an eval now would decide a prune: a pruning rule guarded by the held-out
        reward (Guard.not_improved) would fire this step on its early gate, the check alone,
        for want of an eval since the baseline. A trainer that can evaluates at this step and
        checks with it: the prune stands unless that eval shows the run learned (`_gate`).
        Only asks: nothing is counted."""
        if step == 0:
            return False
        for rule in self.rules:
            value = metrics.get(rule.metric)
            if (
                rule.action != Action.prune
                or rule.guard != Guard.not_improved
                or value is None
                or step <= rule.warmup_steps
                or self._guard_latest(rule, metrics)[0] is not None
            ):
                continue
            holds = self._holds(rule, value, metrics)
            streak = self.streaks[rule.name] + 1 if holds else 0
            if holds and streak >= rule.patience and self._gate(rule, metrics, value):
                return True
        return False

    def _breach(self, rule: HealthRule, value: float, step: int) -> Breach:
        trend = guard_words(rule, now=False)
        if rule.check == Check.mean_below_start:  # what fell is the window's mean
            value = statistics.fmean(self._latest(rule.metric, value, rule.window))
        shown = float(value) if is_finite_number(value) else None
        return Breach(
            rule.name,
            rule.metric,
            shown,
            rule.bound,
            step,
            rule.check.value,
            rule.advice,
            rule.action.value,
            trend,
            rule.unit.value,
        )

    def _remember(self, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if not is_finite_number(value):
                continue
            # a state saved before first windows were kept has firsts, no starts: none begun
            if key not in self.firsts or key in self.starts:
                start = self.starts.setdefault(key, [])
                if len(start) < MAX_WINDOW:
                    start.append(value)
            self.firsts.setdefault(key, value)
            if value >= self.peaks.get(key, value):
                self.peaks[key] = value
                stderr = metrics.get(stderr_of(key))
                if is_finite_number(stderr):
                    self.peak_stderrs[key] = stderr
            self.recent[key] = [*self.recent.get(key, [])[-(KEPT - 1) :], value]

    def rising(self, metric: str, rise: float, now: Mapping[str, float]) -> bool | None:
        """Whether `metric`'s mean over its last GUARD_WINDOW values (this step's included) is
        more than `rise` above its first value after step 0; None before there is a window."""
        values = list(self.recent.get(metric, []))
        if is_finite_number(now.get(metric)):
            values = [*values[-(GUARD_WINDOW - 1) :], now[metric]]
        if len(values) < GUARD_WINDOW or metric not in self.firsts:
            return None
        return sum(values) / len(values) > self.firsts[metric] + rise

    def _gate(self, rule: HealthRule, now: Mapping[str, float], value: float) -> bool:
        """Guard.not_improved: whether the guard metric's latest value after step 0 (this
        step's included) is no more than `rise` above its baseline (`rise` in `guard_unit`),
        or has fallen more than `guard_fall` standard errors below its best.
        Before it has one, or without the standard error a margin in standard errors needs,
        the check alone decides at EARLY_FACTOR times the bound (`_far_out`): a fast learner's
        KL sits below it, a collapse's far above. Where the first value after step 0 comes at
        this step (an eval on demand: `wants_eval`) and the check is that far out, it still
        decides unless that value is LEARNED_STDERRS above the baseline (the run learned)."""
        if rule.guard != Guard.not_improved:
            return True
        metric = rule.guard_metric
        latest, latest_se = self._guard_latest(rule, now)
        baseline = self.baselines.get(metric)
        spread = _spread(latest_se, self.baselines.get(stderr_of(metric)))
        in_stderrs = rule.guard_unit == Unit.stderr
        if latest is None or baseline is None or (in_stderrs and spread is None):
            return self._far_out(rule, value)
        if not self.recent.get(metric) and self._far_out(rule, value):
            learned = LEARNED_STDERRS * spread if in_stderrs else max(rule.rise, 0.0)
            return not latest > baseline + learned
        margin = rule.rise * spread if in_stderrs else rule.rise
        return latest <= baseline + margin or self._fell(rule, now)

    def _far_out(self, rule: HealthRule, value: float) -> bool:
        """The check's value this step and its `early_patience - 1` before, each above
        EARLY_FACTOR times the bound (a rule without a bound: the check alone)."""
        if rule.bound is None or not is_finite_number(value):
            return True
        streak = self._latest(rule.metric, value, rule.early_patience)
        return len(streak) == rule.early_patience and all(
            v > EARLY_FACTOR * rule.bound for v in streak
        )

    def _guard_latest(
        self, rule: HealthRule, now: Mapping[str, float]
    ) -> tuple[float | None, float | None]:
        """The guard metric's latest value after step 0 (this step's if logged) and the
        standard error logged beside it; (None, None) before it has one."""
        metric = rule.guard_metric
        if is_finite_number(now.get(metric)):
            return now[metric], now.get(stderr_of(metric))
        latest = (self.recent.get(metric) or [None])[-1]
        return latest, (self.recent.get(stderr_of(metric)) or [None])[-1]

    def _fell(self, rule: HealthRule, now: Mapping[str, float]) -> bool:
        """Whether the guard metric's value this step, and its `fall_evals - 1` values before,
        are each more than `guard_fall` standard errors below its best."""
        metric = rule.guard_metric
        value = now.get(metric)
        if rule.guard_fall is None or not is_finite_number(value):
            return False  # judged on the steps the guard metric is logged
        values = self._latest(metric, value, rule.fall_evals)
        stderrs = self._latest(stderr_of(metric), now.get(stderr_of(metric)), rule.fall_evals)
        if len(values) < rule.fall_evals or len(stderrs) < rule.fall_evals:
            return False
        peak = max(value, self.peaks.get(metric, value))
        spreads = [_spread(se, self.peak_stderrs.get(metric)) for se in stderrs]
        return all(
            spread is not None and peak - v > rule.guard_fall * spread
            for v, spread in zip(values, spreads, strict=True)
        )

    def _latest(self, metric: str, now: Any, count: int) -> list[Any]:
        """The metric's last `count` values, this step's (`now`) the last."""
        return [*self.recent.get(metric, []), now][-count:]

    def _holds(self, rule: HealthRule, value: float, now: Mapping[str, float]) -> bool | None:
        """Whether the check holds; None when it cannot be judged this step."""
        if rule.check == Check.not_finite:
            return not is_finite_number(value)
        if not is_finite_number(value):
            return None  # NaN is the not_finite rules' business
        holds = self._compare(rule, value, now)
        if not holds or rule.guard in (Guard.none, Guard.not_improved):
            return holds
        rising = self.rising(rule.guard_metric, rule.rise, now)
        if rising is None:  # too early to tell a trend: the check alone decides
            return holds if rule.guard == Guard.not_rising else None
        return rising == (rule.guard == Guard.rising)

    def _compare(self, rule: HealthRule, value: float, now: Mapping[str, float]) -> bool | None:
        if rule.check == Check.above:
            return value > rule.bound
        if rule.check == Check.below:
            return value < rule.bound
        if rule.check == Check.fell_from_peak:
            return self._fell_from_peak(rule, value, now)
        if rule.check == Check.mean_below_start:
            return self._mean_below_start(rule, value)
        reference = {
            Check.below_baseline: self.baselines,
            Check.below_peak: self.peaks,
            Check.ratio_below: self.firsts,
            Check.ratio_above: self.firsts,
        }[rule.check].get(rule.metric)
        if reference is None:
            return None
        if rule.check == Check.ratio_below:
            return value < rule.bound * reference
        if rule.check == Check.ratio_above:
            return value > rule.bound * reference
        theirs = (
            self.baselines.get(stderr_of(rule.metric))
            if rule.check == Check.below_baseline
            else self.peak_stderrs.get(rule.metric)
        )
        margin = self._margin(rule, now.get(stderr_of(rule.metric)), theirs)
        return None if margin is None else value < reference - margin

    def _margin(self, rule: HealthRule, mine: float | None, theirs: float | None) -> float | None:
        """The bound in the metric's units: as given, or that many standard errors of the
        difference of two values (None where one was logged without its standard error: the
        check is not judged)."""
        if rule.unit == Unit.absolute:
            return rule.bound
        spread = _spread(mine, theirs)
        return None if spread is None else rule.bound * spread

    def _fell_from_peak(
        self, rule: HealthRule, value: float, now: Mapping[str, float]
    ) -> bool | None:
        """Learned, then broke: the best so far rose more than `rise` above the baseline, and
        the value is back at or below the baseline and more than the bound below that best
        (both in the rule's unit)."""
        metric = rule.metric
        base, peak = self.baselines.get(metric), self.peaks.get(metric)
        if base is None or peak is None:
            return None
        peak_se, base_se = self.peak_stderrs.get(metric), self.baselines.get(stderr_of(metric))
        learned = self._margin(replace(rule, bound=rule.rise), peak_se, base_se)
        fell = self._margin(rule, now.get(stderr_of(metric)), peak_se)
        if learned is None or fell is None:
            return None
        return peak - base > learned and value <= base and peak - value > fell

    def _mean_below_start(self, rule: HealthRule, value: float) -> bool | None:
        """The mean of the metric's last `window` values (this step's the last) is more than
        `bound` standard errors of the difference below the mean of its first `window`; each
        window's standard error from its own values' spread. None before both are full."""
        start = self.starts.get(rule.metric, [])[: rule.window]
        latest = self._latest(rule.metric, value, rule.window)
        if len(start) < rule.window or len(latest) < rule.window:
            return None
        spread = _spread(_stderr_of_mean(start), _stderr_of_mean(latest))
        return statistics.fmean(start) - statistics.fmean(latest) > rule.bound * spread


def _stderr_of_mean(values: list[float]) -> float:
    return statistics.stdev(values) / len(values) ** 0.5


def _spread(mine: float | None, theirs: float | None) -> float | None:
    """The standard error of a difference of two independent estimates; None if one is
    missing."""
    if not (is_finite_number(mine) and is_finite_number(theirs)):
        return None
    return (mine**2 + theirs**2) ** 0.5


def _number(value: Any, kind: type) -> bool:
    if kind is int:
        return type(value) is int and value >= 0
    return type(value) in (int, float) and is_finite_number(value)


def first_to_prune(fired: Iterable[Breach]) -> Breach | None:
    return next((b for b in fired if b.action == Action.prune.value), None)
