"""A reward model as a reward: a local sequence-classification model directory, scored as TRL's
GRPOTrainer scores one (a `trl grpo` recipe's `reward_model_name_or_path`; GRPOTrainer also
takes a model path among its `reward_funcs`, which `trl grpo`'s own `reward_funcs` does not).

TRL 1.16 (`GRPOTrainer.__init__` and `_calculate_rewards`) loads the directory with
`AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)` and its tokenizer from
the same directory (its eos as pad when it has none, written into the model's config: the
model reads the last non-pad token), names it by the directory's last part, and scores a batch
in one forward under inference_mode: each prompt + completion as text (for conversational data
the chat template over the prompt's messages followed by the completion's), tokenized with
padding on the right, no special tokens added and no truncation; the reward is
`logits[:, 0]`. `RewardModel` does the same, loaded once on first call, in eval mode. It is a
TRL-style reward (`fn(prompts=, completions=, **columns) -> list[float]`), so it works on either
backend and in `task.rewards` as `{_target_: trainer.env.reward_model.RewardModel, path: DIR}`;
it runs in the trainer's process, not the reward worker (a forward cannot hang, and a worker
restarted after a timeout would load the model again).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from records.errors import first_line
from trainer.base.errors import ConfigError

TARGET = f"{__name__}.RewardModel"  # its task.rewards `_target_`


def local_model_dir(path: Any, key: str) -> str:
    """`path` as a local directory (normalised: TRL names the model by its last part), or a
    one-line ConfigError naming `key` (a hub name cannot be downloaded here)."""
    found = Path(str(path)).expanduser() if path else None
    if found is None or not found.is_dir():
        raise ConfigError(f"{key}={path!r}: must be a local model directory (no hub downloads)")
    return str(found.resolve())


def reward_texts(prompts: list, completions: list, tokenizer, template_kwargs: dict) -> list:
    """The texts TRL's reward model reads: the chat template over prompt + completion messages
    (TRL's `apply_chat_template({"messages": ...})`), else prompt + completion. A prompt that is
    not a string is a message list, as trl_kwargs (trainer/env/trl_rewards.py) gives it."""
    if prompts and not isinstance(prompts[0], str):
        return [
            tokenizer.apply_chat_template(
                list(p) + list(c), tools=None, tokenize=False, **template_kwargs
            )
            for p, c in zip(prompts, completions, strict=True)
        ]
    return [p + c for p, c in zip(prompts, completions, strict=True)]


def _classifier_labels(path: str) -> int | None:
    """How many labels a saved sequence classifier scores; None for any other model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    classifier = any(a.endswith("ForSequenceClassification") for a in config.architectures or ())
    return config.num_labels if classifier else None


class RewardModel:
    """A local sequence-classification model as a TRL-style reward. path: its directory;
    key: the setting that names it, for one-line errors (a recipe's
    `reward_model_name_or_path`); chat_template_kwargs: GRPOConfig's, which TRL applies to
    the reward model's template too; device: where it scores (TRL's own runs it on the
    trainer's device)."""

    style = "trl"  # called with TRL's keyword lists (trainer/env/trl_rewards.py)
    in_process = True  # never sent to the reward worker

    def __init__(
        self,
        path: str,
        key: str = "task.rewards path",
        chat_template_kwargs: dict | None = None,
        device: str = "cpu",
    ) -> None:
        self.key = key
        self.path = local_model_dir(path, key)
        self.__name__ = Path(self.path).name  # TRL's name for it: rewards/<name>/mean
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.device = device
        self._loaded: tuple[Any, Any] | None = None
        self._lock = threading.Lock()  # the async pipeline's sampler thread and eval share it

    def _refuse(self, rule: str) -> ConfigError:
        return ConfigError(f"{self.key}={self.path!r}: {rule}")

    def load(self) -> tuple[Any, Any]:
        """(model, tokenizer), loaded on first use as TRL loads them; a directory that does not
        load as a sequence classifier with a trained head is a one-line ConfigError."""
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def _load(self) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()  # its own missing-weights report: ours is one line
        hf_logging.disable_progress_bar()
        try:
            labels = _classifier_labels(self.path)
            if labels not in (None, 1):  # TRL's num_labels=1 would fail on the head's shape
                raise self._refuse(f"a classifier of {labels} labels; a reward model has 1")
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.path, num_labels=1, output_loading_info=True
            )
            tokenizer = AutoTokenizer.from_pretrained(self.path)
        except ConfigError:
            raise
        except Exception as e:
            cause = f"{type(e).__name__}: {first_line(e)}"
            raise self._refuse(
                f"does not load as a sequence-classification model ({cause})"
            ) from None
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        missing = sorted(info["missing_keys"])
        if missing:  # a causal LM's directory: a random head, a reward of noise
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise self._refuse(
                f"not a trained reward model: {shown} not in its weights (would start random)"
            )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
        return model.to(self.device).eval().requires_grad_(False), tokenizer

    def __call__(self, prompts: list, completions: list, **_: Any) -> list[float]:
        import torch

        model, tokenizer = self.load()
        texts = reward_texts(prompts, completions, tokenizer, self.template_kwargs)
        inputs = tokenizer(
            text=texts,
            return_tensors="pt",
            padding=True,
            padding_side="right",
            add_special_tokens=False,
        ).to(self.device)
        with torch.inference_mode():
            return model(**inputs).logits[:, 0].float().tolist()
