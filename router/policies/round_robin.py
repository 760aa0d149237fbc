"""round_robin: cycle over the healthy instances, no admission control.

The simplest baseline: request i goes to the next healthy instance after the one
request i-1 went to, in the fixed order of ``ClusterView.instances``. It never holds a
request unless no instance is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.policies.base import Admit, ClusterView, Decision, Event, Hold, PolicyStats, Request


@dataclass(frozen=True)
class RoundRobinConfig:
    """Options of round_robin."""

    no_healthy_recheck_s: float = 1.0
    """Hold delay when no instance is healthy: a health probe period is ~1 s."""

    def __post_init__(self) -> None:
        if self.no_healthy_recheck_s <= 0:
            raise ValueError(f"no_healthy_recheck_s must be > 0 seconds, got {self.no_healthy_recheck_s}")


class RoundRobinPolicy:
    """Admit each request on the next healthy instance in cyclic order."""

    name = "round_robin"

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self.stats = PolicyStats()
        self._last: str | None = None

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Admit on the first healthy instance after the last one used; Hold if none is healthy."""
        ids = [i.instance for i in view.instances]
        healthy = {i.instance for i in view.healthy()}
        if not healthy:
            self.stats.holds += 1
            return Hold(self.config.no_healthy_recheck_s, reason="no healthy instance")
        start = ids.index(self._last) + 1 if self._last in ids else 0
        for k in range(len(ids)):
            candidate = ids[(start + k) % len(ids)]
            if candidate in healthy:
                self._last = candidate
                self.stats.admits += 1
                return Admit(candidate, reason="round_robin")
        raise AssertionError("unreachable: a healthy instance exists")

    def observe(self, event: Event) -> None:
        """round_robin keeps no state from events."""

    def state(self) -> dict:
        """Decision counts and the instance used last."""
        return {"policy": self.name, "admits": self.stats.admits, "holds": self.stats.holds, "last_instance": self._last}
