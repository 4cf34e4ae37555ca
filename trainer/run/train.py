"""The GRPO training loop, top to bottom.

train(): validate -> load policy and task -> baseline eval -> steps -> final eval and save.
Each step is the pipeline's (trainer/rl/pipelines.py: sync, stream or async), and every pipeline
trains with the one shared step of trainer/rl/step.py.

Read in this order, the whole algorithm (~850 lines, no file of model/ needed): this file,
`SyncPipeline` (trainer/rl/pipelines.py), trainer/rl/step.py, trainer/rl/rl_math.py (the
math, pure) and trainer/rl/losses.py. Shape suffixes are in docs/glossary.md.

Simplified, stated plainly: one reward per completion (no per-token rewards), one epoch over
each batch, the sampler's log-probs are the importance ratio's old policy (not recomputed), no
value model. Left out of this reading, the speed: micro-batches sized to memory, packed
groups, the shared prompt cache, the chunked output layer, merged LoRA and oneDNN all sit
behind `Policy.logprobs` / `Policy.learner_pieces` (what they compute is said in plain words in
trainer/model/policy.py; trainer/model/fast_logprobs.py runs them), with a plain reference
path (trainer/model/plain_logprobs.py) tested equal.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch
from omegaconf import DictConfig

from judge.stats import mean_and_stderr
from records import metrics as metrics_names
from trainer.base.progress import progress, shown_kl
from trainer.env.prompts import baseline_advice
from trainer.env.rewards import score_batch
from trainer.env.tasks import Task, make_task
from trainer.env.trl_rewards import use_tokenizer
from trainer.model.policy import Policy
from trainer.rl.pipelines import make_pipeline
from trainer.rl.step import NonFiniteError
from trainer.run.checkpoint import resume, save_checkpoint, save_final
from trainer.run.health import HealthMonitor, default_rules
from trainer.run.lr import make_scheduler, resolve_lr
from trainer.run.validation import validate
from trainer.sampling.factory import make_sampler
from trainer.sampling.model_source import load_policy, onednn_param
from trainer.sampling.protocol import Sampler, SamplingSettings

__all__ = [
    "NonFiniteError",
    "OwnModel",
    "PolicySource",
    "Reporter",
    "TrainResult",
    "evaluate",
    "train",
]

log = logging.getLogger(__name__)


class PolicySource(Protocol):
    """Where a run's policy and sampler come from: `OwnModel` (this process loads the model), or
    a packed trial's share of one base model (trainer/packed/)."""

    def policy(self, cfg: DictConfig) -> Policy:
        """The run's policy; called once the run's seed is set, so its LoRA init draws from it."""

    def sampler(self, policy: Policy, cfg: DictConfig) -> Sampler:
        """What the run samples with."""


class OwnModel:
    """The policy loaded by this run alone, and its configured sampler."""

    def policy(self, cfg: DictConfig) -> Policy:
        return load_policy(cfg)

    def sampler(self, policy: Policy, cfg: DictConfig) -> Sampler:
        return make_sampler(cfg.sampler.name, policy, cfg)


class Reporter(Protocol):
    """May also hold `monitor`, the HealthMonitor it checks each step's metrics by (a sweep
    trial's, whose breach prunes it): the run's one monitor, saved with each checkpoint and
    restored on resume; and `health_rules`, its rules: a backend names those whose metric it
    does not report."""

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Receive a step's metrics; raising stops training (e.g. a pruned sweep trial)."""

    # Optional: `resumed(step)`, called once before the first step with the checkpoint step
    # actually loaded (None: a start from step 0), so a record made before training, which
    # could only guess, says what was loaded (a sweep trial's); `params(params)`, called once
    # the policy has loaded with what the run decided on this host (records.metrics'
    # ONEDNN_PARAM), recorded beside the run's hyperparameters.


@dataclass
class TrainResult:
    final_eval: float  # eval/reward/mean at the end
    baseline_eval: float | None  # the same before any update (None when resumed)
    output_dir: Path
    # The final eval's reward per problem, by eval metric: the same problems in the same order
    # for every run on a task, so two runs compare problem by problem (a paired comparison).
    final_eval_rewards: dict[str, list[float]] = field(default_factory=dict)
    resumed_from_step: int | None = None  # the checkpoint actually loaded (None: step 0)


POST_UPDATE_KLS = (metrics_names.KL_PRE_POST_V1, metrics_names.KL_PRE_POST_V2)


def train(
    cfg: DictConfig, reporter: Reporter | None = None, source: PolicySource | None = None
) -> TrainResult:
    source = source or OwnModel()
    for warning in validate(cfg):
        log.warning(warning)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    policy = source.policy(cfg)
    report_params(reporter, cfg)
    task = make_task(cfg.task)
    use_tokenizer(task, policy.tokenizer)
    lr = resolve_lr(cfg, policy.model.config.hidden_size)
    # fused: one kernel for all parameters instead of a dozen ops each
    fused = policy.device.type in ("cpu", "cuda")
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=lr, weight_decay=0.0, fused=fused or None
    )
    scheduler = make_scheduler(cfg, optimizer)
    sampler = source.sampler(policy, cfg)
    settings = SamplingSettings.from_config(cfg)

    start_step, baseline = 0, None
    watch = RunHealth(reporter, cfg.kl_threshold)
    resumed = None
    if cfg.resume:
        resumed = resume(cfg.output_dir, policy, optimizer, scheduler, rng, watch.monitor)
    if resumed is not None:
        start_step = resumed
        log.info("Resumed from the step %d checkpoint in %s", start_step, cfg.output_dir)
    report_resumed(reporter, resumed)
    if resumed is None:
        eval_metrics, _ = evaluate(sampler, task, settings, cfg)
        baseline = eval_metrics[metrics_names.EVAL_REWARD]
        advice = baseline_advice(
            baseline,
            real_model=cfg.model.path is not None,
            template=sampler.renderer.template_state(),
            rewards=list(getattr(getattr(task, "rewards", None), "names", [])),
            truncated=eval_metrics[metrics_names.EVAL_TRUNCATED],
            max_tokens=cfg.max_tokens,
        )
        if advice:
            log.warning(advice)
        watch.check(0, eval_metrics)
        _report(reporter, 0, eval_metrics)

    log.info(
        "Training %d steps at lr=%.3g, %d rollouts a step, learner micro-batches of at most "
        "%d tokens",
        cfg.max_steps,
        lr,
        cfg.batch_size * cfg.group_size,
        policy.passes.learner_batch_tokens,
    )
    metrics: dict[str, float] = {}
    last_eval, per_problem = baseline, {}
    pipeline = make_pipeline(cfg, policy, sampler, task, optimizer, rng, settings)
    bar = progress(range(start_step + 1, cfg.max_steps + 1), "grpo", unit="step")
    try:
        for step in bar:
            metrics = pipeline.step(step)
            scheduler.step()
            due = step == cfg.max_steps or (cfg.eval_every and step % cfg.eval_every == 0)
            if due or watch.wants_eval(step, metrics):
                eval_metrics, per_problem = evaluate(sampler, task, settings, cfg)
                metrics.update(eval_metrics)
                last_eval = eval_metrics[metrics_names.EVAL_REWARD]
            watch.check(step, metrics)
            bar.set_postfix(  # shown at the bar's next redraw: a log gets one every few seconds
                reward=f"{metrics[metrics_names.REWARD]:.2f}",
                eval="-" if last_eval is None else f"{last_eval:.2f}",
                **shown_kl(metrics),
                refresh=False,
            )
            _report(reporter, step, metrics)  # first, so a sweep sees the values and says why
            # A non-finite post-update KL means the updated policy's own log-probs are: the
            # next step's sampling would fail on them with torch's error, not this one line.
            for name in (metrics_names.LOSS, metrics_names.GRAD_NORM, *POST_UPDATE_KLS):
                if name in metrics and not math.isfinite(metrics[name]):
                    raise NonFiniteError(f"{name}={metrics[name]} at step {step}; lower lr")
            if cfg.save_every and step % cfg.save_every == 0:
                save_checkpoint(
                    cfg.output_dir, step, policy, optimizer, scheduler, rng, watch.monitor.state()
                )
    finally:
        pipeline.close()
        bar.close()
    if start_step >= cfg.max_steps:  # resumed from the last step's checkpoint: its result is
        # the final eval, which a run lost after that checkpoint never got to record
        eval_metrics, per_problem = evaluate(sampler, task, settings, cfg)
        last_eval = eval_metrics[metrics_names.EVAL_REWARD]
        _report(reporter, cfg.max_steps, eval_metrics)
    save_final(cfg.output_dir, policy, cfg)
    return TrainResult(last_eval, baseline, Path(cfg.output_dir), per_problem, resumed)


class RunHealth:
    """The run's one health monitor. A sweep trial's reporter holds it (`monitor`) and checks
    it in `report`, pruning at a breach; a run without one (`python -m trainer`) checks the
    default rules here and logs each rule's first firing, never stopping. Either way the
    trainer saves and restores it with its checkpoints."""

    def __init__(self, reporter: Reporter | None, kl_threshold: float) -> None:
        given = getattr(reporter, "monitor", None)
        self.own = given is None  # checked here, not by the reporter
        self.monitor = HealthMonitor(default_rules(kl_threshold)) if given is None else given
        self.warned: set[str] = set()

    def wants_eval(self, step: int, metrics: dict[str, float]) -> bool:
        """Evaluate at this step, off the eval_every schedule: before any eval since the
        baseline, a KL rule would otherwise prune on the KL alone (HealthMonitor.wants_eval)."""
        if not self.monitor.wants_eval(step, metrics):
            return False
        log.info("Evaluating at step %d, off the schedule: the health rules ask for it", step)
        return True

    def check(self, step: int, metrics: dict[str, float]) -> None:
        if not self.own:
            return  # the reporter checks it, once a step
        for breach in self.monitor.breaches(step, metrics):
            if breach.rule not in self.warned:
                self.warned.add(breach.rule)
                log.warning("health %s: %s (%s)", breach.action, breach, STANDALONE[breach.action])


# A single run stops for no rule: what each action means here.
STANDALONE = {
    "prune": "a sweep stops its trial at this breach; this run is not a sweep's and goes on",
    "warn": "a warning; the run goes on",
}


@torch.no_grad()
def evaluate(
    sampler: Sampler, task: Task, settings: SamplingSettings, cfg: DictConfig
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
    k = cfg.eval_samples
    scored = score_batch(
        task, [(problems[i // k], r.text, r.finished) for i, r in enumerate(rollouts)]
    )[0]
    rewards = [total for total, _ in scored]
    per_problem = {metrics_names.EVAL_REWARD: _per_problem(rewards, k)}
    if cfg.eval_greedy:
        greedy = sampler.sample([p.prompt for p in problems], replace(settings, greedy=True))
        calls = [(p, r.text, r.finished) for p, r in zip(problems, greedy, strict=True)]
        per_problem[metrics_names.EVAL_GREEDY] = [total for total, _ in score_batch(task, calls)[0]]
    metrics: dict[str, float] = {
        metrics_names.EVAL_TRUNCATED: sum(not r.finished for r in rollouts) / len(rollouts)
    }
    finished = [reward for reward, r in zip(rewards, rollouts, strict=True) if r.finished]
    if finished:
        metrics[metrics_names.EVAL_UNTRUNCATED] = sum(finished) / len(finished)
    # Each reward's per-problem mean too, so a sweep whose objective is one reward (the
    # correctness one, where the total can be gamed) gets its stderr: racing's min_difference
    # and the verdict's per-problem pairing read them (judge/race.py).
    for name in dict.fromkeys(name for _, parts in scored for name in parts):
        values = [parts[name] for _, parts in scored]
        per_problem[metrics_names.eval_reward_part(name)] = _per_problem(values, k)
    for name, values in per_problem.items():
        metrics[name], metrics[metrics_names.stderr_of(name)] = mean_and_stderr(values)
    return metrics, per_problem


def _per_problem(values: list[float], k: int) -> list[float]:
    """Each problem's reward: the mean of its k consecutive samples."""
    return [sum(values[i : i + k]) / k for i in range(0, len(values), k)]


def _report(reporter: Reporter | None, step: int, metrics: dict[str, float]) -> None:
    if reporter is not None:
        reporter.report(step, metrics)


def report_params(reporter: Reporter | None, cfg: DictConfig) -> None:
    """What the run decided as its policy loaded, to a reporter that records it (read only
    then: it builds the checkpoint's config on the meta device)."""
    hook = getattr(reporter, "params", None)
    if hook is not None:
        hook({metrics_names.ONEDNN_PARAM: onednn_param(cfg)})


def report_resumed(reporter: Reporter | None, step: int | None) -> None:
    """The checkpoint step actually loaded (None: step 0), to a reporter that takes it."""
    hook = getattr(reporter, "resumed", None)
    if hook is not None:
        hook(step)
