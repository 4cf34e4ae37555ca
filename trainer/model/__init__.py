"""The policy and the machinery that makes its passes fast: the `Policy` and its per-token
log-probs (policy, logprobs), packed sequences (packing), shared-prompt KV caches (kv_cache),
the merged LoRA copy the sampler decodes with (merged_lora), token-budget micro-batches
(micro_batches), float32 linear layers through oneDNN where a check on this host finds it
faster and equal (cpu_linear, onednn_check), and the `Rollout` a sampler returns and the
policy collates (rollout); the same log-probs without the machinery, one plain forward
(plain_logprobs). May import
trainer.base only. Nothing is imported here, so reading a rollout loads no torch.
"""
