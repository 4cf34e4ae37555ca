"""GRPO trainer: `python -m trainer` runs one training; the library API is

    from trainer import train            # train(cfg, reporter=None) -> TrainResult
    from trainer import Reporter, TrainResult, evaluate, validate

`train` runs the configured backend (`backend=ours|trl`, trainer/backends/). The names load
lazily (module `__getattr__`), so `import trainer`, as Hydra's plugin scan and the sweep's
bad-input check do, loads no torch.

Sub-packages in layers, bottom to top; each imports only its own and those below it
(tests/test_import_graph.py checks):

  base      ConfigError and one-line errors, Hydra schemas, progress bar, timer; nothing
  model     Policy, log-probs, packing, KV caches, merged LoRA, micro-batches, Rollout; base
  env       tasks, rewards, prompts and chat templates; base, model
  sampling  Sampler protocol, torch and vLLM samplers, factory, model source and tiny model;
            base, model, env
  rl        GRPO step, pipelines, losses, rl_math; base, model, env, sampling
  run       our train loop, validation, lr, checkpoints, the health rules every run is
            checked by; all of the above
  packed    packed trials: K LoRA trials on one base model in one process, in lockstep,
            each through our train loop; all of the above but backends
  backends  the backend switch (train, validate), TRL's backend, the run logged to MLflow
            (logged_run); all of the above

`__main__` (the command line) sits on top and delegates to trainer.backends.logged_run. Every
layer stands on records/ (metric names, MLflow tracking, the stores), the floor below the
trainer.
"""

from trainer.base.config import register_configs

register_configs()  # schemas must be in Hydra's ConfigStore before any config is composed

__all__ = ["Reporter", "TrainResult", "evaluate", "train", "validate"]

_PUBLIC = {
    "train": "trainer.backends",
    "validate": "trainer.backends",
    "Reporter": "trainer.run.train",
    "TrainResult": "trainer.run.train",
    "evaluate": "trainer.run.train",
}


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_PUBLIC[name]), name)
