"""GRPO trainer: `python -m trainer` runs one training, `trainer.run.train.train` is the API.

Sub-packages in layers, bottom to top; each imports only its own and those below it
(tests/test_import_graph.py checks):

  base      ConfigError and one-line errors, Hydra schemas, metric names, progress bar; nothing
  model     Policy, log-probs, packing, KV caches, merged LoRA, micro-batches, Rollout; base
  env       tasks, rewards, prompts and chat templates; base, model
  sampling  Sampler protocol, torch and vLLM samplers, factory, model source and tiny model;
            base, model, env
  rl        GRPO step, pipelines, losses, rl_math, health rules; base, model, env, sampling
  run       train loop (library API), logged run, validation, lr, checkpoints, tracking,
            database, sweep job schema; all of the above

`__main__` (the command line) sits on top and delegates to trainer.run.logged_run.
"""

from trainer.base.config import register_configs

register_configs()  # schemas must be in Hydra's ConfigStore before any config is composed
