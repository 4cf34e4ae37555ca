"""Typed schema of the training config, registered in Hydra's ConfigStore.

Every RL hyperparameter sits at the root, so `group_size=8 lr=2e-5` work as written on the
command line. A misspelt key or a wrong type fails when Hydra composes the config, before any
model is loaded. The YAML files in `conf/` extend these schemas through their defaults lists.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from records.defaults import DEFAULT_EXPERIMENT
from trainer.base.config_help import register_resolver


@dataclass
class TinyModelRecipe:
    """The embedded default model: a small Llama warm-started on integer addition.

    Every field is part of the cache key, so a changed recipe builds a new model.
    """

    hidden_size: int = 128  # width; ~330k parameters with the defaults below
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads (hidden_size must divide by it)
    intermediate_size: int = 256  # MLP width
    num_digits: int = 2  # operands of the warm-start task: 0 .. 10**num_digits - 1
    target_accuracy: float = 0.3  # warm-start stops once sampled accuracy reaches this
    max_warmup_steps: int = 2000  # supervised steps at most
    warmup_lr: float = 3e-3  # AdamW learning rate of the supervised warm start
    warmup_batch_size: int = 64  # problems per supervised step
    seed: int = 0  # makes the weights reproducible
    cache_dir: str = "~/.cache/grpo-sweeper"  # built models live here, keyed by recipe


@dataclass
class ModelConfig:
    path: str | None = None  # Hugging Face causal-LM directory; None uses the tiny model
    family: str = "llama"  # model family for lr=auto: llama or qwen
    # float32: weights and training in float32. bfloat16 / float16: the weights in half
    # precision, the LoRA adapter (and its optimizer state) kept in float32 by PEFT, log-probs
    # scored in float32. float64: numerical checks only (docs/training.md, "Precision").
    dtype: str = "float32"
    device: str = "auto"  # auto (cuda when present, else cpu), cpu, cuda, cuda:1 ...
    # CPU threads torch computes with: auto shares the usable cores with the runs at once and
    # what else runs on the host (trainer/model/cpu_threads.py); N sets it.
    threads: Any = "auto"
    tiny: TinyModelRecipe = field(default_factory=TinyModelRecipe)


@dataclass
class LossConfig:
    name: str = "importance_sampling"  # the policy loss, one of LOSS_NAMES (loss=NAME picks it)
    clip_low: float = 0.8  # lower bound of the clipped ratio (1 - epsilon)
    clip_high: float = 1.2  # upper bound of the clipped ratio (1 + epsilon_high)
    mask_truncated_completions: bool = False  # completions without EOS give no gradient


@dataclass
class SamplerConfig:
    name: str = "torch"  # torch (KV-cached decoding in this process) or vllm (GPU, optional)
    # Sample (torch) and run the learner's forward on a copy with LoRA merged into the
    # weights (faster; costs one copy of the LoRA-targeted weights). false runs both through
    # the PEFT model itself.
    merge_lora: bool = True
    # torch only: prompt + completion tokens decoded at once; bounds the KV cache's memory
    batch_tokens: int = 8192
    gpu_memory_utilization: float = 0.3  # vllm only: share of GPU memory for its KV cache


BACKENDS = ("ours", "trl")  # backend.name: the GRPO trainer a run (or a sweep trial) uses
# loss.name: each registered once in trainer/rl/losses.py (tests/test_losses.py holds them
# equal). Named here, without torch, so a bad input is refused before torch loads.
LOSS_NAMES = ("importance_sampling", "ppo", "grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("none", "group", "batch")  # scale_rewards: the std advantages are divided by


@dataclass
class BackendConfig:
    """Which GRPO trainer runs: ours (this package) or TRL's GRPOTrainer (trainer/backends/).

    The sweeper, the records and the verdict do not care which: a backend is
    `train(cfg, reporter)` (trainer/backends/__init__.py).
    """

    name: str = "ours"  # the GRPO trainer, one of BACKENDS (backend=NAME picks it)
    # Processes one run spans (launched through torch.distributed's launcher); trl only.
    processes: int = 1
    # TRL only: GRPOConfig options passed through as they are (backend.grpo.use_vllm=true);
    # one that a key of ours already sets is refused (docs/trl.md, "Our keys onto GRPOConfig").
    grpo: dict[str, Any] = field(default_factory=dict)
    # TRL only: a `trl grpo --config` YAML the run starts from (its values over our defaults,
    # the command line's over its; trainer/backends/trl/recipe.py). None: our keys alone.
    config: str | None = None


@dataclass
class TrainConfig:
    # --- groups (one per axis of variation) ---
    model: ModelConfig = field(default_factory=ModelConfig)
    task: Any = MISSING  # a task built by `_target_` (see conf/task/)
    loss: LossConfig = field(default_factory=LossConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)

    # --- optimisation ---
    # The tiny model's lr (its lr scan: bench/README.md); lr=auto (get_lr, calibrated on
    # billion-parameter models) would collapse it. For a real model by path, lr=auto is the
    # place to start.
    lr: Any = 2e-3  # learning rate, or "auto": get_lr() from the model's hidden size and family
    lr_batch_scaling: bool = False  # scale lr by sqrt(batch_size / lr_reference_batch_size)
    lr_reference_batch_size: int = 16  # the batch size at which lr applies unscaled
    lr_schedule: str = "constant"  # constant, linear or cosine decay after warmup
    warmup_steps: int = 0  # linear lr warmup, in training steps
    max_grad_norm: float = 1.0  # gradient clipping; 0 turns it off
    max_steps: int = 50  # training steps (one sampling round each)

    # --- batch shape ---
    batch_size: int = 32  # unique problems per step
    group_size: int = 8  # rollouts per problem; rollouts per step = batch_size x group_size
    num_substeps: int = 1  # minibatches per step, one optimizer step each, one epoch

    # --- pipeline: how rollout groups reach the training step (trainer/rl/pipelines.py) ---
    pipeline: str = "sync"  # sync, stream (train on minibatches as they are sampled) or async
    groups_per_batch: int = 0  # stream/async: groups per optimizer step; 0: batch_size
    num_minibatches: int = 1  # stream: forward/backward minibatches per substep
    max_steps_off_policy: int = 1  # async: groups sampled more updates ago are discarded

    # --- advantages ---
    scale_rewards: str = "none"  # none (centre only), group or batch: divide by that std
    remove_constant_reward_groups: bool = False  # drop groups whose rewards are all equal

    # --- KL ---
    kl_penalty_coef: float = 0.0  # advantage_t += coef * (batch mean kl - kl_t), vs reference
    kl_discount_factor: float = 0.0  # >0 adds discounted future kl terms to each token
    kl_threshold: float = 0.01  # the KL bound the default health rules scale from (run/health.py)
    # Log kl_pre_post_v1/v2 (sampler vs the learner after the step's updates) every step: one
    # no-grad forward over the step's own rollouts. Off saves that forward.
    compute_post_kl: bool = True

    # --- learner memory (trainer/model/micro_batches.py, trainer/model/logprobs.py) ---
    # The learner's forward/backward (and the reference and post-update KL forwards) run in
    # micro-batches of at most this many tokens (each distinct prompt once, plus the completion
    # width per rollout), gradients accumulated to exactly the whole minibatch's. Bounds the
    # activations' memory. auto: as many as keep a piece's activations within 2 GiB, from the
    # model's layers, widths and dtype (trainer/model/micro_batches.py); the tiny model's default
    # batch is one piece, SmolLM2-135M's pieces hold about 970 tokens.
    learner_batch_tokens: Any = "auto"
    # Recompute each decoder layer's activations in the backward instead of keeping them
    # (torch.utils.checkpoint through transformers): less memory, one more forward of time.
    # The same gradients.
    gradient_checkpointing: bool = False

    # --- sampling ---
    temperature: float = 1.0  # sampling temperature, in (0, 10)
    top_p: float = 1.0  # nucleus sampling; 1.0 turns it off
    top_k: int = 0  # keep the k most likely tokens; 0 turns it off
    min_p: float = 0.0  # drop tokens below min_p x the top probability; 0 turns it off
    repetition_penalty: float = 1.0  # >1 discourages repeated tokens; 1.0 turns it off
    max_tokens: int = 8  # completion length limit, in tokens

    # --- LoRA (PEFT); lora_rank=0 trains every weight ---
    lora_rank: int = 8  # adapter rank; 0 trains every weight
    lora_alpha: int = 16  # LoRA scale is lora_alpha / lora_rank
    lora_dropout: float = 0.0  # dropout on the input of each LoRA layer
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # PEFT names

    # --- schedule of side work ---
    eval_every: int = 10  # held-out eval every N steps (and always at the end); 0: end only
    eval_samples: int = 1  # sampled completions per eval problem (a problem scores their mean)
    eval_greedy: bool = True  # also eval greedy decoding (eval/greedy/mean) on the same problems
    save_every: int = 0  # checkpoint (adapter, optimizer, step, RNG) every N steps; 0: off
    resume: bool = False  # continue from the last checkpoint in output_dir
    seed: int = 0  # seeds sampling, batching and LoRA init

    # --- bookkeeping ---
    output_dir: str = "outputs/run"  # adapter, resolved config and checkpoints go here
    experiment: str = DEFAULT_EXPERIMENT  # MLflow experiment name


PACKAGED_CONFIGS = "grpo_sweeper_conf"  # where a wheel carries conf/ (see pyproject.toml)


def config_dir() -> str:
    """The project's config tree: conf/ of a source checkout (an editable install), else the
    copy a regular install carries as the data package `grpo_sweeper_conf`."""
    checkout = Path(__file__).resolve().parents[2] / "conf"
    if (checkout / "config.yaml").is_file():
        return str(checkout)
    spec = importlib.util.find_spec(PACKAGED_CONFIGS)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"no conf/ beside {checkout.parent} and no {PACKAGED_CONFIGS}")
    return str(next(iter(spec.submodule_search_locations)))


def register_configs() -> None:
    """Register the schemas; YAML files in conf/ extend them by name.

    The root schema is a config group (`schema`), so an app can extend it: the sweeper's job
    selects its own subclass with `override schema: ...` (see conf/sweep.yaml).
    """
    register_resolver()  # `--help` reads the comments beside these fields (conf/config.yaml)
    cs = ConfigStore.instance()
    cs.store(group="schema", name="train", node=TrainConfig, package="_global_")
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="loss", name="loss_schema", node=LossConfig)
    cs.store(group="sampler", name="sampler_schema", node=SamplerConfig)
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
