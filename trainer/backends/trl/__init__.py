"""TRL's GRPOTrainer as a backend (`backend=trl`; docs/trl.md, "Sweeping a TRL run").

  mapping      our keys -> GRPOConfig (the one table)
  checks       what backend=trl refuses, one line each (no TRL import)
  metric_names  TRL's logged metric names as ours
  data         our task as TRL's dataset (its prompts as written, our ids) and reward_funcs
  grpo         GRPOTrainer on our prompt ids, keeping the log-probs the health KLs need
  callback     our reporter, our evaluator and the stop a prune asks for, as a TrainerCallback
  health_callback  our health rules in a user's own GRPOTrainer script (no sweep)
  checkpoints  TRL's checkpoint-<global_step> folders in our steps (no TRL import)
  recipe       a `trl grpo --config` YAML as our config (backend.config)
  recipe_file  the YAML read as `trl grpo --config` reads it, refused in one line
  recipe_model  a recipe's ModelConfig as our model and LoRA keys
  recipe_task  a recipe's dataset and reward_funcs as our task
  tuned_recipe  back: the recipe with a trial's tuned values, for `trl grpo --config`

`train(cfg, reporter)` is the backend; `train_rank` is what each process of a run runs (one
process on CPU: `train` calls it here). TRL, transformers and PEFT load only inside them.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from records import metrics as metrics_names

if TYPE_CHECKING:
    from trainer.run.health import HealthRule
    from trainer.run.train import Reporter, TrainResult

__all__ = ["train", "train_rank"]

log = logging.getLogger(__name__)


def train(cfg: DictConfig, reporter: Reporter | None = None) -> TrainResult:
    """A TRL run: in this process, or as ranks through the launcher
    (trainer/backends/distributed.py), which runs `train_rank` in each."""
    if line := missing_rules_line(cfg, health_rules(cfg, reporter)):
        log.warning(line)
    if in_ranks(cfg):
        from trainer.backends.distributed import launch

        return launch(cfg, reporter, "trainer.backends.trl:train_rank")
    return train_rank(cfg, reporter)


def in_ranks(cfg: DictConfig) -> bool:
    """Whether the run goes through the launcher: several processes, or one on a chosen GPU
    (`model.device=cuda:N`, as the sweeper's device pool hands them out). transformers puts a
    one-process run on cuda:0 whatever the current device (and wraps the model in DataParallel
    over every visible GPU), so the launcher's CUDA_VISIBLE_DEVICES=N is what places it.
    Untested: no GPU here."""
    return cfg.backend.processes > 1 or str(cfg.model.device).startswith("cuda:")


def health_rules(cfg: DictConfig, reporter: Reporter | None) -> list[HealthRule]:
    """The rules this run is checked by: the sweep's (its reporter's `health_rules`), else the
    defaults a sweep prunes by."""
    from trainer.run.health import default_rules

    rules = getattr(reporter, "health_rules", None)
    return default_rules(cfg.kl_threshold) if rules is None else list(rules)


def given_metrics(cfg: DictConfig) -> set[str]:
    """The metrics of ours this backend reports under fixed names (callback.py maps TRL's
    logs; grpo.py says when TRL keeps what the sampler-vs-learner KL needs)."""
    from trainer.backends.trl.metric_names import SAME_MEANING

    given = {*SAME_MEANING.values(), metrics_names.GROUPS_MIXED}
    given.add(metrics_names.GROUPS_ZERO_ADVANTAGE)
    if cfg.compute_post_kl:
        given |= {metrics_names.KL_PRE_POST_V1, metrics_names.KL_PRE_POST_V2}
    grpo = cfg.backend.grpo
    vllm_correction = grpo.get("use_vllm", False) and grpo.get(
        "vllm_importance_sampling_correction", True
    )
    if cfg.num_substeps > 1 or vllm_correction:
        given |= {metrics_names.KL_SAMPLE_TRAIN_V1, metrics_names.KL_SAMPLE_TRAIN_V2}
    return given


def missing_rules_line(cfg: DictConfig, rules: Iterable[HealthRule]) -> str | None:
    """One line naming each of the run's health rules whose metric it does not report."""
    line = unreported_rules(given_metrics(cfg), rules)
    return None if line is None else f"backend=trl: {line}"


def unreported_rules(given: set[str], rules: Iterable[HealthRule]) -> str | None:
    """Which rules read a metric outside `given` (and outside the families a TRL run may log),
    in a clause, or None."""
    from trainer.backends.trl.metric_names import TRL_PREFIX

    families = ("eval/", "reward/", TRL_PREFIX)  # our evaluator's, each reward's, TRL's others
    missing = [
        f"{r.name} ({r.metric})"
        for r in rules
        if r.metric not in given and not r.metric.startswith(families)
    ]
    if not missing:
        return None
    return (
        f"not available here, so these health rules never fire: {', '.join(missing)} "
        "(docs/trl.md, 'What the health rules read')"
    )


def train_rank(cfg: DictConfig, reporter: Reporter | None = None) -> TrainResult:
    """One process of a TRL run: the whole run when it has one process."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig

    from trainer.backends.trl.callback import Reporting
    from trainer.backends.trl.checkpoints import newest_usable, step_of
    from trainer.backends.trl.checks import validate as validate_trl
    from trainer.backends.trl.data import training_data
    from trainer.backends.trl.grpo import OurGRPOTrainer
    from trainer.backends.trl.mapping import grpo_kwargs
    from trainer.backends.trl.recipe import notes as recipe_notes
    from trainer.env.prompts import PromptRenderer, prompt_settings
    from trainer.env.tasks import make_task
    from trainer.env.trl_rewards import use_tokenizer
    from trainer.model.rollout import eos_ids
    from trainer.run.lr import resolve_lr
    from trainer.run.train import TrainResult, report_resumed
    from trainer.run.validation import validate
    from trainer.sampling.model_source import lora_config, model_path

    for warning in validate(cfg) + validate_trl(cfg) + recipe_notes(cfg):
        log.warning(warning)
    # TRL's own code calls transformers' deprecated gradient_checkpointing_* and
    # is_gradient_checkpointing names: nothing a user can change, so not on their terminal
    warnings.filterwarnings("ignore", "`(is_)?gradient_checkpointing", FutureWarning)
    torch.manual_seed(cfg.seed)
    path = model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    renderer = PromptRenderer(tokenizer, **prompt_settings(cfg.task))
    task = make_task(cfg.task)
    use_tokenizer(task, tokenizer)
    data = training_data(cfg, task, renderer, set(eos_ids(model, tokenizer)))
    kwargs = grpo_kwargs(cfg, resolve_lr(cfg, model.config.hidden_size))
    kwargs["reward_weights"] = data.reward_weights
    lora = lora_config(cfg)
    trainer = OurGRPOTrainer(
        model,
        data.reward_funcs,
        GRPOConfig(**kwargs),
        Dataset.from_list(data.rows),
        processing_class=tokenizer,
        peft_config=lora,
        prompt_ids=data.prompt_ids,
    )
    if data.reward_names:  # ours: TRL names a reward model by its directory, not its entry
        trainer.reward_func_names = list(data.reward_names)
    main = trainer.accelerator.is_main_process
    # the newest checkpoint that reads and fits (each newer one refused in a line), else step 0
    checkpoint = newest_usable(cfg.output_dir, trainer, warn=main) if cfg.resume else None
    resumed_from = None if checkpoint is None else step_of(checkpoint, cfg)
    report_resumed(reporter, resumed_from)
    evaluator = _evaluator(cfg, trainer, tokenizer, task) if main else None
    resumed = resumed_from is not None
    reporting = Reporting(
        cfg, reporter, evaluator, trainer.step_kls, resumed, data.timeouts, step_rewards(trainer)
    )
    trainer.add_callback(reporting)
    trainer.remove_callback(PrinterCallback)  # disable_tqdm's stand-in: our reporter logs
    if checkpoint is not None:
        reporting.restore(checkpoint)
        log.info("Resumed from %s (step %d)", checkpoint, resumed_from)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if reporting.error is not None:
        raise reporting.error
    if resumed_from is not None and resumed_from >= cfg.max_steps:
        # resumed from the last step's checkpoint: its result is the final eval
        reporting.report(cfg.max_steps, reporting.eval_metrics(), trainer.control)
        if reporting.error is not None:
            raise reporting.error
    if main:
        _save_final(cfg, trainer, tokenizer)
    return TrainResult(
        reporting.last_eval,
        reporting.baseline,
        Path(cfg.output_dir),
        reporting.per_problem,
        resumed_from_step=resumed_from,
    )


def step_rewards(trainer):
    """The step's rewards, problems x group, from what TRL keeps of its last generation (its
    per-function rewards, gathered from every rank)."""
    from trainer.backends.trl.callback import group_rewards

    def read():
        weights = trainer.reward_weights.tolist()
        by_func = trainer._logs["rewards"]  # TRL's own record of the last generation
        return group_rewards(by_func, trainer.reward_func_names, weights, trainer.num_generations)

    return read


def _evaluator(cfg: DictConfig, trainer, tokenizer, task):
    """Our evaluator (trainer.run.train.evaluate) with our sampler over TRL's model."""
    from trainer.model.policy import Policy
    from trainer.run.train import evaluate
    from trainer.sampling.factory import make_sampler
    from trainer.sampling.protocol import SamplingSettings

    policy = Policy(
        trainer.model, tokenizer, trainer.accelerator.device, None, cfg.sampler.merge_lora
    )
    sampler = make_sampler("torch", policy, cfg)
    settings = SamplingSettings.from_config(cfg)

    def run():
        policy.weights_changed()  # TRL's optimizer moved the adapter since the last eval
        return evaluate(sampler, task, settings, cfg)

    return run


def _save_final(cfg: DictConfig, trainer, tokenizer) -> None:
    from trainer.model.policy import Policy
    from trainer.run.checkpoint import save_final

    model = trainer.accelerator.unwrap_model(trainer.model)
    save_final(cfg.output_dir, Policy(model, tokenizer, trainer.accelerator.device), cfg)
