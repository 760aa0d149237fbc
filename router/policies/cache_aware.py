"""cache_aware: the vLLM Router's policy as it is today (placement only, no admission).

Load is in-flight requests per healthy instance (``InstanceView.in_flight``; an
unhealthy engine at load 0 would make a balanced pool look imbalanced and break prefix
affinity, the real router's bug vllm-project/router#254). When load is imbalanced, i.e.
``(max_load - min_load) > balance_abs_threshold`` AND
``max_load > min_load * balance_rel_threshold``, the request goes to the least-loaded
instance. Otherwise it goes to the instance with the longest prefix match if the match
rate (matched / request length) exceeds ``cache_threshold``, else to the least-loaded one.

Prefix matching, ``match_from``:
- ``text`` (as vLLM Router): an approximate radix tree over request text
  (:class:`~router.policies.approx_tree.ApproxPrefixTree`); the routed text is inserted
  on every admit; each instance's share is bounded to ``max_tree_size`` characters by
  LRU-leaf eviction every ``eviction_interval_s`` (run from ``decide``/``observe`` with
  the caller's clock, so the simulator gets the same behaviour).
- ``prefix_index``: the exact prefix index fed by KV events, on ``Request.block_hashes``
  (match rate = matched blocks / request blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.policies.approx_tree import ApproxPrefixTree
from router.policies.base import (
    Admit,
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    ClusterView,
    Decision,
    Event,
    Hold,
    InstanceHealthChanged,
    PolicyStats,
    Request,
)
from router.policies.placement import least_loaded
from router.prefix_index import PrefixIndex


@dataclass(frozen=True)
class CacheAwareConfig:
    """Options of cache_aware.

    The three thresholds default to the router library's own defaults (``impl Default for
    CacheAwareConfig``: 0.5 / 32 / 1.1), the values this project compares against; the
    installed ``vllm-router`` 0.1.17 *command line* defaults to 0.3 / 64 / 1.5, so recipes
    that launch the real program should pass the same values to both. The eviction
    timer and tree bound take the command line's defaults (the library's, 30 s and
    10,000 characters, are test-sized).
    """

    cache_threshold: float = 0.5
    """Follow the cache only when more than half the prompt is matched."""
    balance_abs_threshold: int = 32
    """An in-flight gap of up to 32 requests is not imbalance."""
    balance_rel_threshold: float = 1.1
    """... nor is a max load within 10% of the min load."""
    eviction_interval_s: float = 120.0
    """vllm-router 0.1.17 default (``--eviction-interval-secs``)."""
    max_tree_size: int = 33_554_432
    """vllm-router 0.1.17 default (``--max-tree-size``): characters per instance in the tree."""
    match_from: Literal["text", "prefix_index"] = "text"
    """``text``: vLLM Router's approximate tree; ``prefix_index``: exact KV-event index."""
    no_healthy_recheck_s: float = 1.0
    """Hold delay when no instance is healthy: about one health-probe period."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1.0")
        if self.eviction_interval_s <= 0 or self.max_tree_size < 1 or self.no_healthy_recheck_s <= 0:
            raise ValueError("eviction_interval_s, max_tree_size and no_healthy_recheck_s must be > 0")


class CacheAwarePolicy:
    """vLLM Router's cache_aware placement; never holds unless no instance is healthy."""

    name = "cache_aware"

    def __init__(self, config: CacheAwareConfig | None = None) -> None:
        self.config = config or CacheAwareConfig()
        self.stats = PolicyStats()
        self.tree = ApproxPrefixTree()
        self.index = PrefixIndex()
        self.decisions: dict[str, int] = {"load_balance": 0, "cache_affinity": 0, "low_match_min_load": 0}
        self._next_eviction_s: float | None = None

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Admit on the least-loaded instance (imbalance or low match) or the best-matching one."""
        self._maybe_evict(now)
        healthy = view.healthy()
        if not healthy:
            self.stats.holds += 1
            return Hold(self.config.no_healthy_recheck_s, reason="no healthy instance")
        loads = [v.in_flight for v in healthy]  # not the unhealthy ones (vllm-project/router#254)
        max_load, min_load = max(loads), min(loads)
        cfg = self.config
        if max_load - min_load > cfg.balance_abs_threshold and max_load > min_load * cfg.balance_rel_threshold:
            chosen, decision = least_loaded(healthy), "load_balance"
        else:
            matched, total = self._match(request)
            healthy_ids = {v.instance for v in healthy}
            matched = {w: m for w, m in matched.items() if w in healthy_ids}
            best = max(matched, key=matched.__getitem__, default=None)
            if best is not None and total > 0 and matched[best] / total > cfg.cache_threshold:
                chosen = next(v for v in healthy if v.instance == best)
                decision = "cache_affinity"
            else:
                chosen, decision = least_loaded(healthy), "low_match_min_load"
        if cfg.match_from == "text":
            self.tree.insert(request.prompt_text, chosen.instance, now)
        self.decisions[decision] += 1
        self.stats.admits += 1
        return Admit(chosen.instance, reason=decision)

    def _match(self, request: Request) -> tuple[dict[str, int], int]:
        if self.config.match_from == "text":
            return self.tree.match(request.prompt_text), len(request.prompt_text)
        return self.index.longest_prefix_match(request.block_hashes), len(request.block_hashes)

    def _maybe_evict(self, now: float) -> None:
        if self._next_eviction_s is None:
            self._next_eviction_s = now + self.config.eviction_interval_s
        elif now >= self._next_eviction_s:
            self.tree.evict(self.config.max_tree_size)
            self._next_eviction_s = now + self.config.eviction_interval_s

    def observe(self, event: Event) -> None:
        """Feed KV events to the prefix index; forget an unhealthy instance's text tree."""
        self._maybe_evict(event.now)
        if isinstance(event, BlocksStored):
            self.index.store(event.instance, event.block_hashes)
        elif isinstance(event, BlocksRemoved):
            self.index.remove(event.instance, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.index.clear(event.instance)
            self.tree.remove_tenant(event.instance)
        elif isinstance(event, InstanceHealthChanged) and not event.healthy:
            self.tree.remove_tenant(event.instance)

    def state(self) -> dict:
        """Decision counts by branch, tree and index sizes."""
        return {
            "policy": self.name,
            "admits": self.stats.admits,
            "holds": self.stats.holds,
            "decisions": dict(self.decisions),
            "tree_chars": self.tree.tenant_sizes_chars(),
            "prefix_index": self.index.state(),
            "ledger_sizes": {"prefix_index_blocks": len(self.index), "tree_chars": sum(self.tree.tenant_sizes_chars().values())},
        }
