"""The callback that makes TRL's run report as ours: step 0's baseline eval, each step of ours
(num_substeps optimizer steps of TRL's) under our metric names, our held-out eval every
eval_every steps and at the end, and a reporter that may stop the run. The run's one health
monitor (trainer/run/train.py's RunHealth: the sweep reporter's, else the default rules warning)
is saved beside each TRL checkpoint (trainer/backends/trl/checkpoints.py) and restored with it.

Every rank calls `reporter.report` at the same steps (in a multi-process run it is a
collective: trainer/backends/__init__.py); only rank 0 evaluates, the others report their
metrics without the eval's. A reporter that raises (a pruned trial, an interrupt) stops TRL at
that step; `train_rank` raises the error once TRL has stopped cleanly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from transformers import TrainerCallback

from records import metrics as metrics_names
from trainer.backends.trl.checkpoints import HEALTH
from trainer.backends.trl.data import TimeoutCount
from trainer.backends.trl.metric_names import TRAIN_SUMMARY, our_metrics
from trainer.rl import rl_math
from trainer.run.train import NonFiniteError, RunHealth


def group_rewards(
    by_func: Mapping[str, Sequence[float]],
    names: Sequence[str],
    weights: Sequence[float],
    group_size: int,
) -> torch.Tensor | None:
    """The last generation's total reward per rollout, problems x group_size, summed over
    the reward functions with their weights as TRL sums them (a function's None, NaN, adds
    nothing); TRL keeps each rollout's per-function rewards, its groups consecutive. None when
    it holds none."""
    columns = [list(by_func.get(name, ())) for name in names]
    if not columns or not columns[0] or any(len(c) != len(columns[0]) for c in columns):
        return None
    per_func_NF = torch.tensor(columns, dtype=torch.float64).T
    total_N = (per_func_NF * torch.tensor(weights, dtype=torch.float64)).nansum(dim=1)
    if len(total_N) % group_size:
        return None
    return total_N.view(-1, group_size)


class Reporting(TrainerCallback):
    """evaluate: None on ranks other than 0; else () -> (metrics, per-problem rewards).
    step_kls(post_update) -> the KLs of the step just trained (every rank). rewards() -> the
    step's rewards, problems x group (`group_rewards`), for the groups' shares as ours
    (rl_math.group_outcome_fractions) in every scale_rewards mode."""

    def __init__(
        self,
        cfg,
        reporter,
        evaluate: Callable | None,
        step_kls: Callable,
        resumed: bool,
        timeouts: TimeoutCount | None = None,
        rewards: Callable[[], torch.Tensor | None] | None = None,
    ) -> None:
        self.cfg, self.reporter, self.evaluate, self.step_kls = cfg, reporter, evaluate, step_kls
        self.timeouts = timeouts
        self.rewards = rewards
        self.substeps = int(cfg.num_substeps)
        self.resumed = resumed
        self.error: BaseException | None = None
        self.baseline: float | None = None
        self.last_eval: float | None = None
        self.per_problem: dict[str, list[float]] = {}
        self.last_step = 0
        self.health = RunHealth(reporter, float(cfg.kl_threshold))

    def restore(self, checkpoint: Path) -> None:
        """The monitor as it was at `checkpoint` (checked by checkpoints.check); one saved
        without it starts afresh."""
        saved = checkpoint / HEALTH
        if saved.is_file():
            self.health.monitor.load_state(json.loads(saved.read_bytes()))

    def on_save(self, args, state, control, **kwargs):
        """Beside the checkpoint TRL just wrote: the monitor after this step's report."""
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            partial = folder / (HEALTH + ".partial")
            partial.write_text(json.dumps(self.health.monitor.state()))
            partial.rename(folder / HEALTH)

    def eval_metrics(self) -> dict[str, float]:
        if self.evaluate is None:
            return {}
        metrics, self.per_problem = self.evaluate()
        self.last_eval = metrics[metrics_names.EVAL_REWARD]
        return metrics

    def on_train_begin(self, args, state, control, **kwargs):
        if self.resumed:
            return
        metrics = self.eval_metrics()
        self.baseline = self.last_eval
        self.report(0, metrics, control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or TRAIN_SUMMARY in logs or state.global_step % self.substeps:
            return
        step = state.global_step // self.substeps
        metrics = our_metrics(logs)
        metrics.update(self.step_kls(bool(self.cfg.compute_post_kl)))
        rewards_PG = self.rewards() if self.rewards is not None else None
        if rewards_PG is not None:
            metrics.update(rl_math.group_outcome_fractions(rewards_PG))
        if self.timeouts is not None:
            metrics[metrics_names.REWARD_TIMEOUTS] = self.timeouts.take()
        eval_every = self.cfg.eval_every
        due = step == self.cfg.max_steps or (eval_every and step % eval_every == 0)
        if due or (self.evaluate is not None and self.health.wants_eval(step, metrics)):
            metrics.update(self.eval_metrics())
        self.report(step, metrics, control)
        for name in (metrics_names.LOSS, metrics_names.GRAD_NORM):
            value = metrics.get(name)
            if self.error is None and value is not None and not math.isfinite(value):
                self.stop(NonFiniteError(f"{name}={value} at step {step}; lower lr"), control)

    def report(self, step: int, metrics: dict[str, float], control) -> None:
        self.last_step = step
        if self.error is not None:
            return
        self.health.check(step, metrics)
        if self.reporter is None:
            return
        try:
            self.reporter.report(step, metrics)
        except BaseException as e:  # a prune or an interrupt: TRL stops, train_rank raises it
            self.stop(e, control)

    def stop(self, error: BaseException, control) -> None:
        self.error = error
        control.should_training_stop = True
        control.should_save = False
