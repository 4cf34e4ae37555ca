"""Run health: rules checked after every training step, and the breach they report.

A sweep prunes a trial at its first breach (sweeper/sweep/job.py); a single training run logs each
rule's first breach as a warning (trainer/run/train.py): the same rules, defined here once.

A rule names a metric, a check and a bound, and fires once the check holds on `patience`
consecutive checked steps after `warmup_steps`. The first rule that fires stops the trial;
its `Breach` (rule, metric, value, bound, step, advice) is what a person reads in the final
table, in Optuna and on the MLflow run. Pure: no store, no torch.

The defaults (`default_rules`) come from the seeds (training is stable with KL below 0.01)
and from curves measured on the tiny model (bench/HEALTH.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

from trainer.base import metrics
from trainer.base.metrics import is_finite_number


class Check(str, Enum):
    above = "above"  # value > bound
    below = "below"  # value < bound
    not_finite = "not_finite"  # NaN or inf (no bound)
    below_baseline = "below_baseline"  # value < (the metric at step 0) - bound


@dataclass(frozen=True)
class HealthRule:
    name: str  # short id shown first in the prune reason
    metric: str  # a per-step metric the trainer logs
    check: Check = Check.above
    bound: float | None = None  # the threshold (a margin for below_baseline; unused by not_finite)
    patience: int = 1  # consecutive checked steps the check must hold
    warmup_steps: int = 0  # steps up to this one are not checked
    advice: str = ""  # what a person does about it, one clause

    def __post_init__(self) -> None:
        object.__setattr__(self, "check", Check(self.check))  # "above" as well as Check.above

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "check": self.check.value}


@dataclass(frozen=True)
class Breach:
    """The rule that fired, and where: one line a person acts on."""

    rule: str
    metric: str
    value: float | None  # None stands for NaN/inf in JSON records
    bound: float | None
    step: int
    check: str = Check.above.value
    advice: str = ""

    def __str__(self) -> str:
        value = "nan/inf" if self.value is None else f"{self.value:.3g}"
        if self.check == Check.not_finite.value:
            what = f"{self.metric}={value} is not finite"
        elif self.check == Check.below_baseline.value:
            what = f"{self.metric}={value} fell more than {self.bound:g} below its baseline"
        else:
            sign = ">" if self.check == Check.above.value else "<"
            what = f"{self.metric}={value} {sign} {self.bound:g}"
        hint = f" ({self.advice})" if self.advice else ""
        return f"{self.rule}: {what} at step {self.step}{hint}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Breach:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# The post-update KL of runs that end within noise of the best reached 0.01-0.2 in their first
# steps (lr=5e-3), while every run that collapsed stayed above 0.1 for 3 steps in a row by
# step 10 (bench/HEALTH.md): its default bound is this many times kl_threshold.
POST_UPDATE_KL_FACTOR = 10


def default_rules(kl_threshold: float = 0.01) -> list[HealthRule]:
    """Calibrated on the tiny model's lr x num_substeps grid (bench/HEALTH.md)."""
    return [
        HealthRule(
            "post_update_kl",
            metrics.KL_PRE_POST_V2,
            Check.above,
            POST_UPDATE_KL_FACTOR * kl_threshold,
            patience=3,
            advice="one update moves the policy too far: lower lr",
        ),
        HealthRule(
            "sampler_kl",
            metrics.KL_SAMPLE_TRAIN_V2,
            Check.above,
            kl_threshold,
            patience=2,
            advice="later minibatches or stale rollouts are off-policy: lower lr or num_substeps",
        ),
        HealthRule("finite_loss", metrics.LOSS, Check.not_finite, advice="lower lr"),
        HealthRule("finite_grad", metrics.GRAD_NORM, Check.not_finite, advice="lower lr"),
        HealthRule(
            "eval_collapse",
            metrics.EVAL_REWARD,
            Check.below_baseline,
            0.1,
            advice="the policy collapsed: lower lr",
        ),
    ]


def rules_from_settings(
    given: Sequence[Mapping[str, Any]], kl_threshold: float
) -> list[HealthRule]:
    """Rules from `hydra.sweeper.health` (a list of dicts); threshold checks without a bound
    take kl_threshold. Errors are one line naming the rule, the field and the rule broken."""
    return [_rule(i, dict(item), kl_threshold) for i, item in enumerate(given)]


def _rule(index: int, item: dict[str, Any], kl_threshold: float) -> HealthRule:
    where = f"hydra.sweeper.health[{index}]"
    known = {f.name for f in fields(HealthRule)}
    unknown = sorted(set(item) - known)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field; rules have {sorted(known)}")
    for key in ("name", "metric"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ValueError(f"{where}.{key}={item.get(key)!r}: must be a non-empty string")
    check = item.get("check", Check.above.value)
    try:
        item["check"] = Check(check)
    except ValueError:
        allowed = ", ".join(c.value for c in Check)
        raise ValueError(f"{where}.check={check!r}: must be one of {allowed}") from None
    if item["check"] in (Check.above, Check.below) and item.get("bound") is None:
        item["bound"] = kl_threshold
    if item["check"] == Check.below_baseline and item.get("bound") is None:
        item["bound"] = 0.0
    bound = item.get("bound")
    if bound is not None and not (isinstance(bound, int | float) and math.isfinite(bound)):
        raise ValueError(f"{where}.bound={bound!r}: must be a finite number")
    for key, low in (("patience", 1), ("warmup_steps", 0)):
        value = item.get(key, low)
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{where}.{key}={value!r}: must be an integer >= {low}")
    return HealthRule(**item)


class HealthMonitor:
    """Checks the rules on each step's metrics; keeps each rule's streak and the baselines."""

    def __init__(self, rules: Iterable[HealthRule]) -> None:
        self.rules = list(rules)
        self.streaks = {rule.name: 0 for rule in self.rules}
        self.baselines: dict[str, float] = {}

    def check(self, step: int, metrics: Mapping[str, float]) -> Breach | None:
        """The first rule that fires at this step (a sweep prunes there), or None."""
        fired = self.breaches(step, metrics)
        return fired[0] if fired else None

    def breaches(self, step: int, metrics: Mapping[str, float]) -> list[Breach]:
        """Every rule that fires at this step, in the rules' order."""
        if step == 0:  # before any update: the baseline, never a breach
            self.baselines.update({k: v for k, v in metrics.items() if is_finite_number(v)})
            return []
        fired = []
        for rule in self.rules:
            value = metrics.get(rule.metric)
            if value is None or step <= rule.warmup_steps:
                continue  # not logged this step: neither counts nor resets the streak
            holds = self._holds(rule, value)
            if holds is None:
                continue
            self.streaks[rule.name] = self.streaks[rule.name] + 1 if holds else 0
            if self.streaks[rule.name] >= rule.patience:
                shown = float(value) if is_finite_number(value) else None
                fired.append(
                    Breach(
                        rule.name,
                        rule.metric,
                        shown,
                        rule.bound,
                        step,
                        rule.check.value,
                        rule.advice,
                    )
                )
        return fired

    def _holds(self, rule: HealthRule, value: float) -> bool | None:
        """Whether the check holds; None when it cannot be judged this step."""
        if rule.check == Check.not_finite:
            return not is_finite_number(value)
        if not is_finite_number(value):
            return None  # NaN is the not_finite rules' business
        if rule.check == Check.above:
            return value > rule.bound
        if rule.check == Check.below:
            return value < rule.bound
        baseline = self.baselines.get(rule.metric)
        return None if baseline is None else value < baseline - rule.bound


def replay(rules: Iterable[HealthRule], curve: Mapping[int, Mapping[str, float]]) -> Breach | None:
    """The breach a monitor finds on a recorded run ({step: metrics}), or None."""
    monitor = HealthMonitor(rules)
    for step in sorted(curve):
        breach = monitor.check(step, curve[step])
        if breach is not None:
            return breach
    return None
