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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

from records import metrics
from records.metrics import is_finite_number
from trainer.base.config import TrainConfig


class Check(str, Enum):
    above = "above"  # value > bound
    below = "below"  # value < bound
    not_finite = "not_finite"  # NaN or inf (no bound)
    below_baseline = "below_baseline"  # value < (the metric at step 0) - bound
    below_peak = "below_peak"  # value < (the best value so far) - bound
    ratio_below = "ratio_below"  # value < bound x (its first value after step 0)
    ratio_above = "ratio_above"  # value > bound x (its first value after step 0)


class Action(str, Enum):
    prune = "prune"  # stops the trial (a sweep's health_breach)
    warn = "warn"  # recorded (MLflow tag and metric, the report), the trial goes on


class Guard(str, Enum):
    """When a rule's check counts, read from another metric's trend (`guard_metric`)."""

    none = "none"
    not_rising = "not_rising"  # only while the guard metric is not rising (on the training
    # reward, the quantity optimised, its window against one noisy step-1 batch misreads
    # collapses as rising: the defaults use not_improved on the held-out reward instead)
    rising = "rising"  # only while it rises (held-out reward falling while training reward
    # rises: the shape of reward hacking)
    not_improved = "not_improved"  # fires only while the guard metric's latest value after
    # step 0 is no more than `rise` above its step-0 baseline (before it has one: the check
    # alone); the streak counts regardless. For the held-out reward: a KL breach while the
    # eval climbs is a fast learner (SmolLM2 lr=1e-3), one while it falls a collapse, whatever
    # the optimised (training) reward did.


# A metric "rises" when the mean of its last GUARD_WINDOW values is more than `rise` above its
# first value after step 0.
GUARD_WINDOW = 3


@dataclass(frozen=True)
class HealthRule:
    name: str  # short id shown first in the prune reason
    metric: str  # a per-step metric the trainer logs
    check: Check = Check.above
    bound: float | None = None  # the threshold (a margin for below_baseline; unused by not_finite)
    patience: int = 1  # consecutive checked steps the check must hold
    warmup_steps: int = 0  # steps up to this one are not checked
    advice: str = ""  # what a person does about it, one clause
    action: Action = Action.prune
    guard: Guard = Guard.none
    guard_metric: str = metrics.REWARD
    rise: float = 0.05  # how far above its first value the guard metric's recent mean must be

    def __post_init__(self) -> None:  # "above" as well as Check.above
        for name, kind in (("check", Check), ("action", Action), ("guard", Guard)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {**data, **{k: getattr(self, k).value for k in ("check", "action", "guard")}}


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
    action: str = Action.prune.value
    detail: str = ""  # the guard that held (" while reward/mean was not rising"); a
    # stop said in its own sentence (no metric: a forecast's, judge/forecast.py)

    def __str__(self) -> str:
        value = "nan/inf" if self.value is None else f"{self.value:.3g}"
        if not self.metric:
            return f"{self.rule}: {self.detail}"
        if self.check == Check.not_finite.value:
            what = f"{self.metric}={value} is not finite"
        elif self.check in WORDS:
            what = f"{self.metric}={value} {WORDS[self.check].format(self.bound)}"
        else:
            sign = ">" if self.check == Check.above.value else "<"
            what = f"{self.metric}={value} {sign} {self.bound:g}"
        hint = f" ({self.advice})" if self.advice else ""
        return f"{self.rule}: {what}{self.detail} at step {self.step}{hint}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Breach:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


WORDS = {
    Check.below_baseline.value: "fell more than {:g} below its baseline",
    Check.below_peak.value: "fell more than {:g} below its best",
    Check.ratio_below.value: "< {:g} x its first value",
    Check.ratio_above.value: "> {:g} x its first value",
}


# The post-update KL of runs that end within noise of the best reached 0.01-0.2 in their first
# steps on the tiny model (lr=5e-3), while every run that collapsed stayed above 0.1 for 3 steps
# in a row by step 10: its default bound is this many times kl_threshold. On SmolLM2 a run that
# learns fastest moves as far (0.12-0.8) while its held-out reward climbs, so the rule fires
# only while the held-out reward is not above its baseline (bench/HEALTH.md). Not the training
# reward: its window against the noisy step-1 batch read SmolLM2 lr=1e-2's collapse as rising.
POST_UPDATE_KL_FACTOR = 10
# The KL rule's guard margin: it fires only while the held-out reward's latest eval is not above
# its step-0 baseline. 0.05 (about 2 standard errors of a 400-problem eval) let a slow learner's
# noisy eval at lr=7e-3 open the guard: 2 of 56 learners pruned on the calibration part's 263
# runs, none at margin 0, with 96 of 98 broken runs still caught (bench/HEALTH.md, "Error
# rates on the held-out part": 0 of 145 learners pruned on seeds recorded after this).
POST_UPDATE_KL_RISE = 0.0
# Before the held-out reward has a value after its baseline, a guarded rule fires only at this
# many times its bound. Calibration curves (bench/results/health_curves.json, SmolLM2 seed 0):
# SmolLM2 lr=1e-3, the fastest learner, peaks at 0.39 (3.9x the KL bound) in its first steps;
# every collapse passes 10x within its first 5 steps (tiny lr=3e-2: 2.6-60; SmolLM2 lr=1e-2:
# 9.9-29.5, lr=3e-3: 1.54 at step 5). Judged on the held-out curves in bench/HEALTH.md.
EARLY_FACTOR = 10


def default_rules(
    kl_threshold: float = TrainConfig.kl_threshold, objective: str = metrics.EVAL_REWARD
) -> list[HealthRule]:
    """Calibrated on the recorded-curve library's calibration part (bench/HEALTH.md). The rules
    that read the held-out reward read `objective`, the metric the researcher trusts (a sweep's
    `objective`): where the reward's total can be gamed, its honest part. The GRPO
    failure-mode rules only warn."""
    return [
        HealthRule(
            "post_update_kl",
            metrics.KL_PRE_POST_V2,
            Check.above,
            POST_UPDATE_KL_FACTOR * kl_threshold,
            patience=3,
            advice="one update moves the policy too far: lower lr",
            guard=Guard.not_improved,
            guard_metric=objective,
            rise=POST_UPDATE_KL_RISE,
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
            objective,
            Check.below_baseline,
            0.1,
            advice="the policy collapsed: lower lr",
        ),
        *failure_mode_rules(objective),
    ]


# Calibrated on the recorded-curve library's calibration part (bench/health_rates.py). Over 3
# steps in a row the learning runs' mean length stayed below 1.24 x their first step's (SmolLM2
# lr=1e-3; the tiny model's at most 1.02 x), while the tiny model's hacked and collapsed runs
# grew to 1.76-2.3 x (its max_tokens=8 caps it at 2.3 x: the old bound, 3 x, could never fire).
# Entropy stays at 0.1 x: a learner's falls steadily as its policy sharpens (SmolLM2's learners
# reach 0.19-0.2 x by step 12), so a higher floor would warn on long learning runs.
LENGTH_GROWTH = 1.5


def failure_mode_rules(objective: str = metrics.EVAL_REWARD) -> list[HealthRule]:
    """GRPO's own failure modes, warnings by default (bench/HEALTH.md, "Failure modes")."""
    warn = Action.warn
    return [
        HealthRule(
            "entropy_collapse",
            metrics.ENTROPY,
            Check.ratio_below,
            0.1,
            patience=3,
            advice="the policy stopped exploring: lower lr or raise temperature",
            action=warn,
        ),
        HealthRule(
            "no_learning_signal",
            metrics.GROUPS_ZERO_ADVANTAGE,
            Check.above,
            0.9,
            patience=5,
            advice="most groups score alike: raise group_size, or the task is too easy or too "
            "hard for this model",
            action=warn,
        ),
        HealthRule(
            "truncation",
            metrics.COMPLETIONS_TRUNCATED,
            Check.above,
            0.9,
            patience=5,
            advice="completions are cut at max_tokens: raise max_tokens or ask for shorter answers",
            action=warn,
        ),
        HealthRule(
            "length_blowup",
            metrics.COMPLETION_LENGTH,
            Check.ratio_above,
            LENGTH_GROWTH,
            patience=3,
            advice="completions grow without bound: add a length penalty or lower max_tokens",
            action=warn,
        ),
        HealthRule(
            "train_eval_divergence",
            objective,
            Check.below_peak,
            0.12,
            advice="held-out reward falls while training reward rises: the reward is being "
            "gamed, check the rewards",
            action=warn,
            guard=Guard.rising,
        ),
    ]


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
    for key, kind, default in (
        ("check", Check, Check.above),
        ("action", Action, Action.prune),
        ("guard", Guard, Guard.none),
    ):
        value = item.get(key, default)
        try:
            item[key] = kind(value)
        except ValueError:
            allowed = ", ".join(c.value for c in kind)
            raise ValueError(f"{where}.{key}={value!r}: must be one of {allowed}") from None
    if item["check"] in (Check.above, Check.below) and item.get("bound") is None:
        item["bound"] = kl_threshold
    if item["check"] in (Check.below_baseline, Check.below_peak) and item.get("bound") is None:
        item["bound"] = 0.0
    if item["check"] in (Check.ratio_below, Check.ratio_above) and item.get("bound") is None:
        raise ValueError(f"{where}.bound: a {item['check'].value} rule needs a bound (a factor)")
    bound = item.get("bound")
    if bound is not None and not is_finite_number(bound):
        raise ValueError(f"{where}.bound={bound!r}: must be a finite number")
    for key, low in (("patience", 1), ("warmup_steps", 0)):
        value = item.get(key, low)
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{where}.{key}={value!r}: must be an integer >= {low}")
    return HealthRule(**item)


class HealthMonitor:
    """Checks the rules on each step's metrics; keeps each rule's streak, the baselines (step
    0), each metric's first value after step 0, its best so far and its recent values."""

    def __init__(self, rules: Iterable[HealthRule]) -> None:
        self.rules = list(rules)
        self.streaks = {rule.name: 0 for rule in self.rules}
        self.baselines: dict[str, float] = {}
        self.firsts: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.recent: dict[str, list[float]] = {}

    def state(self) -> dict[str, Any]:
        """Everything a decision depends on, as JSON: saved with a checkpoint, so a resumed
        run decides exactly as one never interrupted (`load_state`)."""
        return {
            "streaks": dict(self.streaks),
            "baselines": dict(self.baselines),
            "firsts": dict(self.firsts),
            "peaks": dict(self.peaks),
            "recent": {k: list(v) for k, v in self.recent.items()},
        }

    def load_state(self, state: Any) -> None:
        """Continue from a saved `state()` (read from a shared folder: checked, ValueError
        saying what is wrong). A rule the state does not know starts with no streak."""
        if not isinstance(state, dict) or set(state) != set(self.state()):
            raise ValueError(f"health state is not {sorted(self.state())}")
        for key in ("streaks", "baselines", "firsts", "peaks", "recent"):
            part = state[key]
            if not isinstance(part, dict) or not all(isinstance(k, str) for k in part):
                raise ValueError(f"health state's {key} is not a dict by name")
            for name, value in part.items():
                values = value if key == "recent" and isinstance(value, list) else [value]
                kind = int if key == "streaks" else float
                if key == "recent" and not isinstance(value, list):
                    raise ValueError(f"health state's recent.{name} is not a list")
                if not all(_number(v, kind) for v in values):
                    raise ValueError(f"health state's {key}.{name}={value!r} is not a number")
        self.streaks = {rule.name: int(state["streaks"].get(rule.name, 0)) for rule in self.rules}
        self.baselines = dict(state["baselines"])
        self.firsts = dict(state["firsts"])
        self.peaks = dict(state["peaks"])
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

    def _breach(self, rule: HealthRule, value: float, step: int) -> Breach:
        trend = {
            Guard.not_rising: f" while {rule.guard_metric} was not rising",
            Guard.rising: f" while {rule.guard_metric} rose",
            Guard.not_improved: f" while {rule.guard_metric} was not above its baseline",
        }.get(rule.guard, "")
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
        )

    def _remember(self, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if not is_finite_number(value):
                continue
            self.firsts.setdefault(key, value)
            self.peaks[key] = max(value, self.peaks.get(key, value))
            self.recent[key] = [*self.recent.get(key, [])[-(GUARD_WINDOW - 1) :], value]

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
        step's included) is no more than `rise` above its baseline. Before it has one (the
        first eval after step 0 not yet in, or evals off) the check alone decides, at
        EARLY_FACTOR times the bound: a fast learner's KL sits below it, a collapse's far above."""
        if rule.guard != Guard.not_improved:
            return True
        latest = now.get(rule.guard_metric)
        if not is_finite_number(latest):
            latest = (self.recent.get(rule.guard_metric) or [None])[-1]
        baseline = self.baselines.get(rule.guard_metric)
        if latest is None or baseline is None:
            return (
                rule.bound is None
                or not is_finite_number(value)
                or value > EARLY_FACTOR * rule.bound
            )
        return latest <= baseline + rule.rise

    def _holds(self, rule: HealthRule, value: float, now: Mapping[str, float]) -> bool | None:
        """Whether the check holds; None when it cannot be judged this step."""
        if rule.check == Check.not_finite:
            return not is_finite_number(value)
        if not is_finite_number(value):
            return None  # NaN is the not_finite rules' business
        holds = self._compare(rule, value)
        if not holds or rule.guard in (Guard.none, Guard.not_improved):
            return holds
        rising = self.rising(rule.guard_metric, rule.rise, now)
        if rising is None:  # too early to tell a trend: the check alone decides
            return holds if rule.guard == Guard.not_rising else None
        return rising == (rule.guard == Guard.rising)

    def _compare(self, rule: HealthRule, value: float) -> bool | None:
        if rule.check == Check.above:
            return value > rule.bound
        if rule.check == Check.below:
            return value < rule.bound
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
        return value < reference - rule.bound


def _number(value: Any, kind: type) -> bool:
    if kind is int:
        return type(value) is int and value >= 0
    return type(value) in (int, float) and is_finite_number(value)


def first_to_prune(fired: Iterable[Breach]) -> Breach | None:
    return next((b for b in fired if b.action == Action.prune.value), None)


def replay(rules: Iterable[HealthRule], curve: Mapping[int, Mapping[str, float]]) -> Breach | None:
    """The pruning breach a monitor finds on a recorded run ({step: metrics}), or None."""
    monitor = HealthMonitor(rules)
    for step in sorted(curve):
        breach = monitor.check(step, curve[step])
        if breach is not None:
            return breach
    return None


def warnings(rules: Iterable[HealthRule], curve: Mapping[int, Mapping[str, float]]) -> list[Breach]:
    """Each warning rule's first firing on a recorded run, before any pruning breach."""
    monitor, seen = HealthMonitor(rules), {}
    for step in sorted(curve):
        fired = monitor.breaches(step, curve[step])
        for breach in fired:
            if breach.action == Action.warn.value:
                seen.setdefault(breach.rule, breach)
        if first_to_prune(fired):
            break
    return list(seen.values())
