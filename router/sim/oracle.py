"""misa_t_oracle: MISA-T handed the true class footprints and residencies (experiment 5).

The reference for the workload-shift and snapshot-delay experiments: the same policy
object as ``misa_t`` (every equation, the ledger, the overload control), except that
k_b (``class_reference_blocks``) and T_b (``class_residency_s``) are not estimated from
completed sessions but given, and switch to their post-shift values at ``switch_s`` at
once. The simulator's experiment driver measures the true values (mean final KV blocks
and mean residency of the sessions released before / after the shift) in a first run
and hands them to this policy in a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.ledger import SessionRecord
from router.policies.base import ClusterView, Decision, Request
from router.policies.misa_t import MisaTConfig, MisaTPolicy


@dataclass(frozen=True)
class MisaTOracleConfig(MisaTConfig):
    """misa_t's options plus the true class values (blocks, seconds) before/after ``switch_s``."""

    switch_s: float = 0.0
    """Simulated time of the workload shift (0: only the ``after`` values are used)."""
    k_blocks_before: dict[str, float] = field(default_factory=dict)
    """True mean KV blocks per session, by class, before the shift."""
    k_blocks_after: dict[str, float] = field(default_factory=dict)
    """... and after it."""
    t_s_before: dict[str, float] = field(default_factory=dict)
    """True mean residency (s) per session, by class, before the shift."""
    t_s_after: dict[str, float] = field(default_factory=dict)
    """... and after it."""


class MisaTOraclePolicy(MisaTPolicy):
    """MISA-T with true k_b and T_b (see module docstring); unknown classes fall back to misa_t's estimates."""

    name = "misa_t_oracle"
    config: MisaTOracleConfig

    def __init__(self, config: MisaTOracleConfig | None = None) -> None:
        super().__init__(config or MisaTOracleConfig())
        self._now = 0.0

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """misa_t's decision, with the clock noted for the before/after switch."""
        self._now = now
        return super().decide(request, view, now)

    def _truth(self, before: dict[str, float], after: dict[str, float], b: str) -> float | None:
        table = after if self._now >= self.config.switch_s else before
        return table.get(b)

    def class_reference_blocks(self, workload_class: str, candidate: SessionRecord | None = None) -> float:
        """k_b: the true value for the current phase (misa_t's estimate for other classes)."""
        v = self._truth(self.config.k_blocks_before, self.config.k_blocks_after, workload_class)
        return v if v is not None else super().class_reference_blocks(workload_class, candidate)

    def class_residency_s(self, workload_class: str) -> float:
        """T_b: the true value for the current phase."""
        v = self._truth(self.config.t_s_before, self.config.t_s_after, workload_class)
        return v if v is not None else super().class_residency_s(workload_class)
