"""Per-token log-probs and entropy without a tokens x vocabulary tensor at once.

A real model's output layer is wide (SmolLM2: 49,152 tokens): the logits of a step's 16k
completion tokens take 3 GiB in float32, and the log-softmax, its backward and the entropy as
much again each. Here the output layer runs on the final hidden states a chunk of tokens at a
time (`ChunkLogprobs`): the forward keeps each token's log-prob and the chunk's logsumexp, and
the backward computes the chunk's logits again and turns them into their gradient in place
(softmax minus the chosen token), so memory holds one chunk's logits whatever the number of
tokens, and each logit is touched a few times, not once per autograd node.

Tensors of at most one chunk (the tiny model's whole batch) take the plain path, one
log_softmax over the logits, exactly the arithmetic the trainer has always used.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from trainer.model.cpu_linear import OneDNNLinear, linear

# Logits one chunk holds: 64 MiB in float32 (1,365 tokens of a 49,152-token vocabulary).
CHUNK_ELEMENTS = 1 << 24
# Model families whose logits are exactly output_layer(final hidden state): nothing (a logit
# scale, a soft cap) comes after it, so the output layer can run here, in chunks.
PLAIN_HEAD_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def token_entropy(logits_NTV: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution, in nats."""
    logp_NTV = torch.log_softmax(logits_NTV.float(), dim=-1)
    return -(logp_NTV.exp() * logp_NTV).sum(dim=-1)


def fits_one_chunk(tokens: int, vocab_size: int) -> bool:
    return tokens * vocab_size <= CHUNK_ELEMENTS


def plain_output_layer(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The output layer when the model's logits are exactly hidden @ weight^T (a plain Linear
    without bias, in a family that adds nothing after it); else None, and the model's own
    logits are scored, still in chunks."""
    head = model.get_output_embeddings()
    plain = type(head) in (torch.nn.Linear, OneDNNLinear) and head.bias is None
    return head if plain and model.config.model_type in PLAIN_HEAD_FAMILIES else None


def scored(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Tempered logits; bfloat16 ones are scored in float32, float64 stays float64. At
    temperature 1 float32 logits are returned as they are: dividing by one would copy them."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits if temperature == 1 else logits / temperature


def logprobs_from_logits(
    logits_NTV: torch.Tensor, ids_NT: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain path: one log_softmax over every position's full distribution."""
    logits_NTV = scored(logits_NTV, temperature)
    logp_NTV = torch.log_softmax(logits_NTV, dim=-1)
    logp_NT = logp_NTV.gather(-1, ids_NT[..., None])[..., 0]
    entropy_NT = token_entropy(logits_NTV.detach()) if with_entropy else None
    return logp_NT, entropy_NT


def chunked_logprobs(
    features_NTF: torch.Tensor,
    ids_NT: torch.Tensor,
    temperature: float,
    weight_VF: torch.Tensor | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each token in ids_NT (and each position's entropy), a chunk of positions at
    a time. features_NTF are hidden states when weight_VF (the output layer's) is given, else
    the logits themselves."""
    num_rows, steps, width = features_NTF.shape
    vocab_size = width if weight_VF is None else weight_VF.shape[0]
    flat_KF, ids_K = features_NTF.reshape(-1, width), ids_NT.reshape(-1)
    rows = max(1, CHUNK_ELEMENTS // vocab_size)
    logp, entropy = [], []
    for start in range(0, len(ids_K), rows):
        logp_K, entropy_K = ChunkLogprobs.apply(
            flat_KF[start : start + rows],
            weight_VF,
            ids_K[start : start + rows],
            temperature,
            with_entropy,
        )
        logp.append(logp_K)
        entropy.append(entropy_K)
    logp_NT = torch.cat(logp).view(num_rows, steps)
    entropy_NT = torch.cat(entropy).view(num_rows, steps) if with_entropy else None
    return logp_NT, entropy_NT


class ChunkLogprobs(torch.autograd.Function):
    """One chunk: log p(token) = logit[token] - logsumexp(logits), with the entropy beside it
    (a statistic, no gradient). Saved for the backward: the chunk's inputs and its logsumexp,
    not its logits; d log p / d logits = (onehot(token) - softmax) / temperature."""

    @staticmethod
    def forward(ctx, features_KF, weight_VF, ids_K, temperature, with_entropy):
        logits_KV = _logits(features_KF, weight_VF, temperature)
        logp_KV = torch.log_softmax(logits_KV, dim=-1)
        logp_K = logp_KV.gather(-1, ids_K[:, None])[:, 0]
        lse_K = logits_KV.gather(-1, ids_K[:, None])[:, 0] - logp_K
        del logits_KV  # one chunk-sized tensor fewer while the entropy is summed
        entropy_K = None
        if with_entropy:  # -sum p log p, not logsumexp - E_p[logit], whose two large terms
            # cancel to float32's cost (and not a bmm, which sums less exactly on a CPU)
            entropy_K = -logp_KV.exp().mul_(logp_KV).sum(-1)
            ctx.mark_non_differentiable(entropy_K)
        ctx.save_for_backward(features_KF, weight_VF, ids_K, lse_K)
        ctx.temperature = temperature
        return logp_K, entropy_K

    @staticmethod
    @once_differentiable  # the backward's own graph is not kept: no second derivative
    def backward(ctx, grad_logp_K, _grad_entropy_K):
        features_KF, weight_VF, ids_K, lse_K = ctx.saved_tensors
        with torch.no_grad():
            logits_KV = _logits(features_KF, weight_VF, ctx.temperature)
            if logits_KV.data_ptr() == features_KF.data_ptr():  # the logits are the input
                logits_KV = logits_KV.clone()
            # In place, one buffer: softmax, then -grad * softmax, then + grad at the token.
            grad_KV = logits_KV.sub_(lse_K[:, None]).exp_().mul_(-grad_logp_K[:, None])
            grad_KV.scatter_add_(-1, ids_K[:, None], grad_logp_K[:, None])
            if ctx.temperature != 1:
                grad_KV.div_(ctx.temperature)
            grad_features = grad_weight = None
            if weight_VF is None:
                grad_features = grad_KV.to(features_KF.dtype)
            else:
                grad_KV = grad_KV.to(weight_VF.dtype)
                if ctx.needs_input_grad[0]:  # grad W, a linear layer of weight W^T
                    grad_features = linear(grad_KV, weight_VF.T)
                if ctx.needs_input_grad[1]:
                    grad_weight = grad_KV.T @ features_KF
        return grad_features, grad_weight, None, None, None


def _logits(
    features_KF: torch.Tensor, weight_VF: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    return scored(features_KF if weight_VF is None else linear(features_KF, weight_VF), temperature)
