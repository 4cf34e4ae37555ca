"""The policy and the machinery that makes its passes fast: the `Policy` and its per-token
log-probs (policy, logprobs), packed sequences (packing), shared-prompt KV caches (kv_cache),
the merged LoRA copy the sampler decodes with (merged_lora), token-budget micro-batches
(micro_batches) and the `Rollout` a sampler returns and the policy collates (rollout). May
import trainer.base only. Nothing is imported here, so reading a rollout loads no torch.
"""
