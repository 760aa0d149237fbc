"""The request metadata a rollout worker sends the router (DESIGN.md "Request metadata").

The router owns this contract: ``router.server`` reads these headers off every request,
and every client (``rollout.client``, ``router.replay``, the agent server) writes them with
``SessionHeaders``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionHeaders:
    """Identity of one episode for the router (DESIGN.md "Request metadata").

    Attributes:
        session_id: X-Session-Id, one per episode.
        workload_class: X-Workload-Class (``agent``, ``rlvr``, ``rlhf``, ...).
        group_id: X-Group-Id (GRPO group of the rollout unit), or None.
        unit_id: X-Rollout-Unit (trainer-counted unit id), or None.
    """

    session_id: str
    workload_class: str = "default"
    group_id: str | None = None
    unit_id: str | None = None

    def headers(self, session_end: bool) -> dict[str, str]:
        """HTTP headers of one call; ``session_end`` marks the episode's last call."""
        h = {"X-Session-Id": self.session_id, "X-Workload-Class": self.workload_class}
        if self.group_id is not None:
            h["X-Group-Id"] = self.group_id
        if self.unit_id is not None:
            h["X-Rollout-Unit"] = self.unit_id
        if session_end:
            h["X-Session-End"] = "1"
        return h
