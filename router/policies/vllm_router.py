"""vllm_router: the real vLLM Router's ``cache_aware`` policy (the baseline users run).

What vllm-router 0.1.17 (PyPI ``vllm-router``, read in its sdist: ``src/policies/
cache_aware.rs``, ``src/tree.rs``, ``src/routers/http/router.rs``,
``src/backend/preprocess.rs``) does with one ``/v1/completions`` or chat request, and where
it is here. ``match_rule`` picks between the two selection paths that release has:

``per_worker`` (default; the HTTP router's path for cache_aware, ``select_prepared``):

1. The router asks every worker to tokenize the prompt (``/v1/completions/render``, else
   ``/tokenize`` but only when render is absent; one second for all) and keys the tree by
   the token ids. If any healthy worker gave no tokens, the request goes to the
   least-loaded worker (``missing_tokens``). vLLM refuses render (403) unless started
   with ``--enable-scale-out``, so with vLLM's defaults *every* request takes that branch
   (measured by ``bench.router_real`` from the router's own counters). Such a placement
   teaches the tree nothing (the router had no key to insert). The simulator has
   the tokens (its synthesised text stands for them); ``missing_tokens_share`` of requests
   take the branch at random (default 0, the engines started with scale-out), or, to
   mimic one measured run, the first request decided at or after each of
   ``missing_tokens_at_s`` (``bench.router_real`` passes the times the real router took
   the branch: they come in bursts, when a busy engine's frontend stalls, which a uniform
   share does not reproduce).
2. **Load** is in-flight requests per *healthy* worker. **Imbalance**: ``(max - min) >
   balance_abs_threshold`` AND ``max > min * balance_rel_threshold``.
3. Each healthy worker's own match: how far the text goes into the tree along nodes that
   worker was sent (``prefix_match_tenant_char_count``), over the text's length. If not
   imbalanced and the best rate is above ``cache_threshold``, the least-loaded worker among
   those with the best rate; otherwise the least-loaded worker of all (first in order on
   ties). No session key is read on this path.

``tree_owner`` (``select_worker_with_headers``, the legacy path, and earlier releases):
load over every worker; a session seen before goes back to its worker (``session_affinity``);
else one match in the union tree, and if its rate is above ``cache_threshold`` the tenant
that *created* the deepest matched node, else the least-loaded worker.

Both: the chosen worker's tree learns the text at routing time; the tree is never told
about engine-side evictions or cache resets (KV events are ignored). Each worker's share
of the tree is bounded to ``max_tree_size`` characters by LRU-leaf eviction every
``eviction_interval_s``, counted from the policy's first call.

A differential test (``tests/router/test_vllm_router_differential.py``) replays one
scripted request sequence through the installed ``vllm-router`` in front of fake engines
that tokenize, and through this policy, and compares every placement.

Command-line defaults (``vllm-router --help``, 0.1.17): cache_threshold 0.3,
balance_abs_threshold 64, balance_rel_threshold 1.5, eviction interval 120 s, max tree
size 33,554,432. Written for this project from reading that source; no code is shared.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from router.policies.approx_tree import ApproxPrefixTree
from router.policies.base import (
    Admit,
    ClusterView,
    Decision,
    Event,
    Hold,
    InstanceView,
    PolicyStats,
    Request,
)
from router.policies.placement import least_loaded


@dataclass(frozen=True)
class VllmRouterConfig:
    """Options of vllm_router; defaults are vllm-router 0.1.17's command line."""

    cache_threshold: float = 0.3
    """``--cache-threshold``: follow the tree only when more than 30% of the text matched."""
    balance_abs_threshold: int = 64
    """``--balance-abs-threshold``: an in-flight gap of up to 64 requests is not imbalance."""
    balance_rel_threshold: float = 1.5
    """``--balance-rel-threshold``: ... nor is a max load up to 1.5x the min load."""
    eviction_interval_s: float = 120.0
    """``--eviction-interval-secs``: period of the tree's LRU eviction."""
    max_tree_size: int = 33_554_432
    """``--max-tree-size``: characters per worker in the tree (also the session-map bound)."""
    match_rule: str = "per_worker"
    """``per_worker`` (0.1.17's HTTP path) or ``tree_owner`` (the legacy path); module docstring."""
    session_affinity: bool = False
    """``tree_owner`` only: route a known ``X-Session-Id`` to its worker (the legacy path of
    earlier releases); 0.1.17's HTTP path reads no session key."""
    missing_tokens_share: float = 0.0
    """``per_worker`` only: share of requests whose tokens some worker did not return in
    time, placed on the least-loaded worker (chosen at random, seeded)."""
    missing_tokens_at_s: tuple[float, ...] = ()
    """``per_worker`` only: times (s, the caller's clock) at which the next request decided
    takes the ``missing_tokens`` branch, one request per entry (a measured run's times)."""
    seed: int = 0
    """Seed of the ``missing_tokens_share`` draws."""
    session_ttl_s: float = 3600.0
    """``SESSION_ENTRY_TTL_SECS``: a session entry untouched this long is dropped at eviction."""
    no_healthy_recheck_s: float = 1.0
    """Hold delay when no worker is healthy (the real router answers 503): a probe period."""

    def __post_init__(self) -> None:
        if self.match_rule not in ("per_worker", "tree_owner"):
            raise ValueError(f"match_rule must be 'per_worker' or 'tree_owner', got {self.match_rule!r}")
        if not 0.0 <= self.missing_tokens_share <= 1.0:
            raise ValueError(f"missing_tokens_share must be in [0, 1], got {self.missing_tokens_share}")
        times = tuple(float(t) for t in self.missing_tokens_at_s)
        if any(not (math.isfinite(t) and t >= 0) for t in times):
            raise ValueError(f"missing_tokens_at_s must be finite times >= 0, got {self.missing_tokens_at_s}")
        if times and self.missing_tokens_share > 0:
            raise ValueError("give missing_tokens_share or missing_tokens_at_s, not both")
        object.__setattr__(self, "missing_tokens_at_s", tuple(sorted(times)))
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 0:
            raise ValueError("balance_abs_threshold and balance_rel_threshold must be >= 0")
        if min(self.eviction_interval_s, self.session_ttl_s, self.no_healthy_recheck_s) <= 0 or self.max_tree_size < 1:
            raise ValueError("eviction_interval_s, session_ttl_s, no_healthy_recheck_s and max_tree_size must be > 0")


class VllmRouterPolicy:
    """vllm-router's cache_aware placement (module docstring); holds only when no worker is healthy.

    ``decisions`` counts the branches: with ``per_worker`` by the real router's labels of
    ``vllm_router_prefix_routing_decisions_total`` (load_imbalance, prefix_hit, prefix_miss,
    missing_tokens); with ``tree_owner`` load_balance, session_id_match, full_history_match,
    full_history_low_match, cache_affinity, low_match_min_load, stale_tenant_fallback,
    first_healthy_fallback, empty_history_min_load.
    """

    name = "vllm_router"
    needs_prompt_text = True
    """The transport must fill ``Request.prompt_text`` (the simulator synthesises it)."""

    def __init__(self, config: VllmRouterConfig | None = None) -> None:
        self.config = config or VllmRouterConfig()
        self.stats = PolicyStats()
        self.tree = ApproxPrefixTree(lru="vllm_router")
        self.sessions: dict[str, tuple[str, float]] = {}  # session id -> (instance, last access s)
        self.decisions: dict[str, int] = {}
        self._next_eviction_s: float | None = None
        self._rng = random.Random(self.config.seed)
        self._missing_next = 0  # index of the next unused entry of missing_tokens_at_s

    # ------------------------------------------------------------------ decide
    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Admit where ``match_rule`` places it (module docstring); Hold only with no healthy worker."""
        self._maybe_evict(now)
        healthy = view.healthy()
        if not healthy:
            self.stats.holds += 1
            return Hold(self.config.no_healthy_recheck_s, reason="no healthy instance")
        text = request.prompt_text
        if self.config.match_rule == "per_worker":
            chosen, decision = self._per_worker(text, healthy, now)
        else:
            chosen, decision = self._tree_owner(request, view, healthy, now)
        if text and decision != "missing_tokens":  # select_prepared returns before it inserts
            self.tree.insert(text, chosen.instance)
        self.decisions[decision] = self.decisions.get(decision, 0) + 1
        self.stats.admits += 1
        return Admit(chosen.instance, reason=decision)

    def _tree_owner(self, request: Request, view: ClusterView, healthy: tuple[InstanceView, ...],
                    now: float) -> tuple[InstanceView, str]:
        """The legacy path: imbalance over every worker, the session's worker, or the tree's owner."""
        cfg = self.config
        loads = [v.in_flight for v in view.instances]  # every worker, as cache_aware.rs
        max_load, min_load = max(loads), min(loads)
        session_keyed = cfg.session_affinity and bool(request.session_id)
        if max_load - min_load > cfg.balance_abs_threshold and max_load > min_load * cfg.balance_rel_threshold:
            chosen, decision = least_loaded(healthy), "load_balance"
        elif session_keyed:
            chosen, decision = self._by_session(request.session_id, request.prompt_text, healthy)
        else:
            chosen, decision = self._probe(request.prompt_text, healthy, "cache_affinity", "low_match_min_load",
                                           "first_healthy_fallback")
        if session_keyed:
            self.sessions[request.session_id] = (chosen.instance, now)
        return chosen, decision

    def _per_worker(self, text: str, healthy: tuple[InstanceView, ...], now: float) -> tuple[InstanceView, str]:
        """0.1.17's ``select_prepared``: each healthy worker's own match rate; the least-loaded
        worker among the best-rate ones when balanced and above ``cache_threshold``, else
        among all."""
        cfg = self.config
        due = cfg.missing_tokens_at_s
        if self._missing_next < len(due) and due[self._missing_next] <= now:
            self._missing_next += 1
            return least_loaded(healthy), "missing_tokens"
        if cfg.missing_tokens_share > 0 and self._rng.random() < cfg.missing_tokens_share:
            return least_loaded(healthy), "missing_tokens"
        loads = [v.in_flight for v in healthy]  # healthy workers only, on this path
        max_load, min_load = max(loads), min(loads)
        if max_load - min_load > cfg.balance_abs_threshold and max_load > min_load * cfg.balance_rel_threshold:
            return least_loaded(healthy), "load_imbalance"
        matched = self.tree.match(text) if text else {}
        rates = {v.instance: matched.get(v.instance, 0) / len(text) if text else 0.0 for v in healthy}
        best = max(rates.values())
        if best > cfg.cache_threshold:
            return least_loaded([v for v in healthy if rates[v.instance] == best]), "prefix_hit"
        return least_loaded(healthy), "prefix_miss"

    def _by_session(self, session_id: str, text: str, healthy: tuple[InstanceView, ...]) -> tuple[InstanceView, str]:
        entry = self.sessions.get(session_id)
        if entry is not None:
            hit = next((v for v in healthy if v.instance == entry[0]), None)
            if hit is not None:
                return hit, "session_id_match"
            del self.sessions[session_id]  # its worker is gone: probe the history instead
        if not text:
            return least_loaded(healthy), "empty_history_min_load"
        return self._probe(text, healthy, "full_history_match", "full_history_low_match", "stale_tenant_fallback")

    def _probe(self, text: str, healthy: tuple[InstanceView, ...], match: str, low: str,
               stale: str) -> tuple[InstanceView, str]:
        """The tree's pick when match_rate > cache_threshold, else the least-loaded worker."""
        tenant, matched = self.tree.prefix_match(text)
        rate = matched / len(text) if text else 0.0
        if rate <= self.config.cache_threshold or tenant is None:
            return least_loaded(healthy), low
        hit = next((v for v in healthy if v.instance == tenant), None)
        if hit is not None:
            return hit, match
        self.tree.remove_tenant(tenant)  # a stale worker: forget it, take the first healthy one
        return healthy[0], stale

    # ------------------------------------------------------------------ timer
    def _maybe_evict(self, now: float) -> None:
        if self._next_eviction_s is None:
            self._next_eviction_s = now + self.config.eviction_interval_s
        elif now >= self._next_eviction_s:
            cfg = self.config
            self.tree.evict(cfg.max_tree_size)
            live = {s: e for s, e in self.sessions.items() if e[1] >= now - cfg.session_ttl_s}
            if len(live) > cfg.max_tree_size:
                keep = sorted(live.items(), key=lambda kv: kv[1][1])[len(live) - cfg.max_tree_size:]
                live = dict(keep)
            self.sessions = live
            self._next_eviction_s = now + cfg.eviction_interval_s

    def observe(self, event: Event) -> None:
        """Only the clock (the eviction timer): the real router sees no KV events or resets."""
        self._maybe_evict(event.now)

    def state(self) -> dict:
        """Decision counts by branch, tree sizes, session-map size."""
        sizes = self.tree.tenant_sizes_chars()
        return {
            "policy": self.name,
            "admits": self.stats.admits,
            "holds": self.stats.holds,
            "decisions": dict(self.decisions),
            "tree_chars": sizes,
            "sessions": len(self.sessions),
            "ledger_sizes": {"tree_chars": sum(sizes.values()), "sessions": len(self.sessions)},
        }
