"""misa_t: MISA with residency-time weighting (MISA-T section 4.3, Eqs. 11-13).

MISA weighs class demand by KV footprint alone; MISA-T weighs it by block-time::

    R_{w,b} = S_{w,b} T_b = N_{w,b} k_b T_b                 (Eq. 11)
    tau_{w,b} ≈ N_{w,b} k_b T_b / M_{w,b}                   (Eq. 12: drain time, equalised)
    M_{w,b} = C_w R_{w,b} / Σ_b' R_{w,b'}                   (Eq. 13)
    K_{w,b} = max(1, floor(M_{w,b} / k_b))                  (Eq. 13)

T_b is the mean residency (admission -> end, tool gaps included) of the last
``k_window_sessions`` completed class-b sessions once there are ``t_min_samples`` of them;
before that every class uses the same neutral prior ``t_prior_s``, so early quotas equal
MISA's (a shared factor cancels in Eq. 13). T_b only shapes the share; k_b converts
blocks into sessions. Everything else (ledger, Eq. 6-8, floor) is MISA's.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.policies.misa import MisaConfig, MisaPolicy


@dataclass(frozen=True)
class MisaTConfig(MisaConfig):
    """Options of misa_t: misa's, plus the residency estimate's prior."""

    t_prior_s: float = 60.0
    """Neutral residency prior shared by all classes (its value cancels while every class
    uses it; 60 s is between a single-turn sample and an agent session)."""
    t_min_samples: int = 8
    """Completed sessions of a class before its own T_b replaces the prior: a mean of 8
    is within ~35% for residencies with coefficient of variation 1."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.t_prior_s > 0 or self.t_min_samples < 1:
            raise ValueError("t_prior_s must be > 0 seconds and t_min_samples >= 1")


class MisaTPolicy(MisaPolicy):
    """MISA with class demand weighted by residency time T_b (MISA-T Eqs. 11-13)."""

    name = "misa_t"
    config: MisaTConfig

    def __init__(self, config: MisaTConfig | None = None) -> None:
        super().__init__(config or MisaTConfig())

    def class_residency_s(self, workload_class: str) -> float:
        """T_b: mean completed-session residency of class b (s), or the neutral prior."""
        history = self.session_ledger.residency_history.get(workload_class)
        if history is None or len(history) < self.config.t_min_samples:
            return self.config.t_prior_s
        return max(history.mean(), 1e-3)

    def _class_weight(self, workload_class: str) -> float:
        return self.class_residency_s(workload_class)  # R_wb = N_wb * k_b * T_b  (MISA-T Eq. 11)

    def state(self) -> dict:
        """misa's state plus T_b per class."""
        out = super().state()
        out["class_residency_s"] = {b: self.class_residency_s(b) for b in out["class_reference_blocks"]}
        return out
