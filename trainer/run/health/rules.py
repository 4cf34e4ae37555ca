"""Health rules: what a rule and its breach are, and the defaults (the monitor checks them
after every training step: monitor.py; a recorded run replays them: replay.py).

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

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

from records import metrics
from trainer.base.config import TrainConfig


class Check(str, Enum):
    above = "above"  # value > bound
    below = "below"  # value < bound
    not_finite = "not_finite"  # NaN or inf (no bound)
    below_baseline = "below_baseline"  # value < (the metric at step 0) - bound
    below_peak = "below_peak"  # value < (the best value so far) - bound
    ratio_below = "ratio_below"  # value < bound x (its first value after step 0)
    ratio_above = "ratio_above"  # value > bound x (its first value after step 0)
    fell_from_peak = "fell_from_peak"  # learned, then broke: its best rose more than `rise`
    # above the baseline, and the value is back at or below the baseline and more than `bound`
    # below that best
    mean_below_start = "mean_below_start"  # the mean of its last `window` values is more than
    # `bound` standard errors below the mean of its first `window` after step 0 (each window's
    # standard error from its own values' spread: no logged one needed, a TRL run's too)


class Unit(str, Enum):
    """What a below_baseline / below_peak / fell_from_peak bound counts in."""

    absolute = "absolute"  # the metric's own units
    stderr = "stderr"  # standard errors of the difference, from the `<metric>/stderr` logged
    # beside it (an eval's, over its problems): the same rule on a 64- or a 400-problem eval


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
MAX_WINDOW = 10  # the most values a mean_below_start window averages (the monitor keeps them)


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
    # (fell_from_peak: how far above the baseline the best must have risen)
    unit: Unit = Unit.absolute
    guard_unit: Unit = Unit.absolute  # what `rise` counts in for Guard.not_improved
    guard_fall: float | None = None  # not_improved also opens once the guard metric's latest
    # value is this many standard errors below its best: a rise earlier in the run shields
    # nothing after a break
    fall_evals: int = 1  # ... on this many of its values in a row (one noisy eval opens none)
    early_patience: int = 1  # before the guard metric has a value after its baseline: this many
    # of the metric's latest values in a row above EARLY_FACTOR x the bound (at most
    # GUARD_WINDOW)
    window: int = 1  # mean_below_start: values a window averages (from 2 to MAX_WINDOW)

    def __post_init__(self) -> None:  # "above" as well as Check.above
        for name, kind in KINDS.items():
            object.__setattr__(self, name, kind(getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {**data, **{k: getattr(self, k).value for k in KINDS}}


KINDS = {"check": Check, "action": Action, "guard": Guard, "unit": Unit, "guard_unit": Unit}


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
    unit: str = Unit.absolute.value

    def __str__(self) -> str:
        value = "nan/inf" if self.value is None else f"{self.value:.3g}"
        if not self.metric:
            return f"{self.rule}: {self.detail}"
        if self.check == Check.not_finite.value:
            what = f"{self.metric}={value} is not finite"
        elif self.check in WORDS:
            amount = f"{self.bound:g}" + (" standard errors" if self.unit == Unit.stderr else "")
            what = f"{self.metric}={value} {WORDS[self.check].format(amount)}"
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


def guard_words(rule: HealthRule, now: bool = True) -> str:
    """The guard a rule fires under, as a clause (" while reward/mean is not rising"); in the
    past tense for a breach's line."""
    be = "is" if now else "was"
    metric = rule.guard_metric
    if rule.guard == Guard.not_rising:
        return f" while {metric} {be} not rising"
    if rule.guard == Guard.rising:
        return f" while {metric} {'rises' if now else 'rose'}"
    if rule.guard != Guard.not_improved:
        return ""
    if rule.guard_unit == Unit.stderr and rule.rise < 0:  # fell beyond its noise (docs/health.md)
        return f" while {metric} {'falls' if now else 'fell'}"
    if rule.guard_unit == Unit.absolute and rule.rise == 0:
        return f" while {metric} {be} not above its baseline"
    unit = " standard errors" if rule.guard_unit == Unit.stderr else ""
    return f" while {metric} {be} at most {rule.rise:g}{unit} above its baseline"


WORDS = {
    Check.below_baseline.value: "fell more than {} below its baseline",
    Check.below_peak.value: "fell more than {} below its best",
    Check.fell_from_peak.value: "is back at its baseline after learning, more than {} below its best",
    Check.mean_below_start.value: "over its last steps fell more than {} below its first steps",
    Check.ratio_below.value: "< {} x its first value",
    Check.ratio_above.value: "> {} x its first value",
}


# The rules that read the held-out reward count in its own noise: standard errors of a
# difference, from the `<metric>/stderr` the eval logs beside it, so one rule fits a 64-problem
# eval on SmolLM2 and a 400-problem one on the tiny model (an absolute 0.1 could never fire on
# a task whose baseline is under 0.1). Calibrated on the library's calibration part (tiny, 240
# runs; SmolLM2, 17), errors counted whatever a run's label (health_rates.py --variants):
# - post_update_kl at 20 x kl_threshold, while the held-out reward is 2 standard errors below
#   its baseline or 3 below its best (at 10 x and "not above its baseline": 9 of 131 runs that
#   ended up pruned at eval_every=2, flat evals within noise on a KL of 0.1-0.2; 4 with these).
# - eval_collapse at 3 standard errors below the baseline on 2 evals in a row (one noisy eval
#   pruned flat runs at 2-2.5); learned_then_broke at 3 standard errors.
# - Then, on the whole library (2,880 tiny runs: the earlier held-out seeds had been looked at,
#   so they calibrate now), at eval_every=2 these pruned 44 of 1,628 runs that ended up (2.7%):
#   post_update_kl 25, its guard opened by one noisy eval; learned_then_broke 24 on one noisy
#   eval. Now learned_then_broke waits for a second eval (a warning on the first,
#   learned_then_dropped, as eval_drop for eval_collapse) and the KL guard opens at 2.5
#   standard errors below the baseline or 4 below the best (the best of many noisy evals sits
#   high): 20 pruned (1.2%), broken runs missed 7 -> 9 of 807; at eval_every=10 4 pruned
#   (was 11), 35 missed of 810 (was 33). Waiting 4 KL steps pruned fewer (1.0%) but let
#   SmolLM2's 3-step KL spikes through to eval_collapse, later.
# - SmolLM2's held-out runs after that freeze (now calibration, 30 runs) had 2 false prunes at
#   eval_every=2 and 3 at 10, all at lr 2e-3-3e-3, where the KL runs 0.5-17 a step whether a
#   run recovers or breaks. One eval 4 standard errors below the best opened the guard on a run
#   that was back at 0.83 one eval later (lr=2e-3 seed 13); before the first eval, one KL step
#   above 10 x pruned runs whose KL hovered around it. Now the fall must show on 2 evals in a
#   row, and the early gate needs 2 KL steps in a row above 10 x: SmolLM2 0 false prunes, 0
#   misses at both cadences; tiny unchanged at every 2 (20 pruned, 9 missed), 35 -> 36 missed
#   of 810 at every 10.
POST_UPDATE_KL_FACTOR = 20
POST_UPDATE_KL_PATIENCE = 3
POST_UPDATE_KL_RISE = -2.5  # standard errors above the baseline (below: negative)
POST_UPDATE_KL_FALL = 4.0  # standard errors below its best: a rise earlier shields no break
POST_UPDATE_KL_FALL_EVALS = 2  # ... on this many evals in a row
POST_UPDATE_KL_EARLY_PATIENCE = 2  # KL steps in a row above EARLY_FACTOR x before any eval
COLLAPSE_STDERRS = 3.0
BROKE_STDERRS = 3.0
# How far its best must have risen above the baseline for a run to have learned: 2 standard
# errors. At 3, the SmolLM2 run (0.092 -> 0.262 on 64 problems: 2.6 standard errors)
# never "learned" and its break went unseen; at 2 the calibration part's false prunes held (4
# of 131 at eval_every=2, 3 of 142 at 10), one more break was caught at each.
LEARNED_STDERRS = 2.0
# eval_collapse waits for a second eval, so a break the last eval shows goes unpruned: at
# eval_every=10, 43 of the 743 tiny held-out runs that broke down (2 on the calibration part).
# A warning on the first such eval tells the researcher the run's end is worse than its start;
# a warning prunes nothing, so it cannot add a false prune.
# train_reward_fell reads the training reward, logged every step, so it sees a break between
# evals: at eval_every=10, SmolLM2 lr=2e-3 seeds 29 and 33 peaked and broke between two evals,
# and no eval or KL rule fired. On the calibration part (`health_rates.py --window-falls`) it
# warned at 3 / 4 / 5 standard errors 45 / 11 / 3 of the 1,639 tiny runs that ended up, and
# 20 / 15 / 9 of SmolLM2's 25 that broke down (seeds 29 and 33 among them at each). 4 is the
# smallest whole bound warning under 1% of those that ended up; windows of 4 warned 20 of
# them, of 8 caught 13 SmolLM2 breaks.
TRAIN_FELL_STDERRS = 4.0
TRAIN_FELL_WINDOW = 5
# Before the held-out reward has a value after its baseline, a guarded rule fires only at this
# many times its bound (SmolLM2 lr=1e-3, the fastest learner, peaks at 3.9x early; every
# collapse passes 10x within 5 steps). There our trainer asks for an eval (wants_eval); the
# prune stands unless it shows the run learned (LEARNED_STDERRS above the baseline). At
# eval_every=10 the KL alone pruned SmolLM2 lr=2e-3 seed 41 (5.35, 2.46 at steps 6-7; it ended
# at 0.50 from 0.25). The guard's own bar, 2.5 standard errors below the baseline, could not
# prune a collapse to 0 from a baseline that close to 0 (0.25 over 16 problems).
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
            patience=POST_UPDATE_KL_PATIENCE,
            advice="one update moves the policy too far: lower lr",
            guard=Guard.not_improved,
            guard_metric=objective,
            rise=POST_UPDATE_KL_RISE,
            guard_unit=Unit.stderr,
            guard_fall=POST_UPDATE_KL_FALL,
            fall_evals=POST_UPDATE_KL_FALL_EVALS,
            early_patience=POST_UPDATE_KL_EARLY_PATIENCE,
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
            COLLAPSE_STDERRS,
            patience=2,
            advice="the policy collapsed: lower lr",
            unit=Unit.stderr,
        ),
        HealthRule(
            "eval_drop",
            objective,
            Check.below_baseline,
            COLLAPSE_STDERRS,
            advice="the held-out reward is below its step-0 baseline: use an earlier checkpoint or "
            "lower lr",
            action=Action.warn,
            unit=Unit.stderr,
        ),
        HealthRule(
            "learned_then_broke",
            objective,
            Check.fell_from_peak,
            BROKE_STDERRS,
            patience=2,
            advice="the run learned, then broke: lower lr, or keep its best checkpoint",
            rise=LEARNED_STDERRS,
            unit=Unit.stderr,
        ),
        HealthRule(
            "train_reward_fell",
            metrics.REWARD,
            Check.mean_below_start,
            TRAIN_FELL_STDERRS,
            advice="the training reward fell below where it started: lower lr, or keep an "
            "earlier checkpoint",
            action=Action.warn,
            unit=Unit.stderr,
            window=TRAIN_FELL_WINDOW,
        ),
        HealthRule(
            "learned_then_dropped",
            objective,
            Check.fell_from_peak,
            BROKE_STDERRS,
            advice="the run learned, then fell back to its baseline: keep its best checkpoint",
            action=Action.warn,
            rise=LEARNED_STDERRS,
            unit=Unit.stderr,
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
# Its warning on a seed's record tells the verdict that seeds would not help
# (analysis/next_step.py).
NO_LEARNING_SIGNAL = "no_learning_signal"
# Warnings of a GRPO failure mode, not that the held-out reward broke: entropy_collapse fires on
# most SmolLM2 learners. A replay's count of missed breaks does not take them for a catch.
SYMPTOMS = ("entropy_collapse", NO_LEARNING_SIGNAL, "truncation", "length_blowup")


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
            NO_LEARNING_SIGNAL,
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
