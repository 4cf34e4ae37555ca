"""vLLM sampling on a GPU (`pip install .[vllm]`, `sampler=vllm`); imported only when asked for.

The engine serves the frozen base model; each step the trainer's LoRA adapter is written to a
fresh directory and handed to vLLM as a new LoRARequest, so sampling always uses the current
policy. Log-probs are vLLM's processed ones (after temperature), matching TorchSampler's
log_softmax(logits / temperature). Full fine-tuning (lora_rank=0) is not supported here: it
would need the engine's weights replaced every step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from trainer.base.errors import ConfigError
from trainer.env.prompts import Prompt, PromptRenderer
from trainer.model.rollout import Rollout
from trainer.sampling.model_source import model_path
from trainer.sampling.protocol import SamplingSettings


class VLLMSampler:
    def __init__(self, policy, cfg, renderer: PromptRenderer) -> None:
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(
                "sampler.name='vllm': vllm is not installed (pip install .[vllm])"
            ) from e
        if not policy.uses_lora:
            raise ConfigError("sampler.name='vllm': needs LoRA (lora_rank > 0)")
        self.policy = policy
        self.renderer = renderer
        self.llm = LLM(
            model=model_path(cfg),
            dtype=cfg.model.dtype,
            enable_lora=True,
            max_lora_rank=max(8, cfg.lora_rank),
            gpu_memory_utilization=cfg.sampler.gpu_memory_utilization,
            seed=cfg.seed,
            logprobs_mode="processed_logprobs",
        )
        self._adapters = tempfile.TemporaryDirectory(prefix="vllm-lora-")
        self._version = 0
        self._lora = None

    def sync_weights(self) -> None:
        from vllm.lora.request import LoRARequest

        self._version += 1
        path = Path(self._adapters.name) / f"v{self._version}"
        self.policy.model.save_pretrained(path)
        self._lora = LoRARequest(f"policy-v{self._version}", self._version, str(path))

    def sample(self, prompts: list[Prompt], settings: SamplingSettings) -> list[Rollout]:
        from vllm import SamplingParams

        if self._lora is None:
            self.sync_weights()
        params = SamplingParams(
            temperature=0.0 if settings.greedy else settings.temperature,  # 0: vLLM's greedy
            top_p=settings.top_p,
            top_k=settings.top_k or -1,
            min_p=settings.min_p,
            repetition_penalty=settings.repetition_penalty,
            max_tokens=settings.max_tokens,
            logprobs=0,  # the sampled token's log-prob only
        )
        tok = self.policy.tokenizer
        prompt_ids = self.renderer.render_all(prompts)
        requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
        outputs = self.llm.generate(requests, params, lora_request=self._lora, use_tqdm=False)
        rollouts = []
        for ids, out in zip(prompt_ids, outputs, strict=True):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            logps = [
                step[token].logprob for token, step in zip(tokens, completion.logprobs, strict=True)
            ]
            # vLLM stops on the model's whole EOS list (its generation config) and says so;
            # "length" is a cut at max_tokens
            finished = completion.finish_reason == "stop"
            text = tok.decode(tokens, skip_special_tokens=True)
            rollouts.append(Rollout(ids, tokens, logps, finished, text))
        return rollouts
