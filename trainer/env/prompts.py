"""A problem's prompt rendered once into the token ids the sampler, the learner and the eval see.

A prompt is a plain string or a list of {"role", "content"} messages. `PromptRenderer` applies
the tokenizer's chat template (`apply_chat_template(..., add_generation_prompt=True)`: an
instruct model answers its own template, and ends at once on a bare string) or tokenizes plain
text, and remembers each prompt's ids. The ids it returns ride on every rollout
(`Rollout.prompt_ids`), which is what the learner trains on: there is no second tokenization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

from trainer.base.errors import ConfigError

Message = Mapping[str, str]  # {"role": ..., "content": ...}
Prompt = Union[str, Sequence[Message]]  # noqa: UP007 (a runtime alias, py3.10's `|` on typing)

ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates know
CHAT_TEMPLATE_MODES = ("auto", True, False)  # task.chat_template
# The task config's keys that say how its prompts render, with their defaults: read here for
# every task (trainer/env/tasks.py leaves them out of the task's constructor).
PROMPT_DEFAULTS = {"chat_template": "auto", "system_prompt": None}


def prompt_settings(task_cfg) -> dict[str, Any]:
    """PromptRenderer's settings from the task's config, checked."""
    settings = {key: task_cfg.get(key, default) for key, default in PROMPT_DEFAULTS.items()}
    mode, system_prompt = settings["chat_template"], settings["system_prompt"]
    if mode not in CHAT_TEMPLATE_MODES:
        raise ConfigError(f"task.chat_template={mode!r}: must be one of {CHAT_TEMPLATE_MODES}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ConfigError(f"task.system_prompt={system_prompt!r}: must be a string or null")
    return settings


def check_messages(prompt: Any, where: str) -> None:
    """A message-list prompt with a known role and string content in every message; `where`
    says which row, for the one-line error."""
    for message in prompt:
        if not (isinstance(message, Mapping) and isinstance(message.get("content"), str)):
            raise ConfigError(f"{where}: each message needs a string 'content' (got {message!r})")
        role = message.get("role")
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown message role {role!r}; one of {ROLES}")


def is_prompt(value: Any) -> bool:
    """A string, or a non-empty list of mappings (messages, checked by check_messages)."""
    if isinstance(value, str):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and not isinstance(value[0], str)


def prompt_key(prompt: Prompt) -> str | tuple[tuple[str, str], ...]:
    """A hashable stand-in for a prompt (messages are dicts)."""
    if isinstance(prompt, str):
        return prompt
    return tuple((m["role"], m["content"]) for m in prompt)


class PromptRenderer:
    """Prompt -> token ids, each distinct prompt rendered once.

    chat_template: "auto" applies the tokenizer's template when it has one and a string prompt
    is not already rendered (holds none of the tokenizer's special tokens); True always (an
    error when the tokenizer has none); False never (messages are then joined as plain text).
    system_prompt: a system message put first unless the prompt has its own.
    """

    def __init__(self, tokenizer, chat_template: str | bool = "auto", system_prompt=None) -> None:
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if chat_template is True and not has_template:
            raise ConfigError(
                "task.chat_template=True: this tokenizer has no chat template (use auto or false)"
            )
        self.tokenizer = tokenizer
        self.has_template = has_template
        self.use_template = has_template and chat_template is not False
        self.system_prompt = system_prompt
        self.explicit = chat_template is True
        self._ids: dict = {}
        special = set(getattr(tokenizer, "all_special_tokens", ())) - {tokenizer.pad_token}
        self._special_tokens = tuple(t for t in special if t)

    def template_state(self) -> str:
        """ "applied", "off" (the tokenizer has one, turned off) or "none" (it has none)."""
        if self.use_template:
            return "applied"
        return "off" if self.has_template else "none"

    def __call__(self, prompt: Prompt) -> list[int]:
        return self.render_all([prompt])[0]

    def render_all(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Each prompt's ids. The plain-text ones not seen before are tokenized in one call:
        on a small model a call per prompt costs more than the tokenizing."""
        keys = [prompt_key(prompt) for prompt in prompts]
        new = {
            key: prompt for key, prompt in zip(keys, prompts, strict=True) if key not in self._ids
        }
        plain = [key for key, prompt in new.items() if self._is_plain_text(prompt)]
        if plain:
            batch_ids = self.tokenizer([new[key] for key in plain]).input_ids
            self._ids.update(zip(plain, batch_ids, strict=True))
        for key, prompt in new.items():
            if key not in self._ids:
                self._ids[key] = self._render(prompt)
        return [self._ids[key] for key in keys]

    def _is_plain_text(self, prompt: Prompt) -> bool:
        """A string tokenized as it is: no template, no system prompt (see _render)."""
        return isinstance(prompt, str) and not self.use_template and self.system_prompt is None

    def _render(self, prompt: Prompt) -> list[int]:
        if self._already_rendered(prompt):
            return self.tokenizer(prompt, add_special_tokens=False).input_ids
        messages = self.messages(prompt)
        if self.use_template:
            # Tokenized by the template itself, which adds no second BOS to the text's own.
            return list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        if self._is_plain_text(prompt):
            return self.tokenizer(prompt).input_ids  # exactly what the tiny model was built on
        return self.tokenizer("\n\n".join(m["content"] for m in messages)).input_ids

    def _already_rendered(self, prompt: Prompt) -> bool:
        """auto only: a string holding the tokenizer's special tokens was rendered by its
        author, who put in the BOS and the turn markers it needs."""
        return (
            isinstance(prompt, str)
            and self.use_template
            and not self.explicit
            and any(token in prompt for token in self._special_tokens)
        )

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        messages = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else [{"role": m["role"], "content": m["content"]} for m in prompt]
        )
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages


def baseline_advice(
    baseline: float,
    real_model: bool,
    template: str,
    rewards: list[str],
    truncated: float,
    max_tokens: int,
) -> str | None:
    """The warning a baseline eval calls for, or None: at 0% with a real model, the likely
    causes (the prompt's rendering, the reward, max_tokens); at 80%+, little left to learn.
    template: "applied", "off" (the tokenizer has one, task.chat_template=false) or "none"."""
    if baseline >= 0.8:
        return f"Baseline eval reward is {baseline:.0%}: little left to learn, use harder problems"
    if baseline > 0.0:
        return None
    causes = []
    if real_model and template == "off":
        causes.append(
            "the chat template is off (task.chat_template=false) though the tokenizer has one: "
            "an instruct model given a bare prompt often ends at once"
        )
    if real_model and template == "none":
        causes.append(
            "the tokenizer has no chat template: a base model needs a prompt it can continue"
        )
    if truncated >= 0.5:
        causes.append(
            f"{truncated:.0%} of the completions hit max_tokens={max_tokens} before ending: "
            "raise max_tokens"
        )
    if real_model and "exact_match" in rewards:
        causes.append(
            "the reward exact_match wants the completion to be the answer alone, and a chat "
            "model writes sentences: try task.rewards=[last_number] (or boxed, math_verify)"
        )
    if not causes:
        causes.append("the task is likely too hard for this model")
    return "Baseline eval reward is 0%: " + "; ".join(causes)
