"""The GRPO algorithm, to read in one place: the shared training step (step), the sync, stream
and async pipelines around it (pipelines, with their settings in pipeline_settings), the losses
(losses), advantages, KL and minibatch arithmetic (rl_math) and the health rules that stop a
run going wrong (health). May import trainer.base, trainer.model, trainer.env and
trainer.sampling.
"""
