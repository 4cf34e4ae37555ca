"""The GRPO algorithm, to read in one place: the shared training step (step), the sync, stream
and async pipelines around it (pipelines, with their settings in pipeline_settings), the losses
(losses) and advantages, KL and minibatch arithmetic (rl_math). Of trainer/model it reads only
the policy's contract: `Policy` (trainer/model/policy.py), `collate` and `TokenBatch`
(trainer/model/token_batch.py) and `Rollout` (trainer/model/rollout.py), never the machinery
behind it (tests/test_import_graph.py holds it so). The health rules a run is checked by are
trainer/run/health/, beside the loop that applies them. May import trainer.base,
trainer.model, trainer.env and trainer.sampling.
"""
