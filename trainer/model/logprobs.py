"""Per-token log-probs and entropy without a tokens x vocabulary tensor at once.

A real model's output layer is wide (SmolLM2: 49,152 tokens): the logits of a step's 16k
completion tokens take 3 GiB in float32, and the log-softmax, its backward and the entropy as
much again each. Here the output layer runs on the final hidden states a chunk of tokens at a
time, each chunk's log-prob is a selective log-softmax (the chosen logit minus the logsumexp),
and `torch.utils.checkpoint` keeps only the chunk's inputs for the backward, where the chunk's
logits are computed again: memory holds one chunk's logits, whatever the number of tokens.

Tensors of at most one chunk (the tiny model's whole batch) take the plain path, one
log_softmax over the logits, exactly the arithmetic the trainer has always used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

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
    plain = type(head) is torch.nn.Linear and head.bias is None
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
    differentiable = torch.is_grad_enabled() and (
        flat_KF.requires_grad or (weight_VF is not None and weight_VF.requires_grad)
    )
    rows = max(1, CHUNK_ELEMENTS // vocab_size)
    logp, entropy = [], []
    for start in range(0, len(ids_K), rows):
        args = (flat_KF[start : start + rows], weight_VF, ids_K[start : start + rows])
        if differentiable:  # keep the chunk's inputs, not its logits, for the backward
            out = checkpoint(_chunk, *args, temperature, with_entropy, use_reentrant=False)
        else:
            out = _chunk(*args, temperature, with_entropy)
        logp.append(out[0])
        entropy.append(out[1])
    logp_NT = torch.cat(logp).view(num_rows, steps)
    entropy_NT = torch.cat(entropy).view(num_rows, steps) if with_entropy else None
    return logp_NT, entropy_NT


def _chunk(
    features_KF: torch.Tensor,
    weight_VF: torch.Tensor | None,
    ids_K: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits_KV = features_KF if weight_VF is None else F.linear(features_KF, weight_VF)
    logits_KV = scored(logits_KV, temperature)
    lse_K = torch.logsumexp(logits_KV, dim=-1)
    logp_K = logits_KV.gather(-1, ids_K[:, None])[:, 0] - lse_K
    entropy_K = None
    if with_entropy:  # a statistic: no gradient. -sum p log p, not logsumexp - E_p[logit],
        with torch.no_grad():  # whose two large terms cancel to float32's cost
            logp_KV = logits_KV.detach() - lse_K.detach()[:, None]
            entropy_K = -(logp_KV.exp() * logp_KV).sum(-1)
    return logp_K, entropy_K
