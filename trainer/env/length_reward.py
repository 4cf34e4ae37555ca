"""A reward that can be gamed: a bonus for length, next to a correctness reward.

`task=addition_length` scores exact_match plus `length_bonus`: a long wrong completion earns
more than a short wrong one, so a policy can raise its training reward by padding its answers
while its held-out correctness (`eval/reward/exact_match`) falls: reward hacking for real, which
the recorded-curve library needs (bench/record_curves.py, bench/HEALTH.md).
"""

from __future__ import annotations

LENGTH_CAP = 8  # characters: the tiny model's max_tokens, where its character tokenizer stops


def length_bonus(problem, completion: str, finished: bool) -> float:
    """The trimmed completion's length over LENGTH_CAP, at most 1.0, right or wrong."""
    return min(len(completion.strip()), LENGTH_CAP) / LENGTH_CAP
