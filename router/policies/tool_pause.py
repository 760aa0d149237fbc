"""tool_pause: pause agent sessions at tool boundaries under KV pressure (ThunderAgent-style).

An admission anchor for the simulator's comparisons (experiment 4). ThunderAgent
schedules agentic programs as units and, under memory pressure, pauses whole programs
at tool-call boundaries instead of letting the engine thrash. At the router:

- a *new* session is admitted only on an instance whose last sample shows KV usage below
  ``admit_usage`` and no waiting requests (longest prefix match among those, else least
  loaded); otherwise it is held;
- a *continuation* (the session's next turn, i.e. it is at a tool boundary) goes to its
  instance unless that instance's KV usage is above ``pause_usage``: then the session is
  paused (held) and resumed when usage falls, so running turns can finish.
  ``pause_usage`` > ``admit_usage``: new work stops before paused work does.
- without a fresh sample (older than ``metrics_stale_s``) it degrades to admitting
  continuations and holding new sessions (conservative).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.policies.aimd import SessionBinding
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


@dataclass(frozen=True)
class ToolPauseConfig:
    """Options of tool_pause."""

    admit_usage: float = 0.85
    """New sessions only below this KV usage: leaves room for admitted sessions to grow."""
    pause_usage: float = 0.95
    """Continuations pause above this KV usage: near full, vLLM would preempt."""
    metrics_stale_s: float = 10.0
    """A sample older than this is not trusted (about ten scrape periods)."""
    recheck_s: float = 0.5
    """Hold delay of a held new session or a paused continuation."""

    def __post_init__(self) -> None:
        if not 0 < self.admit_usage <= self.pause_usage <= 1:
            raise ValueError("need 0 < admit_usage <= pause_usage <= 1")
        if self.metrics_stale_s <= 0 or self.recheck_s <= 0:
            raise ValueError("metrics_stale_s and recheck_s must be > 0 seconds")


class ToolPausePolicy:
    """KV-usage admission plus pausing at tool boundaries (see module docstring)."""

    name = "tool_pause"

    def __init__(self, config: ToolPauseConfig | None = None) -> None:
        self.config = config or ToolPauseConfig()
        self.stats = PolicyStats()
        self.sessions = SessionBinding()
        self.pauses = 0

    def _usage(self, v: InstanceView) -> float | None:
        if v.metrics is None or v.metrics_age_s is None or v.metrics_age_s > self.config.metrics_stale_s:
            return None
        return v.metrics.kv_cache_usage

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Continuation: its instance unless paused. New session: an instance below ``admit_usage``."""
        cfg = self.config
        bound = self.sessions.instance_of(request.session_id, view)
        if bound is not None:
            usage = self._usage(bound)
            if usage is not None and usage > cfg.pause_usage:
                self.pauses += 1
                self.stats.holds += 1
                return Hold(cfg.recheck_s, reason="paused at tool boundary: KV pressure")
            self.stats.admits += 1
            return Admit(bound.instance, reason="continuation")
        open_ = []
        for v in view.healthy():
            usage = self._usage(v)
            if usage is not None and usage < cfg.admit_usage and v.metrics.num_requests_waiting == 0:
                open_.append(v)
        if not open_:
            self.stats.holds += 1
            return Hold(cfg.recheck_s, reason="no instance below admit_usage")
        chosen = self.sessions.place(request, open_)
        self.sessions.bind(request.session_id, chosen.instance)
        self.stats.admits += 1
        return Admit(chosen.instance, reason="new session")

    def observe(self, event: Event) -> None:
        """Track sessions and prefixes."""
        self.sessions.observe(event)

    def state(self) -> dict:
        """Decision counts, pauses, open sessions per instance."""
        return {
            "policy": self.name, "admits": self.stats.admits, "holds": self.stats.holds, "pauses": self.pauses,
            "sessions": {w: len(s) for w, s in self.sessions.active.items()},
        }
