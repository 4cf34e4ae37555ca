"""The task function of `python -m sweeper`: one training, reported to MLflow and Optuna.

In a sweep the sweeper passes the trial's binding (`trial.id`, `trial.storage`, ...) in the
job's overrides, so this may run in any process or host: it opens the live Optuna trial
from the storage, reads the pruning rules the study recorded, and reports each step to both
stores. Without a binding (no `-m`) it is one plain training run, like `python -m trainer`.

The job records its own ending in MLflow (FINISHED, KILLED when pruned, FAILED) and lets the
exception propagate: the sweeper reads it from Hydra's JobReturn and tells the study.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping

import optuna
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from sweeper.errors import fail_reason
from sweeper.pruning import KLPruneRule, PruneReason, TrialPruned, make_pruner
from sweeper.records import trial_run_name
from sweeper.storage import open_storage
from trainer.tracking import MLflowRun
from trainer.train import train

log = logging.getLogger(__name__)


class TrialReporter:
    """Per step: metrics to MLflow, the objective to Optuna, then the prune checks."""

    def __init__(
        self,
        run: MLflowRun,
        trial: optuna.Trial,
        objective: str,
        kl_rule: KLPruneRule,
        prune_on_objective: bool,
    ) -> None:
        self.run = run
        self.trial = trial
        self.objective = objective
        self.kl_rule = kl_rule
        self.prune_on_objective = prune_on_objective
        self.last: dict[str, float] = {}  # last value of every metric
        self.steps_run = 0
        self.baseline: float | None = None  # eval reward before any update (step 0)

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log_metrics(step, metrics)
        self.last.update(metrics)
        self.steps_run = step
        if step == 0:
            self.baseline = metrics.get("eval/reward/mean")
        value = metrics.get(self.objective)
        if value is not None and math.isfinite(value):
            self.trial.report(value, step)
            if self.prune_on_objective and self.trial.should_prune():
                raise TrialPruned(PruneReason(self.objective, float(value), step, None))
        reason = self.kl_rule.check(step, metrics)
        if reason is not None:
            raise TrialPruned(reason)


def run(cfg: DictConfig) -> float:
    """Hydra's task function: a sweep trial when bound to one, else a single run."""
    if cfg.trial.id is None:
        return run_single(cfg)
    return run_trial(cfg)


def run_single(cfg: DictConfig) -> float:
    """Exactly `python -m trainer` (hydra.main passes a given config straight through)."""
    from trainer.__main__ import main as train_main

    return train_main(cfg)


def run_trial(cfg: DictConfig) -> float:
    binding = cfg.trial
    study = load_study(binding.storage, binding.study)
    trial = optuna.Trial(study, binding.id)
    attrs = study.user_attrs
    run = MLflowRun(
        cfg.experiment,
        trial_run_name(binding.number, trial.params),
        parent_run_id=binding.parent_run_id,
        tags={
            "sweeper.role": "trial",
            "sweeper.study": binding.study,
            "sweeper.trial_number": str(binding.number),
        },
        client=MlflowClient(attrs["mlflow_tracking_uri"]),
    )
    trial.set_user_attr("mlflow_run_id", run.run_id)
    run.log_training_config(cfg)
    reporter = TrialReporter(
        run,
        trial,
        attrs["objective"],
        KLPruneRule(
            attrs["kl_metric"],
            attrs["kl_threshold"],
            attrs["kl_patience"],
            attrs["kl_warmup_steps"],
        ),
        prune_on_objective=attrs["pruner"] != "none",
    )
    error: BaseException | None = None
    try:
        train(cfg, reporter)
        return objective_value(reporter)
    except BaseException as e:
        error = e
        raise
    finally:
        record_outcome(trial, reporter, error)
        end_run(run, error)


def objective_value(reporter: TrialReporter) -> float:
    value = reporter.last.get(reporter.objective)
    if value is None:
        known = ", ".join(sorted(reporter.last)) or "none"
        raise KeyError(f"objective {reporter.objective!r} was never reported (metrics: {known})")
    if not math.isfinite(value):
        raise FloatingPointError(f"objective {reporter.objective}={value}")
    return float(value)


def end_run(run: MLflowRun, error: BaseException | None) -> None:
    """Tag and close the child run: FINISHED, KILLED (pruned, Ctrl-C) or FAILED."""
    if error is None:
        run.set_tags({"sweeper.state": "COMPLETE"})
        run.end("FINISHED")
    elif isinstance(error, TrialPruned):
        run.set_tags({"sweeper.state": "PRUNED", "sweeper.prune_reason": str(error.reason)})
        run.end("KILLED")
    elif isinstance(error, KeyboardInterrupt):
        run.set_tags({"sweeper.state": "FAIL", "sweeper.fail_reason": "interrupted (Ctrl-C)"})
        run.end("KILLED")
    else:
        run.set_tags({"sweeper.state": "FAIL", "sweeper.fail_reason": fail_reason(error)})
        run.end("FAILED")


def record_outcome(
    trial: optuna.Trial, reporter: TrialReporter, error: BaseException | None
) -> None:
    """The trial's user attrs the analysis reads, whatever the ending."""
    attrs = {
        "steps_run": reporter.steps_run,
        "final_kl": reporter.last.get(reporter.kl_rule.metric),
        "baseline_reward": reporter.baseline,
    }
    if isinstance(error, TrialPruned):
        attrs["prune_reason"] = error.reason.as_dict()
    for key, value in attrs.items():
        if value is not None:
            trial.set_user_attr(key, value)


@functools.cache
def load_study(storage: str, name: str) -> optuna.Study:
    """The study as a job sees it: a no-op sampler, the objective pruner the study recorded.

    Cached per process, so a launcher that runs many jobs in one process opens the storage
    once.
    """
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    attrs = study.user_attrs
    pruner = make_pruner(attrs["pruner"], attrs["pruner_warmup_steps"])
    return optuna.load_study(
        study_name=name,
        storage=study._storage,
        sampler=optuna.samplers.RandomSampler(),
        pruner=pruner,
    )
