"""The trainer model: releases rollout units at a target mixture under a concurrency ceiling.

MISA-T section 3.1: the trainer, not the router, sets the mixture rho and the outer
concurrency limit. This model

- keeps a pool of GRPO groups per workload class (from a trace);
- releases whole groups (fan-out) while in-flight units + group size <= ``ceiling``,
  choosing the class whose released count lags its target most,
  ``argmax_b rho_b * (A + G_b) - A_b`` (A_b: class-b units released so far);
- stops releasing for good once a class's pool is empty, so the released stream never
  departs from rho (the measurement window ends there);
- counts a unit complete when all its requests finished (N_b), and the class backlog
  Q_b = A_b - N_b (MISA-T Eq. 5).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from router.sim.errors import SimError
from router.sim.trace import TraceSession


@dataclass
class UnitRecord:
    """Release and completion times of one rollout unit (seconds, simulated clock)."""

    unit_id: str
    workload_class: str
    released_s: float
    completed_s: float | None = None


@dataclass
class Trainer:
    """Releases units; see the module docstring.

    Args:
        sessions: the trace's sessions (one per unit).
        mixture: target rho per class (normalised here); a class of share 0 is not released, and
            every class of ``sessions`` must be named.
        ceiling: most units in flight (the outer rollout concurrency).

    Raises:
        SimError: ceiling < 1, a mixture class with no sessions, a session class the mixture
            does not name, or negative shares.
    """

    sessions: list[TraceSession]
    mixture: dict[str, float]
    ceiling: int
    released: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    units: dict[str, UnitRecord] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    stopped_s: float | None = None

    def __post_init__(self) -> None:
        if self.ceiling < 1:
            raise SimError(f"trainer ceiling must be >= 1 unit, got {self.ceiling}")
        total = sum(self.mixture.values())
        if total <= 0 or any(v < 0 for v in self.mixture.values()):
            raise SimError(f"target mixture must be non-negative shares with a positive sum, got {self.mixture}")
        self.rho = {b: v / total for b, v in self.mixture.items() if v > 0}
        unnamed = sorted({s.workload_class for s in self.sessions} - set(self.mixture))
        if unnamed:
            raise SimError(f"the trace has sessions of class {', '.join(map(repr, unnamed))}, which the target "
                           f"mixture {dict(self.mixture)} does not name; give each a share (e.g. "
                           f"mixture.{unnamed[0]}=10) or 0 to leave its sessions out")
        groups: dict[str, dict[str, list[TraceSession]]] = {b: {} for b in self.rho}
        for s in self.sessions:
            if s.workload_class in groups:
                groups[s.workload_class].setdefault(s.group_id or s.session_id, []).append(s)
        for b, g in groups.items():
            if not g:
                raise SimError(f"target mixture names class {b!r} but the trace has no {b!r} sessions; "
                               f"give mixture.{b}=0 to leave the class out")
        self._pool = {b: deque(g.values()) for b, g in groups.items()}
        self.released = dict.fromkeys(self.rho, 0)
        self.completed = dict.fromkeys(self.rho, 0)
        self.in_flight = 0

    def release(self, now: float) -> list[TraceSession]:
        """Release groups while the ceiling allows; returns the released sessions in order."""
        out: list[TraceSession] = []
        while self.stopped_s is None:
            b = max(self.rho, key=self._deficit)
            if not self._pool[b]:
                self.stopped_s = now
                break
            group = self._pool[b][0]
            if self.in_flight + len(group) > self.ceiling and self.in_flight > 0:
                break
            self._pool[b].popleft()
            for s in group:
                self.units[s.unit_id] = UnitRecord(s.unit_id, b, now)
            self.released[b] += len(group)
            self.in_flight += len(group)
            out.extend(group)
            if not self._pool[b]:
                self.stopped_s = now
        return out

    def releasable_units(self) -> int:
        """About how many units will be released before the first class pool runs dry."""
        sizes = {b: sum(len(g) for g in self._pool[b]) + self.released[b] for b in self.rho}
        return int(min(min(sizes[b] / self.rho[b] for b in self.rho), sum(sizes.values())))

    def _deficit(self, b: str) -> float:
        """How far class b's releases lag rho after its next group: rho_b (A + G_b) - A_b."""
        g = len(self._pool[b][0]) if self._pool[b] else 1
        return self.rho[b] * (sum(self.released.values()) + g) - self.released[b]

    def complete(self, unit_id: str, now: float) -> None:
        """Count unit ``unit_id`` complete at ``now`` (all its requests finished)."""
        u = self.units[unit_id]
        u.completed_s = now
        self.completed[u.workload_class] += 1
        self.in_flight -= 1

    def fail(self, unit_id: str, now: float) -> None:
        """Count unit ``unit_id`` failed at ``now`` (a request errored): it leaves the in-flight
        set without counting as complete (live replays only; the simulator never fails one)."""
        u = self.units[unit_id]
        self.failed[u.workload_class] = self.failed.get(u.workload_class, 0) + 1
        self.in_flight -= 1

    def backlog(self) -> dict[str, int]:
        """Q_b = A_b - N_b per class (MISA-T Eq. 5)."""
        return {b: self.released[b] - self.completed[b] for b in self.rho}

    @property
    def done(self) -> bool:
        """No more releases and nothing in flight."""
        return self.stopped_s is not None and self.in_flight == 0
