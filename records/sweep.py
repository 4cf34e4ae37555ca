"""What a sweep stores, defined once: every key, and how values go in and out of the stores.

The job (sweeper/sweep/job.py), the sweep (sweeper/sweep/loop.py) and the analysis (analysis/)
all read and write through these names and codecs; docs/records.md describes them for people.
Nothing here talks to a store: this module only names and encodes (a record as the line a
person reads is analysis/text.py's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from records.metrics import is_finite_number

# The node of a sweep job's config that binds it to its live trial (analysis/sweep_job.py's
# TrialBinding): filled in by the sweeper, never a hyperparameter.
BINDING_KEY = "trial"


class Tag:
    """MLflow run tags."""

    ROLE = "sweeper.role"  # Role.*
    STUDY = "sweeper.study"
    TRIAL_NUMBER = "sweeper.trial_number"
    SEED = "sweeper.seed"
    STATE = "sweeper.state"  # State.* of the trial (or the seed's run)
    PRUNE_REASON = "sweeper.prune_reason"  # one line: which health rule, value, bound, step
    FAIL_REASON = "sweeper.fail_reason"
    BEST_PARAMS = "sweeper.best_params"
    VERDICT = "sweeper.verdict"
    RESUMED_FROM_STEP = "sweeper.resumed_from_step"  # a retried run continued from a checkpoint
    RACE = "sweeper.race"  # seeds=auto: why the configuration got the seeds it got
    STOPPED = "sweeper.stopped"  # terminator=true: why the study stopped before n_trials
    WARNING_PREFIX = "sweeper.warning."  # + rule: a warning rule's first firing, one line
    ADAPTER_MODEL = "sweeper.adapter_model"  # the best adapter's MLflow model (analysis best)
    OBJECTIVE = "sweeper.objective"  # the metric the sweep ranks by, on each of its runs


# Metrics a sweep's job logs beside the run's own (records/metrics.py).
WARNING_METRIC_PREFIX = "warning/"  # + rule: 1 at the step a warning rule first fired
FORECAST_MEAN = "forecast/mean"  # pruner=forecast: the predicted final objective, per eval step
FORECAST_HIGH = "forecast/high"  # and its optimistic bound at forecast_level


class Role:
    STUDY = "study"  # the study's parent run
    CONFIG = "config"  # one configuration of a study run with several seeds (its seeds nest)
    TRIAL = "trial"  # one training run of a trial (one seed)


class State:
    """A trial's outcome as both stores spell it (Optuna's TrialState names)."""

    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAIL = "FAIL"
    RUNNING = "RUNNING"  # a seed's record while it trains (its run id and output folder)


class StudyMetric:
    """MLflow metrics of the study's run."""

    BEST_VALUE = "best_value"  # the best trial's objective
    BEST_TRIAL = "best_trial"  # its number


class ConfigMetric:
    """MLflow metrics of a configuration's run (hydra.sweeper.seeds > 1), beside its seeds'."""

    OBJECTIVE_MEAN = "objective/mean"  # the mean objective over its seeds
    SEEDS_ENDED = "seeds/ended"  # how many of its seeds ended
    # The verdict's 95% interval of the configuration's objective, logged when the sweep ends
    # (on its trial run when it has one seed, with seeds/ended): the study's MLflow view.
    CI_LOW = "objective/ci95_low"
    CI_HIGH = "objective/ci95_high"


# MLflow's run status for each outcome: a pruned run was stopped on purpose.
RUN_STATUS = {State.COMPLETE: "FINISHED", State.PRUNED: "KILLED", State.FAIL: "FAILED"}


class StudyAttr:
    """Optuna study user attrs: the sweep's settings, so any worker or report reads them."""

    OBJECTIVE = "objective"
    DIRECTION = "direction"
    HEALTH_RULES = "health_rules"  # [rule as dict], trainer.run.health
    KL_THRESHOLD = "kl_threshold"
    PRUNER = "pruner"
    PRUNER_WARMUP_STEPS = "pruner_warmup_steps"
    FORECAST_LEVEL = "forecast_level"  # pruner=forecast: the one-sided level of both bounds
    SAMPLER = "sampler"
    SEEDS = "seeds"  # replicates per configuration (the first ones, with seeds=auto)
    MAX_SEEDS = "max_seeds"  # seeds=auto: the most seeds a configuration gets (absent otherwise)
    MIN_DIFFERENCE = "min_difference"  # the difference that counts (absent when null)
    SEARCH_SPACE = "search_space"  # {param: spec as typed}
    LOG_PARAMS = "log_params"
    FIXED_OVERRIDES = "fixed_overrides"
    MLFLOW_TRACKING_URI = "mlflow_tracking_uri"
    MLFLOW_EXPERIMENT = "mlflow_experiment"
    MLFLOW_PARENT_RUN_ID = "mlflow_parent_run_id"  # written last: joining workers wait for it
    STOPPED = "stopped"  # terminator=true: why the study stopped before n_trials, one line


# The Optuna constraint a health-pruned trial is told with (Trial.set_constraint): TPE ranks an
# infeasible trial after every feasible one. bench/HEALTH.md ("Breaches as constraints") found
# that this changes no TPE sample (a pruned trial ranks after every completed one anyway) and
# that GPSampler reads constraints of completed trials only.
BREACH_CONSTRAINT = "health_breach"


class TrialAttr:
    """Optuna trial user attrs."""

    MLFLOW_RUN_ID = "mlflow_run_id"  # the trial's run (its configuration run with seeds > 1)
    OVERRIDES = "overrides"  # [key=value] that compose the trial's config
    STEPS_RUN = "steps_run"
    BASELINE = "baseline_reward"
    # EVAL_TRUNCATED at its first seed's baseline eval: 1 when every completion hit max_tokens
    BASELINE_TRUNCATED = "baseline_truncated"
    PRUNE_REASON = "prune_reason"  # a Breach as a dict (trainer.run.health)
    FAIL_REASON = "fail_reason"
    RETRY_OF = "retry_of"  # an interrupted trial's number, on the trial queued in its place
    RESUME_DIRS = "resume_dirs"  # {seed: {output_dir, run_id}} a retried point continues
    INTERRUPTED = "interrupted"
    LOST_IN_A_ROW = "lost_in_a_row"  # times its point was lost to the infrastructure in a row
    CHECKPOINTS_SEEN = "checkpoints_seen"  # its checkpoint folders when it was last lost
    RACE = "race"  # seeds=auto: why it got the seeds it got (judge/race.py), one line
    REPLICATE_PREFIX = "replicate_"  # + seed: a Replicate as a dict, written by its job


@dataclass(frozen=True)
class Replicate:
    """One seed's training run of a configuration, as its job records it."""

    seed: int
    state: str  # State.*
    value: float | None  # the objective's last value (None unless COMPLETE)
    stderr: float | None  # the objective's standard error over eval problems, when logged
    steps_run: int
    baseline: float | None  # eval reward at step 0
    reason: str  # why it was pruned or failed ('' otherwise)
    run_id: str | None
    breach: dict[str, Any] | None = None  # the health rule that pruned it (Breach.as_dict)
    output_dir: str | None = None  # checkpoints and adapter: where a retry resumes
    resumed_from_step: int | None = None  # the checkpoint step it continued from
    device: str | None = None  # model.device it trained on (one per run with a device pool)
    per_problem: tuple[float, ...] | None = None  # final eval reward of each problem
    warnings: tuple[str, ...] = ()  # each warning rule's first firing, one line (its MLflow tag)

    def as_attr(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_problem"] = list(self.per_problem) if self.per_problem is not None else None
        data["value"], data["stderr"] = finite_or_none(self.value), finite_or_none(self.stderr)
        return data

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> Replicate:
        known = {k: data.get(k) for k in cls.__dataclass_fields__}
        per_problem = known.get("per_problem")
        known["per_problem"] = tuple(per_problem) if per_problem is not None else None
        known["warnings"] = tuple(known.get("warnings") or ())  # none in older records
        return cls(**known)


def replicate_key(seed: int) -> str:
    return f"{TrialAttr.REPLICATE_PREFIX}{seed}"


def replicates(trial: FrozenTrial) -> list[Replicate]:
    """The trial's seed runs recorded so far, by seed."""
    found = [
        Replicate.from_attr(value)
        for key, value in trial.user_attrs.items()
        if key.startswith(TrialAttr.REPLICATE_PREFIX) and isinstance(value, Mapping)
    ]
    return sorted(found, key=lambda r: r.seed)


def is_interrupted(trial: FrozenTrial) -> bool:
    """A trial whose worker stopped under it: its point was queued again as a new trial."""
    return trial.state == TrialState.FAIL and bool(trial.user_attrs.get(TrialAttr.INTERRUPTED))


def best_trial(trials: Iterable[FrozenTrial], maximize: bool) -> FrozenTrial | None:
    """The best COMPLETE trial with a finite value, or None (Optuna's `best_trial` raises)."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and is_finite_number(t.value)]
    if not done:
        return None
    return (max if maximize else min)(done, key=lambda t: t.value)


def finite_or_none(value: Any) -> float | None:
    """A number JSON can store: NaN and inf become None."""
    return float(value) if is_finite_number(value) else None
