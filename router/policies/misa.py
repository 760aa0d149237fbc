"""misa: session admission plus workload-aware class caps (MISA-T section 4.2, Eqs. 9-10).

For instance w and workload class b, N_{w,b} counts the distinct unfinished session
demands visible when evaluating w: active and pending sessions of b on w, held sessions
of b, and the candidate (held and candidate sessions do not consume the cap until
admitted). k_b is a conservative per-class footprint: the ``k_quantile`` of a bounded
history of completed class-b sessions (``class_k_prior_blocks`` / ``k_prior_blocks``
while fewer than ``k_min_samples``), never below the mean observed blocks of class b's
protected sessions. Then::

    S_{w,b} = N_{w,b} k_b                                   (Eq. 9)
    M_{w,b} = C_w S_{w,b} / Σ_b' S_{w,b'}                   (Eq. 10)
    K_{w,b} = max(1, floor(M_{w,b} / k_b))                  (Eq. 10)

A new session is admitted only when both the global cap K_w and its class cap K_{w,b}
have headroom (and the Eq. 3 budget, see ``session_admission``). The global cap uses the
demand-weighted footprint k_mix = Σ_b S_b / Σ_b (S_b / k_b), so that without the floor
Σ_b K_{w,b} <= floor(C_w / k_mix) = K_base: the class caps partition the global cap.
Under overload contraction the partitioned budget is C_op = C_w K_w / K_base, which keeps
Σ_b K_{w,b} <= K_w. The max(1, .) floor and what it does to Eq. 3 are described in
``router/policies/session_admission.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from router.ledger import SessionRecord
from router.policies.session_admission import SessionAdmissionConfig, SessionAdmissionPolicy


@dataclass(frozen=True)
class MisaConfig(SessionAdmissionConfig):
    """Options of misa: session_admission's, plus per-class footprint priors."""

    class_k_prior_tokens: dict[str, float] = field(default_factory=dict)
    """Per-class k_b prior (tokens, converted at the engines' block size) before
    ``k_min_samples`` completed sessions of that class, e.g. ``{agent: 8192}``; classes not
    listed use the class-agnostic prior. Empty by default: the project does not know a
    deployment's lengths in advance."""
    class_k_prior_blocks: dict[str, float] = field(default_factory=dict)
    """The same per-class priors in blocks; a class listed here ignores its token prior."""

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = {b: k for b, k in {**self.class_k_prior_tokens, **self.class_k_prior_blocks}.items()
               if not k > 0}
        if bad:
            raise ValueError(f"class_k_prior_tokens / class_k_prior_blocks must be > 0, got {bad}")


class MisaPolicy(SessionAdmissionPolicy):
    """Session admission with per-class caps from spatial KV demand (MISA-T Eqs. 9-10)."""

    name = "misa"
    config: MisaConfig

    def __init__(self, config: MisaConfig | None = None) -> None:
        super().__init__(config or MisaConfig())

    def class_reference_blocks(self, workload_class: str, candidate: SessionRecord | None = None) -> float:
        """k_b: conservative KV footprint of a class-b session, in blocks (section 4.2).

        ``candidate``: the session being decided; its observed blocks count in the
        protected mean as if it were admitted (see ``SessionAdmissionPolicy.instance_caps``).
        """
        cfg, ledger = self.config, self.session_ledger
        if workload_class in cfg.class_k_prior_blocks:
            prior = float(cfg.class_k_prior_blocks[workload_class])
        elif workload_class in cfg.class_k_prior_tokens:
            prior = self._prior_blocks(None, cfg.class_k_prior_tokens[workload_class])
        else:
            prior = self._prior_blocks(cfg.k_prior_blocks, cfg.k_prior_tokens)
        history = ledger.blocks_history.get(workload_class)
        return self._k_blocks(history, ledger.protected_mean_blocks(workload_class, candidate), prior)

    def _class_weight(self, workload_class: str) -> float:
        """Per-session demand weight besides k_b: 1 (spatial); MISA-T returns T_b."""
        return 1.0

    def _class_demand_blocks(
        self, demand: dict[str, int], candidate: SessionRecord | None = None
    ) -> tuple[dict[str, float], dict[str, float]]:
        k = {b: self.class_reference_blocks(b, candidate) for b in demand}
        # S_wb = N_wb * k_b  (MISA-T Eq. 9); MISA-T: R_wb = N_wb * k_b * T_b  (Eq. 11)
        return k, {b: n * k[b] * self._class_weight(b) for b, n in demand.items() if n > 0}

    def _class_quotas(
        self, budget_blocks: float, demand_blocks: dict[str, float], k_blocks: dict[str, float]
    ) -> tuple[dict[str, float], dict[str, int], tuple[str, ...]]:
        total = sum(demand_blocks.values())
        # M_wb = C_w * S_wb / Σ_b' S_wb'  (MISA-T Eq. 10; Eq. 13 with R for S)
        quota = {b: budget_blocks * d / total for b, d in demand_blocks.items()}
        raw = {b: math.floor(m / k_blocks[b]) for b, m in quota.items()}
        caps = {b: max(1, r) for b, r in raw.items()}  # K_wb = max(1, ⌊M_wb / k_b⌋)  (Eq. 10, 13)
        return quota, caps, tuple(sorted(b for b, r in raw.items() if r == 0))

    def state(self) -> dict:
        """session_admission's state plus k_b per class with completed-session samples."""
        out = super().state()
        classes = sorted(set(self.session_ledger.blocks_history) | set(self.session_ledger.held_counts()))
        out["class_reference_blocks"] = {b: self.class_reference_blocks(b) for b in classes}
        return out
