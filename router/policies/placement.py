"""Placement among instances that may take a request: load, prefix match, Eq. (1) cost.

Shared by cache_aware (placement only) and the admission policies, which place an
admitted request among the instances with admission headroom (MISA-T section 4.5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from router.policies.base import InstanceView


def least_loaded(candidates: Sequence[InstanceView]) -> InstanceView:
    """The candidate with the fewest in-flight requests (first in view order on ties)."""
    return min(candidates, key=lambda v: v.in_flight)


def longest_match_or_least_loaded(
    candidates: Sequence[InstanceView], matched: Mapping[str, int]
) -> tuple[InstanceView, bool]:
    """The candidate with the longest prefix match (ties: fewer in flight), else the least loaded.

    Args:
        candidates: instances that may take the request (non-empty).
        matched: matched prefix length per instance (blocks or chars; 0 or absent = none).

    Returns:
        (chosen instance, whether it was chosen for its prefix match).
    """
    best = max(candidates, key=lambda v: (matched.get(v.instance, 0), -v.in_flight))
    if matched.get(best.instance, 0) > 0:
        return best, True
    return least_loaded(candidates), False


def min_prefill_cost(
    candidates: Sequence[InstanceView],
    prompt_tokens: int,
    hit_tokens: Mapping[str, int],
    backlog_delay_s: Callable[[InstanceView], float],
    prefill_tokens_per_s: Callable[[InstanceView], float],
) -> InstanceView:
    """The candidate minimising c_w = d_w + (L_r - H_r,w) / mu_w  (MISA-T Eq. 1).

    Args:
        prompt_tokens: L_r, the request's prompt length in tokens.
        hit_tokens: H_r,w, reusable prefix tokens per instance.
        backlog_delay_s: d_w, estimated prefill backlog delay of an instance (s).
        prefill_tokens_per_s: mu_w, measured prefill throughput of an instance (tokens/s).
    """

    def cost(v: InstanceView) -> float:
        uncached = max(0, prompt_tokens - hit_tokens.get(v.instance, 0))
        return backlog_delay_s(v) + uncached / prefill_tokens_per_s(v)  # c_w = d_w + (L_r - H_r,w)/mu_w

    return min(candidates, key=cost)
