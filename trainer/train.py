"""The GRPO training loop, top to bottom.

train():   validate -> load policy and task -> baseline eval -> steps -> final eval and save
grpo_step(): sample batch_size x group_size rollouts -> rewards -> group-centred advantages
             -> optional KL shaping against the reference -> num_substeps minibatch updates

Simplifications, stated plainly: one reward per completion (no per-step rewards), one epoch
over each batch, and the sampler's log-probs are the old policy of the importance ratio.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import hydra
import torch
from omegaconf import DictConfig

from trainer import metrics as metrics_names
from trainer import rl_math
from trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, save_final
from trainer.losses import LossInputs, get_loss
from trainer.lr import make_scheduler, resolve_lr
from trainer.policy import Policy, TokenBatch, collate, load_policy, token_logprobs
from trainer.progress import progress
from trainer.sampling import SamplingSettings, make_sampler
from trainer.tasks import Task
from trainer.validation import validate

log = logging.getLogger(__name__)


class Reporter(Protocol):
    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Receive a step's metrics; raising stops training (e.g. a pruned sweep trial)."""


class NonFiniteError(FloatingPointError):
    """NaN or inf in rewards, log-probs, the loss or the gradients: the run cannot recover."""


# What each minibatch update reports, averaged over the step's minibatches.
UPDATE_METRICS = (
    metrics_names.LOSS,
    metrics_names.GRAD_NORM,
    metrics_names.KL_SAMPLE_TRAIN_V1,
    metrics_names.KL_SAMPLE_TRAIN_V2,
    metrics_names.ENTROPY,
)


@dataclass
class TrainResult:
    final_eval: float  # eval/reward/mean at the end
    baseline_eval: float | None  # the same before any update (None when resumed)
    output_dir: Path
    # The final eval's reward per problem, by eval metric: the same problems in the same order
    # for every run on a task, so two runs compare problem by problem (a paired comparison).
    final_eval_rewards: dict[str, list[float]] = field(default_factory=dict)


def train(cfg: DictConfig, reporter: Reporter | None = None) -> TrainResult:
    for warning in validate(cfg):
        log.warning(warning)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    policy = load_policy(cfg)
    task: Task = hydra.utils.instantiate(cfg.task)
    lr = resolve_lr(cfg, policy.model.config.hidden_size)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    scheduler = make_scheduler(cfg, optimizer)
    sampler = make_sampler(cfg.sampler.name, policy, cfg)
    settings = SamplingSettings.from_config(cfg)

    start_step, baseline = 0, None
    checkpoint = latest_checkpoint(cfg.output_dir) if cfg.resume else None
    if checkpoint is not None:
        start_step = load_checkpoint(checkpoint, policy, optimizer, scheduler, rng)
        log.info("Resumed from %s (step %d)", checkpoint, start_step)
    else:
        eval_metrics, _ = evaluate(sampler, task, settings, cfg)
        baseline = eval_metrics[metrics_names.EVAL_REWARD]
        warn_on_baseline(baseline)
        _report(reporter, 0, eval_metrics)

    log.info(
        "Training %d steps at lr=%.3g, %d rollouts a step",
        cfg.max_steps,
        lr,
        cfg.batch_size * cfg.group_size,
    )
    metrics: dict[str, float] = {}
    last_eval, per_problem = baseline, {}
    bar = progress(range(start_step + 1, cfg.max_steps + 1), "grpo", unit="step")
    try:
        for step in bar:
            metrics = grpo_step(cfg, policy, sampler, task, optimizer, rng, settings)
            scheduler.step()
            if step == cfg.max_steps or (cfg.eval_every and step % cfg.eval_every == 0):
                eval_metrics, per_problem = evaluate(sampler, task, settings, cfg)
                metrics.update(eval_metrics)
                last_eval = eval_metrics[metrics_names.EVAL_REWARD]
            warn_on_kl(cfg, step, metrics)
            bar.set_postfix(
                reward=f"{metrics[metrics_names.REWARD]:.2f}",
                eval="-" if last_eval is None else f"{last_eval:.2f}",
                kl=f"{metrics.get(metrics_names.KL_PRE_POST_V2, math.nan):.1e}",
            )
            _report(reporter, step, metrics)  # first, so a sweep sees the values and says why
            for name in (metrics_names.LOSS, metrics_names.GRAD_NORM):
                if not math.isfinite(metrics[name]):
                    raise NonFiniteError(f"{name}={metrics[name]} at step {step}; lower lr")
            if cfg.save_every and step % cfg.save_every == 0:
                save_checkpoint(cfg.output_dir, step, policy, optimizer, scheduler, rng)
    finally:
        bar.close()
    save_final(cfg.output_dir, policy, cfg)
    return TrainResult(last_eval, baseline, Path(cfg.output_dir), per_problem)


def grpo_step(
    cfg: DictConfig,
    policy: Policy,
    sampler,
    task: Task,
    optimizer: torch.optim.Optimizer,
    rng: random.Random,
    settings: SamplingSettings,
) -> dict[str, float]:
    # 1. Sample: group_size rollouts of each of batch_size problems, grouped by problem.
    started = time.perf_counter()
    sampler.sync_weights()  # a separate inference engine (vLLM) gets the current adapter
    problems_P = task.train_problems(cfg.batch_size, rng)
    prompts_N = [p.prompt for p in problems_P for _ in range(cfg.group_size)]
    rollouts_N = sampler.sample(prompts_N, settings)
    rewards_N = [
        task.reward(problems_P[i // cfg.group_size], r.text, r.finished)
        for i, r in enumerate(rollouts_N)
    ]
    rewards_PG = torch.tensor(rewards_N, dtype=torch.float32).view(cfg.batch_size, cfg.group_size)
    sample_s = time.perf_counter() - started
    require_finite("reward", rewards_PG)
    metrics = {
        metrics_names.REWARD: rewards_PG.mean().item(),
        metrics_names.REWARD_STD: rewards_PG.std().item(),
        **rl_math.group_outcome_fractions(rewards_PG),
    }

    # 2. Advantages: centred within each group, broadcast to every action token.
    started = time.perf_counter()
    batch = collate(rollouts_N, policy.tokenizer.pad_token_id).to(policy.device)
    require_finite("sampler logprob", batch.sampler_logp_NT)
    advantages_N = rl_math.compute_advantages(rewards_PG, cfg.scale_rewards).view(-1, 1)
    advantages_NT = advantages_N.to(policy.device) * batch.mask_NT

    # 3. KL penalty: shape advantages toward the reference (the base model, adapter off).
    if cfg.kl_penalty_coef > 0:
        with torch.no_grad(), policy.reference() as reference:
            ref_logp_NT, _ = token_logprobs(reference, batch, cfg.temperature)
        shaping_NT, metrics[metrics_names.KL_POLICY_REF] = rl_math.kl_penalty(
            batch.sampler_logp_NT,
            ref_logp_NT,
            batch.mask_NT,
            cfg.kl_penalty_coef,
            cfg.kl_discount_factor,
        )
        advantages_NT = advantages_NT + shaping_NT

    # 4. Updates: num_substeps minibatches of whole groups, one optimizer step each.
    mask_NT = batch.mask_NT
    if cfg.loss.mask_truncated_completions:
        mask_NT = mask_NT * batch.finished_N[:, None]
    keep_P = None
    if cfg.remove_constant_reward_groups:
        keep_P = ~rl_math.constant_groups(rewards_PG)
    updates = [
        minibatch_update(cfg, policy, optimizer, batch, advantages_NT, mask_NT, rows)
        for rows in rl_math.minibatch_rows(cfg.batch_size, cfg.group_size, cfg.num_substeps, keep_P)
    ]
    metrics.update(average_updates(updates))
    metrics["lr"] = optimizer.param_groups[0]["lr"]
    train_s = time.perf_counter() - started

    # 5. How far this step's updates moved the policy on its own data (tinker's post-KL):
    # on-policy with one update the sampler-train KL is ~1e-13, this one is what a too-high
    # lr blows up.
    if cfg.compute_post_kl:
        metrics.update(post_update_kl(policy, batch, cfg.temperature))

    metrics["time/sample_s"] = sample_s
    metrics["time/train_s"] = train_s
    metrics["throughput/rollouts_per_s"] = len(rollouts_N) / (sample_s + train_s)
    return metrics


def minibatch_update(
    cfg: DictConfig,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    advantages_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    rows: torch.Tensor,
) -> dict[str, float]:
    """One forward/backward/optimizer step on the given rollouts."""
    rows = rows.to(policy.device)
    minibatch = batch.select(rows)
    logp_NT, entropy_NT = token_logprobs(
        policy.model, minibatch, cfg.temperature, with_entropy=True
    )
    require_finite("learner logprob", logp_NT[minibatch.mask_NT.bool()])
    inputs = LossInputs(
        logp_NT, minibatch.sampler_logp_NT, advantages_NT[rows], mask_NT[rows], cfg.max_tokens
    )
    loss = get_loss(cfg.loss.name)(inputs, cfg.loss)
    grad_norm = torch.tensor(math.nan)
    if torch.isfinite(loss):
        loss.backward()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), max_norm)
    if torch.isfinite(grad_norm):
        optimizer.step()  # a non-finite loss or gradient never reaches the weights
    optimizer.zero_grad(set_to_none=True)
    # Sampler-vs-learner KL on this minibatch, before its own update took effect.
    kl_v1, kl_v2 = rl_math.kl_sample_train(minibatch.sampler_logp_NT, logp_NT, minibatch.mask_NT)
    entropy = rl_math.masked_mean(entropy_NT, minibatch.mask_NT).item()
    return dict(
        zip(UPDATE_METRICS, (loss.item(), grad_norm.item(), kl_v1, kl_v2, entropy), strict=True)
    )


@torch.no_grad()
def post_update_kl(policy: Policy, batch: TokenBatch, temperature: float) -> dict[str, float]:
    """kl_pre_post_v1/v2: the sampler's log-probs vs the learner's after the step's updates."""
    was_training = policy.model.training
    policy.model.eval()  # as the sampler saw it: no dropout
    post_logp_NT, _ = token_logprobs(policy.model, batch, temperature)
    policy.model.train(was_training)
    v1, v2 = rl_math.kl_sample_train(batch.sampler_logp_NT, post_logp_NT, batch.mask_NT)
    return {metrics_names.KL_PRE_POST_V1: v1, metrics_names.KL_PRE_POST_V2: v2}


def average_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    """Mean over the step's minibatches; with none (all groups filtered) nothing moved."""
    if not updates:
        return dict.fromkeys(UPDATE_METRICS, 0.0)
    return {key: sum(u[key] for u in updates) / len(updates) for key in UPDATE_METRICS}


@torch.no_grad()
def evaluate(
    sampler, task: Task, settings: SamplingSettings, cfg: DictConfig
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Held-out reward with its standard error over problems, sampled and greedy.

    Sampled: `eval_samples` completions per problem, a problem's reward their mean. Greedy
    (`eval_greedy`): one argmax completion per problem, a steadier signal on the same weights.
    Sampling runs on a forked RNG seeded with the run's seed: every eval draws the same random
    numbers (so evals differ only by the weights), and training's random stream is untouched,
    so how often one evaluates never changes what is trained.
    Returns (metrics, per-problem rewards by metric).
    """
    problems = task.eval_problems()
    prompts = [p.prompt for p in problems for _ in range(cfg.eval_samples)]
    devices = list(range(torch.cuda.device_count()))
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg.seed)
        rollouts = sampler.sample(prompts, settings)
    rewards = [
        task.reward(problems[i // cfg.eval_samples], r.text, r.finished)
        for i, r in enumerate(rollouts)
    ]
    k = cfg.eval_samples
    per_problem = {
        metrics_names.EVAL_REWARD: [sum(rewards[i : i + k]) / k for i in range(0, len(rewards), k)]
    }
    if cfg.eval_greedy:
        greedy = sampler.sample([p.prompt for p in problems], replace(settings, greedy=True))
        per_problem[metrics_names.EVAL_GREEDY] = [
            task.reward(p, r.text, r.finished) for p, r in zip(problems, greedy, strict=True)
        ]
    metrics: dict[str, float] = {}
    for name, values in per_problem.items():
        metrics[name], metrics[metrics_names.stderr_of(name)] = rl_math.mean_and_stderr(values)
    return metrics, per_problem


def require_finite(name: str, values: torch.Tensor) -> None:
    if not torch.isfinite(values).all():
        raise NonFiniteError(f"{name} is not finite (NaN or inf); lower lr or check the reward")


def warn_on_baseline(baseline: float) -> None:
    if baseline == 0.0:
        log.warning("Baseline eval reward is 0%%: the task is likely too hard for this model")
    elif baseline >= 0.8:
        log.warning(
            "Baseline eval reward is %.0f%%: little left to learn, use harder problems",
            100 * baseline,
        )


def warn_on_kl(cfg: DictConfig, step: int, metrics: dict[str, float]) -> None:
    for name in (metrics_names.KL_SAMPLE_TRAIN_V2, metrics_names.KL_PRE_POST_V2):
        if metrics.get(name, 0.0) > cfg.kl_threshold:
            log.warning(
                "step %d: %s=%.4f exceeds kl_threshold=%g (unstable update)",
                step,
                name,
                metrics[name],
                cfg.kl_threshold,
            )


def _report(reporter: Reporter | None, step: int, metrics: dict[str, float]) -> None:
    if reporter is not None:
        reporter.report(step, metrics)
