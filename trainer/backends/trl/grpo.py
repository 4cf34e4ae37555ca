"""TRL's GRPOTrainer with two additions: it trains on our prompt token ids, and it keeps what
the health rules' KLs need.

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
        self._learner_logps: torch.Tensor | None = None
        self._trained: list[tuple[dict, torch.Tensor]] = []  # this step's (batch, learner logps)
        super().__init__(*args, **kwargs)

    def _tokenize_prompts(self, prompts: list):
        return [list(self.our_prompt_ids[prompt_key(p)]) for p in prompts], None, {}

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if kwargs.get("compute_entropy") and torch.is_grad_enabled():  # the loss's forward
            self._learner_logps = out[0].detach()
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.model.training and self._learner_logps is not None:
            self._trained.append((inputs, self._learner_logps))
            self._learner_logps = None
        return loss

    def step_kls(self, post_update: bool) -> dict[str, float]:
        """The KLs of the step of ours that just ended (every rank calls it: a reduction)."""
        trained, self._trained = self._trained, []
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
        totals = torch.zeros(3, device=self.accelerator.device)
        for before, after, inputs in pairs:
            mask = inputs["completion_mask"].float()
            tokens = mask.sum()
            v1, v2 = rl_math.kl_sample_train(before, after, mask)
            totals += torch.stack([v1 * tokens, v2 * tokens, tokens])
        totals = self.accelerator.reduce(totals, reduction="sum")
        tokens = totals[2].clamp(min=1)
        return {v1_name: (totals[0] / tokens).item(), v2_name: (totals[1] / tokens).item()}

    @torch.no_grad()
    def _post_logps(self, inputs: dict) -> torch.Tensor:
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = super()._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, completion_ids.size(1)
            )
        return logps


def sampler_logps(inputs: dict) -> torch.Tensor | None:
    """The log-probs the rollouts were sampled with, where TRL keeps them."""
    found = inputs.get("sampling_per_token_logps")
    return found if found is not None else inputs.get("old_per_token_logps")
