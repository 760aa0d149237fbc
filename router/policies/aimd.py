"""aimd: per-instance session cap driven by KV usage, additive increase / multiplicative decrease.

An admission anchor for the simulator's comparisons (experiment 4): the controller
prime-rl uses for rollout concurrency, moved to the router. Each instance w has a session
cap K_w. On every metric sample of w (at most once per ``interval_s``)::

    K_w <- max(min_cap, floor(beta * K_w))   if kv_usage > high_usage, or requests wait,
                                              or w preempted since the last sample
    K_w <- min(max_cap, K_w + alpha)         if kv_usage < low_usage
    (unchanged otherwise)

A request of a session already bound to an instance (a continuation) is admitted there
at once; a new session is admitted on an instance with |sessions| < K_w, chosen by the
longest prefix match (the prefix index, fed by KV events), else the least loaded; if none
has headroom it is held for ``recheck_s``. Without a metric sample the cap stays at
``initial_cap``.

``SessionBinding`` (session -> instance, active sessions per instance, prefix index) is
shared with ``tool_pause``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    InstanceView,
    MetricsSampled,
    PolicyStats,
    Request,
    RequestFinished,
    SessionEnded,
)
from router.policies.placement import longest_match_or_least_loaded
from router.prefix_index import PrefixIndex


class SessionBinding:
    """Which instance each open session is bound to, and where prefixes are cached."""

    def __init__(self) -> None:
        self.index = PrefixIndex()
        self.bound: dict[str, str] = {}
        self.active: dict[str, set[str]] = {}

    def instance_of(self, session_id: str, view: ClusterView) -> InstanceView | None:
        """The healthy instance ``session_id`` is bound to, or None."""
        inst = self.bound.get(session_id)
        if inst is None:
            return None
        for v in view.instances:
            if v.instance == inst and v.healthy:
                return v
        self.unbind(session_id)
        return None

    def sessions_on(self, instance: str) -> int:
        """Open sessions bound to ``instance``."""
        return len(self.active.get(instance, ()))

    def place(self, request: Request, candidates: list[InstanceView]) -> InstanceView:
        """Longest prefix match among ``candidates`` (non-empty), else the least loaded."""
        matched = self.index.longest_prefix_match(request.block_hashes) if request.block_hashes else {}
        return longest_match_or_least_loaded(candidates, matched)[0]

    def bind(self, session_id: str, instance: str) -> None:
        """Bind ``session_id`` to ``instance``."""
        self.bound[session_id] = instance
        self.active.setdefault(instance, set()).add(session_id)

    def unbind(self, session_id: str) -> None:
        """Forget ``session_id`` (it ended, or its instance went away)."""
        inst = self.bound.pop(session_id, None)
        if inst is not None:
            self.active[inst].discard(session_id)

    def observe(self, event: Event) -> None:
        """Keep the binding and the prefix index up to date."""
        if isinstance(event, BlocksStored):
            self.index.store(event.instance, event.block_hashes)
        elif isinstance(event, BlocksRemoved):
            self.index.remove(event.instance, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.index.clear(event.instance)
        elif isinstance(event, SessionEnded):
            self.unbind(event.session_id)
        elif isinstance(event, RequestFinished) and event.request.session_end:
            self.unbind(event.request.session_id)
        elif isinstance(event, InstanceHealthChanged) and not event.healthy:
            for s in list(self.active.get(event.instance, ())):
                self.unbind(s)


@dataclass(frozen=True)
class AimdConfig:
    """Options of aimd (defaults: the usual AIMD constants, KV targets below preemption)."""

    initial_cap: int = 16
    """Sessions per instance before the first adjustment (a cautious start)."""
    min_cap: int = 1
    """Lower bound on K_w: an instance always takes at least one new session."""
    max_cap: int = 4096
    """Upper bound on K_w (effectively none; the trainer's ceiling bounds it anyway)."""
    alpha: int = 1
    """Additive increase per healthy sample (TCP-like)."""
    beta: float = 0.7
    """Multiplicative decrease on overload (TCP CUBIC uses 0.7)."""
    high_usage: float = 0.92
    """KV usage above which the cap shrinks: vLLM starts preempting near full KV."""
    low_usage: float = 0.8
    """KV usage below which the cap grows: leaves room for running sessions' growth."""
    interval_s: float = 2.0
    """Least time between two adjustments of one instance (a few scrape periods)."""
    recheck_s: float = 0.5
    """Hold delay of a new session without headroom."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_cap <= self.initial_cap <= self.max_cap:
            raise ValueError("need 1 <= min_cap <= initial_cap <= max_cap")
        if self.alpha < 1 or not 0 < self.beta < 1:
            raise ValueError("alpha must be >= 1 and beta in (0, 1)")
        if not 0 < self.low_usage <= self.high_usage <= 1:
            raise ValueError("need 0 < low_usage <= high_usage <= 1")
        if self.interval_s < 0 or self.recheck_s <= 0:
            raise ValueError("interval_s must be >= 0 and recheck_s > 0 seconds")


class AimdPolicy:
    """Per-instance AIMD session cap on KV usage (see module docstring)."""

    name = "aimd"

    def __init__(self, config: AimdConfig | None = None) -> None:
        self.config = config or AimdConfig()
        self.stats = PolicyStats()
        self.sessions = SessionBinding()
        self.caps: dict[str, int] = {}
        self._last_adjust_s: dict[str, float] = {}
        self._last_preemptions: dict[str, float] = {}

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Continuation: its instance. New session: an instance under its cap, else Hold."""
        bound = self.sessions.instance_of(request.session_id, view)
        if bound is not None:
            self.stats.admits += 1
            return Admit(bound.instance, reason="continuation")
        cap = self.config.initial_cap
        open_ = [v for v in view.healthy() if self.sessions.sessions_on(v.instance) < self.caps.get(v.instance, cap)]
        if not open_:
            self.stats.holds += 1
            return Hold(self.config.recheck_s, reason="every instance at its AIMD cap")
        chosen = self.sessions.place(request, open_)
        self.sessions.bind(request.session_id, chosen.instance)
        self.stats.admits += 1
        return Admit(chosen.instance, reason="new session under cap")

    def observe(self, event: Event) -> None:
        """Adjust K_w on metric samples; track sessions and prefixes."""
        self.sessions.observe(event)
        if not isinstance(event, MetricsSampled):
            return
        cfg, w, m = self.config, event.instance, event.metrics
        last = self._last_adjust_s.get(w)
        if last is not None and event.now - last < cfg.interval_s:
            return
        self._last_adjust_s[w] = event.now
        preempted = m.num_preemptions_total > self._last_preemptions.get(w, m.num_preemptions_total)
        self._last_preemptions[w] = m.num_preemptions_total
        cap = self.caps.get(w, cfg.initial_cap)
        if m.kv_cache_usage > cfg.high_usage or m.num_requests_waiting > 0 or preempted:
            cap = max(cfg.min_cap, math.floor(cfg.beta * cap))
        elif m.kv_cache_usage < cfg.low_usage:
            cap = min(cfg.max_cap, cap + cfg.alpha)
        self.caps[w] = cap

    def state(self) -> dict:
        """Caps and open sessions per instance."""
        return {
            "policy": self.name, "admits": self.stats.admits, "holds": self.stats.holds,
            "caps": dict(self.caps),
            "sessions": {w: len(s) for w, s in self.sessions.active.items()},
        }
