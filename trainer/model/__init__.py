"""The policy and the machinery that makes its passes fast.

The contract the training step reads: the `Policy` and what its passes compute, in plain words
(policy), the rollouts as the tensors they take (token_batch), and the `Rollout` a sampler
returns (rollout). The same log-probs without the machinery, one plain forward
(plain_logprobs). The machinery, which the step never opens: the passes run fast
(fast_logprobs) in token-budget micro-batches (micro_batches), each prompt once, packed with
its rollouts (packing) or through a shared KV cache (kv_cache), the output layer in chunks
(logprobs), checkpointed activations (activation_checkpointing), the merged LoRA copy the
sampler and the learner run on (merged_lora), float32 linear layers through oneDNN where a
check on this host finds it faster and equal (cpu_linear, onednn_check), and the CPU threads
chosen for the model and for what else runs on the host (cpu_threads). May import
trainer.base only. Nothing is imported here, so reading a rollout loads no torch.
"""
