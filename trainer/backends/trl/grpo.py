"""TRL's GRPOTrainer with two additions: it trains on our prompt token ids, and it keeps what
the health rules' KLs need (`StepKLs`; `watch` keeps them on a user's own GRPOTrainer).

- Prompts: the dataset's `prompt` is the problem's, a string or messages
  (trainer/backends/trl/data.py); `_tokenize_prompts` returns the ids we rendered from it, so
  nothing is templated twice.
- KLs, from the log-probs the loss already computes (no extra forward): the sampler-vs-learner
  KL (kl_sample_train_v1/v2) wherever TRL keeps the sampler's log-probs (`old_per_token_logps`
  with num_substeps > 1, vLLM's `sampling_per_token_logps`); with num_substeps=1 and no vLLM,
  TRL reuses the learner's own log-probs, the KL would read exactly 0, and it is not reported.
  The post-update KL (kl_pre_post_v1/v2, `compute_post_kl`): one no-grad forward over the step's
  rollouts after its updates, against the sampler's log-probs, or on-policy against the
  learner's before the first update (the same numbers up to rounding), as ours.
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from records import metrics as metrics_names
from trainer.env.prompts import prompt_key
from trainer.rl import rl_math


class OurGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, prompt_ids: dict, **kwargs) -> None:
        self.our_prompt_ids = prompt_ids
        self.kls = StepKLs(self)
        super().__init__(*args, **kwargs)

    def _tokenize_prompts(self, prompts: list):
        return [list(self.our_prompt_ids[prompt_key(p)]) for p in prompts], None, {}

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.kls.saw_logps(out, kwargs)
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.kls.saw_loss(inputs)
        return loss

    def step_kls(self, post_update: bool) -> dict[str, float]:
        return self.kls.take(post_update)


def watch(trainer: GRPOTrainer) -> StepKLs:
    """The KLs of a user's own GRPOTrainer: its two methods wrapped on the instance as
    OurGRPOTrainer overrides them, nothing else changed."""
    kls = StepKLs(trainer)
    logps, loss = trainer._get_per_token_logps_and_entropies, trainer.compute_loss

    def watched_logps(*args, **kwargs):
        out = logps(*args, **kwargs)
        kls.saw_logps(out, kwargs)
        return out

    def watched_loss(model, inputs, *args, **kwargs):
        out = loss(model, inputs, *args, **kwargs)
        kls.saw_loss(inputs)
        return out

    trainer._get_per_token_logps_and_entropies = watched_logps
    trainer.compute_loss = watched_loss
    return kls


class StepKLs:
    """A step's batches and the learner's log-probs on them, kept as the loss computes them,
    and the KLs they give once the step's updates are done."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer
        self.learner_logps: torch.Tensor | None = None
        self.trained: list[tuple[dict, torch.Tensor]] = []  # this step's (batch, learner logps)

    def saw_logps(self, out, kwargs: dict) -> None:
        if kwargs.get("compute_entropy") and torch.is_grad_enabled():  # the loss's forward
            self.learner_logps = out[0].detach()

    def saw_loss(self, inputs: dict) -> None:
        if self.trainer.model.training and self.learner_logps is not None:
            self.trained.append((inputs, self.learner_logps))
            self.learner_logps = None

    def take(self, post_update: bool) -> dict[str, float]:
        """The KLs of the step of ours that just ended (every rank calls it: a reduction)."""
        trained, self.trained = self.trained, []
        if not trained:
            return {}
        kls: dict[str, float] = {}
        sampled = [sampler_logps(inputs) for inputs, _ in trained]
        if all(s is not None for s in sampled):
            pairs = [(s, learner, i) for s, (i, learner) in zip(sampled, trained, strict=True)]
            kls.update(
                self._kl(pairs, metrics_names.KL_SAMPLE_TRAIN_V1, metrics_names.KL_SAMPLE_TRAIN_V2)
            )
        if post_update:
            pairs = []
            for s, (inputs, learner) in zip(sampled, trained, strict=True):
                pairs.append((learner if s is None else s, self._post_logps(inputs), inputs))
            kls.update(self._kl(pairs, metrics_names.KL_PRE_POST_V1, metrics_names.KL_PRE_POST_V2))
        return kls

    def _kl(self, pairs, v1_name: str, v2_name: str) -> dict[str, float]:
        """Token-weighted over every minibatch and rank, as rl_math.kl_sample_train on one."""
        accelerator = self.trainer.accelerator
        totals = torch.zeros(3, device=accelerator.device)
        for before, after, inputs in pairs:
            mask = inputs["completion_mask"].float()
            tokens = mask.sum()
            v1, v2 = rl_math.kl_sample_train(before, after, mask)
            totals += torch.stack([v1 * tokens, v2 * tokens, tokens])
        totals = accelerator.reduce(totals, reduction="sum")
        tokens = totals[2].clamp(min=1)
        return {v1_name: (totals[0] / tokens).item(), v2_name: (totals[1] / tokens).item()}

    @torch.no_grad()
    def _post_logps(self, inputs: dict) -> torch.Tensor:
        trainer = self.trainer
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(
            trainer.model, trainer.args.gradient_checkpointing_kwargs
        ):
            logps, _, _ = type(trainer)._get_per_token_logps_and_entropies(
                trainer, trainer.model, input_ids, attention_mask, completion_ids.size(1)
            )
        return logps


def sampler_logps(inputs: dict) -> torch.Tensor | None:
    """The log-probs the rollouts were sampled with, where TRL keeps them."""
    found = inputs.get("sampling_per_token_logps")
    return found if found is not None else inputs.get("old_per_token_logps")
