"""GRPO trainer: `python -m trainer` runs one training; `trainer.train.train` is the library API."""

from trainer.config import register_configs

register_configs()  # schemas must be in Hydra's ConfigStore before any config is composed
