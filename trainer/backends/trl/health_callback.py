"""Our health rules in a user's own GRPOTrainer script, as one TrainerCallback
(docs/trl.md, "Health rules in your own TRL script").

    from trainer.backends.trl.health_callback import HealthCallback

    trainer = GRPOTrainer(..., callbacks=[HealthCallback()])   # the rules on TRL's logs
    trainer.add_callback(HealthCallback(trainer))              # and on the KLs it computes

Each log of TRL's is read under our metric names (metric_names.our_metrics, the backend's own
mapping) and checked by the rules a sweep prunes by (trainer/run/health/ defaults, or a
list given), one step of ours being one generation round (steps_per_generation /
gradient_accumulation_steps of TRL's optimizer steps). Given the trainer, the callback also
computes what the backend computes on its own trainer: the post-update KL, the sampler-vs-
learner KL where TRL keeps the sampler's log-probs, and the groups' shares.

A warning rule's first firing is logged; a pruning rule's breach stops the run at that step
with its one line, and TRL saves a checkpoint there (the state to resume or inspect). With
`report_to` including mlflow, the KLs, each warning and the breach go to TRL's MLflow run, in
the tags and metrics a sweep's trial run uses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from transformers import TrainerCallback

from records import metrics as metrics_names
from records.sweep import WARNING_METRIC_PREFIX, Tag
from records.tracking import write_active_run
from trainer.backends.trl import step_rewards, unreported_rules
from trainer.backends.trl.checkpoints import HEALTH
from trainer.backends.trl.grpo import watch
from trainer.backends.trl.metric_names import SAME_MEANING, TRAIN_SUMMARY, our_metrics
from trainer.base.config import TrainConfig
from trainer.rl import rl_math
from trainer.run.health import Breach, HealthMonitor, HealthRule, default_rules, first_to_prune

log = logging.getLogger(__name__)


class HealthCallback(TrainerCallback):
    """trainer: the GRPOTrainer to compute the KLs and the groups' shares on (None: the rules
    read TRL's logs alone). rules: default_rules(kl_threshold) unless given. After training,
    `breach` is the one that stopped the run (None: none did) and `warnings` each warning
    rule's first firing."""

    def __init__(
        self,
        trainer=None,
        rules: Iterable[HealthRule] | None = None,
        kl_threshold: float = TrainConfig.kl_threshold,
    ) -> None:
        self.rules = default_rules(kl_threshold) if rules is None else list(rules)
        self.monitor = HealthMonitor(self.rules)
        self.trainer = trainer
        self.kls = watch(trainer) if trainer is not None else None
        self.substeps = 1
        self.breach: Breach | None = None
        self.warnings: dict[str, Breach] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.substeps = max(1, args.steps_per_generation // args.gradient_accumulation_steps)
        saved = Path(args.output_dir) / f"checkpoint-{state.global_step}" / HEALTH
        if state.global_step and saved.is_file():  # resumed: decide as if never stopped
            self.monitor.load_state(json.loads(saved.read_bytes()))
        line = unreported_rules(self.given(args), self.rules)
        if line and state.is_world_process_zero:
            log.warning("HealthCallback: %s", line)

    def given(self, args) -> set[str]:
        """Our metrics this run reports: TRL's logs, and what a given trainer lets us compute."""
        given = set(SAME_MEANING.values())
        if self.trainer is not None:
            given |= {metrics_names.KL_PRE_POST_V1, metrics_names.KL_PRE_POST_V2}
            given |= {metrics_names.GROUPS_MIXED, metrics_names.GROUPS_ZERO_ADVANTAGE}
            vllm_correction = args.use_vllm and args.vllm_importance_sampling_correction
            if self.substeps > 1 or vllm_correction:
                given |= {metrics_names.KL_SAMPLE_TRAIN_V1, metrics_names.KL_SAMPLE_TRAIN_V2}
        return given

    def on_save(self, args, state, control, **kwargs):
        """Beside the checkpoint TRL just wrote: the monitor, so a resumed run decides the same."""
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (folder / HEALTH).write_text(json.dumps(self.monitor.state()))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or TRAIN_SUMMARY in logs or state.global_step % self.substeps:
            return
        if self.breach is not None:
            return
        step = state.global_step // self.substeps
        computed = self.computed()
        fired = self.monitor.breaches(step, {**our_metrics(logs), **computed})
        to_mlflow = state.is_world_process_zero and mlflow_reported(args)
        if to_mlflow and computed:
            write_active_run(metrics=computed, step=state.global_step)
        breach = first_to_prune(fired)
        if breach is not None:  # its step's warnings would repeat what the prune says
            self.stop(breach, state, control, to_mlflow)
            return
        for breach in fired:
            if breach.rule not in self.warnings:
                self.warn(breach, state, to_mlflow)

    def computed(self) -> dict[str, float]:
        """The KLs of the step just trained and its groups' shares (with a trainer only)."""
        if self.trainer is None:
            return {}
        metrics = self.kls.take(post_update=True)
        rewards_PG = step_rewards(self.trainer)()
        if rewards_PG is not None:
            metrics.update(rl_math.group_outcome_fractions(rewards_PG))
        return metrics

    def warn(self, breach: Breach, state, to_mlflow: bool) -> None:
        self.warnings[breach.rule] = breach
        if state.is_world_process_zero:
            log.warning("health warning: %s", breach)
        if to_mlflow:
            write_active_run(
                metrics={WARNING_METRIC_PREFIX + breach.rule: 1.0},
                tags={Tag.WARNING_PREFIX + breach.rule: str(breach)},
                step=state.global_step,
            )

    def stop(self, breach: Breach, state, control, to_mlflow: bool) -> None:
        """Stop at this step, keeping its state: TRL saves a checkpoint here."""
        self.breach = breach
        control.should_training_stop = True
        control.should_save = True
        if state.is_world_process_zero:
            log.warning("health stop: %s", breach)
        if to_mlflow:
            write_active_run(tags={Tag.PRUNE_REASON: str(breach)})


def mlflow_reported(args) -> bool:
    """Whether TRL logs this run to MLflow (its callback has started the run by now)."""
    import mlflow

    return "mlflow" in (args.report_to or []) and mlflow.active_run() is not None
