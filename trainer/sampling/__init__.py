"""How rollouts are drawn, and where the policy comes from: the `Sampler` protocol and its
settings (protocol), the in-process sampler (torch_sampler), the vLLM one (vllm_sampler, the
GPU extra, imported only when asked for), the factory that picks one by `sampler.name`
(factory), and the model the policy loads (model_source, with the embedded tiny model it
builds on first use: tiny_model). The model source sits here, not in trainer.model, because
building the tiny model samples from it on an addition task and vLLM's engine loads the same
directory. May import trainer.base, trainer.model and trainer.env.
"""
