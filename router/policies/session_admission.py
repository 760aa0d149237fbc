"""session_admission: adaptive, class-agnostic session admission (MISA-T section 4.1).

Admission rule, per instance w (MISA-T Eq. 6)::

    Admit(r, w) = 1  if s_r in O_w ∪ P_w          (continuation: never needs headroom)
                  1  if |O_w| + |P_w| < K_w(t)    (new session, cap headroom)
                  0  otherwise                     (HOLD, re-evaluated later)

- O_w / P_w live in the session ledger (``router/ledger.py``). A session is pending from
  admission until it is visible: its first request started and a metric or KV snapshot
  of w was taken after that. It stays active until it ends: ``X-Session-End`` on its
  last request, a ``SessionEnded`` event, or ``idle_timeout_s`` without activity (the
  policy expires idle sessions itself from ``now``; the ledger records the reason).
- Base cap ``K_base = floor(C_w / k_ref)``: C_w = ``protected_fraction`` of the instance's
  KV blocks (``InstanceMetrics.num_blocks``; ``fallback_num_blocks`` before any metric or
  when metrics are stale), k_ref = a conservative quantile of a moving window of
  completed-session footprints (``k_footprint``: by default each session's time-averaged
  blocks, Z_s / T_s of Eq. 2), raised to the mean observed blocks of protected sessions
  (their current sizes, not time averages: when the live sessions are already larger
  than the completed ones' average, the cap follows them down rather than trusting the
  history),
  with a prior until ``k_min_samples`` sessions completed.
- Operating cap ``K_w <= K_base`` contracts under *confirmed* overload pressure (class
  :class:`router.policies.overload.OverloadControl`, MISA-T Eq. 8): G_w = max(0, h* - h_hat) > ``pressure_gap`` for
  ``confirm_windows`` consecutive metric windows while the hit rate is not recovering
  (least-squares slope <= ``max_recovery_slope``), or ``num_requests_waiting > 0``
  throughout ``confirm_windows`` windows. Contraction is multiplicative
  (K_w <- max(1, floor(``contraction_factor`` * K_w))); recovery is gradual: after
  ``confirm_windows`` healthy windows in a row, +``recovery_step`` per healthy window,
  until K_w reaches K_base again. h* is the mean hit rate of the last
  ``reference_windows`` healthy windows.
- A session whose bound instance is unhealthy or lost is *rebound* and must re-acquire
  admission; so must a session that returns after its idle timeout. For such a
  re-acquiring continuation whose best-cached instance h has no headroom, MISA-T Eq. 7
  decides: hold for h when ``Δ_r + q_hit - q_cold < H_r / F``, else cold-route. Estimates:
  Δ_r = time already held + the next recheck delay; q_w = waiting requests on w
  (``num_requests_waiting``; in-flight count when metrics are stale) times the mean
  prompt length, divided by F_w; F_w = the best prefill throughput (prompt tokens/s,
  differenced ``prompt_tokens_total``) over the last ``prefill_rate_windows`` metric
  windows, ``prefill_tokens_per_s_prior`` before any; H_r = matched blocks x block size
  (the prefix index), or the session's observed blocks on its last instance when the
  request carries no block hashes.
- HOLD never loses work: a held session stays in the ledger (and counts as demand for
  MISA's N_{w,b}); within a workload class, cap-held sessions are admitted in arrival
  order; the recheck delay is ``recheck_max_s / (1 + visible siblings of its GRPO
  group)``, at least ``recheck_min_s``: once siblings run, the group waits on the held one.
  A held session whose request is dropped before admission (``RequestFinished`` with no
  instance: its client left) is closed at once when nothing else of it is in flight;
  one not re-decided for ``held_forget_s`` is dropped (its caller gave up without a word);
  holds older than ``long_hold_s`` are counted in ``state()["long_holds"]``.
- Placement among instances with headroom (``placement``): ``cache_aware`` = longest
  prefix match in the prefix index, else least loaded; ``cost`` = MISA-T Eq. 1.

The max(1, .) floor. The paper keeps caps >= 1 so no class (or instance) starves; it then
admits a session whose reserved footprint exceeds the remaining protected budget, i.e. it
breaks Eq. (3) ``Σ_{s in P_w} k~_s <= C_w``. Here that happens only as a *floor
admission*: when floor(C_w / k_ref) = 0 (the global floor) and w has no protected session,
or (MISA, MISA-T) when floor(M_{w,b} / k_b) = 0 (the class floor) and w has no protected
session of class b. So at most one floor session per class per instance exists at a
time; floor admissions are counted (``floor_admissions``) and current floor sessions are
reported (``floor_sessions``). Every other admission also checks Eq. (3) directly, with
k~_s = the class reference footprint k_b (k_ref class-agnostic) and budget
C_op = C_w * K_w / K_base (the operating share of C_w): occupancy + k_b <= C_op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from router.estimators import BoundedHistory
from router.ledger import HELD, HOLD_CACHE, HOLD_CAP, HOLD_NO_INSTANCE, REBOUND, SessionLedger, SessionRecord
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
    InstanceMetrics,
    InstanceView,
    MetricsSampled,
    PolicyStats,
    Request,
    RequestFinished,
    RequestStarted,
    SessionEnded,
    option_bound_errors,
)
from router.policies.overload import OverloadControl
from router.policies.placement import longest_match_or_least_loaded, min_prefill_cost
from router.prefix_index import PrefixIndex


@dataclass(frozen=True)
class SessionAdmissionConfig:
    """Options of session_admission (and, inherited, of misa and misa_t).

    The paper leaves these open; each default's reason is given under it.
    """

    protected_fraction: float = 0.9
    """C_w = this share of the instance's KV blocks; the rest absorbs decode growth beyond
    k_ref and blocks of requests in flight between snapshots."""
    fallback_num_blocks: int = 364
    """KV blocks assumed before any metric arrives or when metrics are stale: the smallest
    engine this project runs (vLLM on CPU with 2 GiB KV = 364 blocks), so caps start low."""
    block_size_fallback_tokens: int = 16
    """Tokens per KV block until an instance reports its block size (vLLM's GPU default)."""
    k_prior_tokens: float = 1024.0
    """Floor of k_ref until ``k_min_samples`` sessions completed (k_ref is the larger of
    the window quantile and this), in tokens (converted at the engines' block size):
    longer than a typical single-turn RLVR/RLHF sample, so early caps err low whatever
    the block size (16 on GPU, 128 on CPU)."""
    k_prior_blocks: float | None = None
    """The same prior given in blocks; when set it replaces ``k_prior_tokens``."""
    k_window_sessions: int = 256
    """Moving window of completed sessions (per class for MISA): long enough for a stable
    upper quantile (``k_quantile``), short enough to follow length drift within a few
    hundred sessions."""
    k_min_samples: int = 16
    """Completed sessions before the prior stops being a floor (an upper quantile of fewer
    is noise)."""
    k_quantile: float = 0.75
    """Conservative reference footprint: the p75 of the completed-session footprints, above
    the median (session lengths are long-tailed, MISA-T Table 2). Measured in the
    simulator (misa_t samples/min; README, "Session footprint"): with
    time-averaged footprints p75 is within 2% of the best setting at the paper's shape
    (step3.7-like, scale 0.25) and 16% below it on 2 CPU engines of 32 blocks, where p90
    loses 4% and 33%, and p50 overcommits at the paper's shape (hit rate 97% -> 65%)."""
    k_footprint: Literal["time_averaged", "final"] = "time_averaged"
    """What a completed session's footprint is: ``time_averaged`` = its block-seconds over
    its residency, Z_s / T_s of Eq. 2, so k̄_b T_b is the block-time a session holds;
    ``final`` = its largest observed blocks, which reserves every session's end size
    for its whole life (2-3x the time average for growing agent sessions and long
    decodes; it left most KV idle on small engines, see ``bench/router_real.py``)."""
    metrics_stale_s: float = 10.0
    """A metric sample older than this is stale: fall back to conservative capacity and
    freeze cap growth (a few scrape periods of 1-2 s)."""
    window_s: float = 5.0
    """Metric window for h_hat (Eq. 8): a few scrapes, so one scrape's noise averages out."""
    min_window_queries_tokens: float = 256.0
    """A window with fewer queried prompt tokens has no hit-rate signal (too little traffic)."""
    reference_windows: int = 12
    """h* = mean h_hat of the last 12 healthy windows (one minute at 5 s windows)."""
    min_reference_windows: int = 3
    """No hit-rate pressure before h* rests on 3 healthy windows."""
    pressure_gap: float = 0.1
    """G_w above 10 points of hit rate is a pressure window (smaller gaps are normal noise)."""
    confirm_windows: int = 3
    """Consecutive pressure windows to confirm pressure, and healthy ones to start recovery
    (15 s at 5 s windows: filters one-off bursts)."""
    max_recovery_slope: float = 0.0
    """Slope check: confirm hit-rate pressure only while h_hat is not rising (per window)."""
    contraction_factor: float = 0.75
    """K_w <- floor(0.75 K_w) on confirmed pressure: multiplicative, a quarter per step."""
    recovery_step: int = 1
    """K_w grows by one session per healthy window: slow enough not to re-trigger churn."""
    idle_timeout_s: float = 120.0
    """A session with no request in flight for this long ends: longer than agent tool gaps
    (tens of seconds), short enough to free caps of abandoned sessions. (The live router's
    ``sessions.forget_idle_s``, 600 s, is its own session table's, for every policy.)"""
    recheck_max_s: float = 1.0
    """Recheck delay of a held request with no visible siblings (metric-scrape scale)."""
    recheck_min_s: float = 0.05
    """Floor of the recheck delay, however many siblings are visible."""
    no_healthy_recheck_s: float = 1.0
    """Recheck delay when no instance is healthy: about one health-probe period."""
    long_hold_s: float = 30.0
    """Holds older than this are reported as long holds. Set by the transport, not in
    ``router.params``: ``make_policy(..., long_hold_s=)`` from ``server.long_hold_s``, the
    one knob for this and the live router's ``router_long_holds_total``."""
    held_forget_s: float = 300.0
    """A held session not re-decided for this long is dropped (its caller gave up); at least
    ``recheck_max_s`` and ``no_healthy_recheck_s``, or one would be dropped between two rechecks."""
    placement: Literal["cache_aware", "cost"] = "cache_aware"
    """Placement among instances with headroom: prefix match else least loaded, or Eq. 1."""
    prefill_tokens_per_s_prior: float = 1000.0
    """F before any measurement (between this project's CPU engine and a small GPU)."""
    prefill_rate_windows: int = 12
    """F = best prefill throughput over the last 12 metric windows (busy windows show capacity)."""
    prompt_tokens_prior: float = 512.0
    """Mean prompt length for queue-delay estimates before any request was seen."""
    finished_keep: int = 4096
    """Finished sessions remembered (re-acquiring continuations after an idle timeout)."""

    def __post_init__(self) -> None:
        checks = {
            "protected_fraction must be in (0, 1]": 0 < self.protected_fraction <= 1,
            "contraction_factor must be in (0, 1)": 0 < self.contraction_factor < 1,
            "k_quantile must be in (0, 1]": 0 < self.k_quantile <= 1,
            "k_footprint must be 'time_averaged' or 'final'": self.k_footprint in ("time_averaged", "final"),
            "max_recovery_slope must be >= 0": self.max_recovery_slope >= 0,
            "recheck_min_s must be > 0 and <= recheck_max_s": 0 < self.recheck_min_s <= self.recheck_max_s,
        }
        positive = (
            "fallback_num_blocks", "block_size_fallback_tokens", "k_prior_tokens", "k_window_sessions",
            "metrics_stale_s", "window_s", "reference_windows", "min_reference_windows", "pressure_gap",
            "confirm_windows", "recovery_step", "idle_timeout_s", "no_healthy_recheck_s", "long_hold_s",
            "held_forget_s", "prefill_tokens_per_s_prior", "prefill_rate_windows", "prompt_tokens_prior",
            "finished_keep",
        )  # fmt: skip
        for name in positive:
            checks[f"{name} must be > 0"] = getattr(self, name) > 0
        checks["k_prior_blocks must be > 0 (or null)"] = self.k_prior_blocks is None or self.k_prior_blocks > 0
        checks["k_min_samples must be >= 1"] = self.k_min_samples >= 1
        checks["min_window_queries_tokens must be >= 0"] = self.min_window_queries_tokens >= 0
        # each message starts with the option's name: the value given is echoed after it
        bad = [msg + (f", got {getattr(self, msg.split()[0])!r}" if hasattr(self, msg.split()[0]) else "")
               for msg, ok in checks.items() if not ok]
        # else a held session is forgotten between two rechecks
        bad += option_bound_errors(self, not_below=(("held_forget_s", "recheck_max_s"),
                                                    ("held_forget_s", "no_healthy_recheck_s")))
        if bad:
            raise ValueError("; ".join(bad))


# --------------------------------------------------------------------------- caps


@dataclass
class InstanceCaps:
    """Admission caps of one instance at one decision (all block counts in KV blocks).

    Attributes:
        protected_blocks: C_w.
        ref_blocks: k_ref (class-agnostic) or the demand-weighted class mix (MISA).
        base_cap: K_base = max(1, floor(C_w / ref_blocks)).
        base_floor: floor(C_w / ref_blocks) was 0 (the global max(1, .) floor).
        cap: K_w <= K_base, the operating cap.
        budget_blocks: C_op = C_w * K_w / K_base, the protected budget now usable.
        protected: |O_w| + |P_w|.
        occupancy_blocks: Σ k~_s over protected sessions (Eq. 3 left side).
        class_counts: protected sessions per class.
        class_k_blocks: k_b per class (or k_ref for every class, class-agnostic).
        class_quota_blocks: M_{w,b} (MISA, MISA-T; empty class-agnostic).
        class_caps: K_{w,b} (MISA, MISA-T; empty class-agnostic).
        floor_classes: classes whose K_{w,b} is the max(1, .) floor.
        stale: metrics missing or stale: fallback capacity, no cap growth.
    """

    instance: str
    protected_blocks: float
    ref_blocks: float
    base_cap: int
    base_floor: bool
    cap: int
    budget_blocks: float
    protected: int
    occupancy_blocks: float
    class_counts: dict[str, int]
    class_k_blocks: dict[str, float]
    class_quota_blocks: dict[str, float] = field(default_factory=dict)
    class_caps: dict[str, int] = field(default_factory=dict)
    floor_classes: tuple[str, ...] = ()
    stale: bool = False

    def headroom(self, workload_class: str) -> tuple[bool, bool, str]:
        """May a new session of ``workload_class`` enter? Returns (ok, floor admission, why not)."""
        n_b = self.class_counts.get(workload_class, 0)
        k_b = self.class_k_blocks.get(workload_class, self.ref_blocks)
        if self.protected >= self.cap:  # |O_w| + |P_w| < K_w  (MISA-T Eq. 6)
            return False, False, "global cap"
        if self.class_caps and n_b >= self.class_caps.get(workload_class, 1):
            return False, False, "class cap"
        floor = (self.base_floor and self.protected == 0) or (workload_class in self.floor_classes and n_b == 0)
        if not floor and self.occupancy_blocks + k_b > self.budget_blocks:  # Σ k~_s <= C_w  (Eq. 3)
            return False, False, "protected capacity"
        return True, floor, ""

    def as_dict(self) -> dict:
        """JSON-serialisable form for /state."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


# --------------------------------------------------------------------------- policy


class SessionAdmissionPolicy:
    """Class-agnostic session admission (MISA-T Eq. 6-8); base of MISA and MISA-T."""

    name = "session_admission"

    def __init__(self, config: SessionAdmissionConfig | None = None) -> None:
        self.config = config or SessionAdmissionConfig()
        cfg = self.config
        self.session_ledger = SessionLedger(cfg.k_window_sessions, cfg.finished_keep, cfg.k_footprint)
        self.index = PrefixIndex()
        self.control: dict[str, OverloadControl] = {}
        self.metrics: dict[str, InstanceMetrics] = {}
        self.views: dict[str, InstanceView] = {}
        self.prompt_tokens = BoundedHistory(cfg.k_window_sessions)
        self.stats = PolicyStats()
        self.counters = {"continuations": 0, "rebinds": 0, "floor_admissions": 0, "long_holds_admitted": 0}
        self.counters.update({"eq7_hold_for_cache": 0, "eq7_cold_route": 0})
        self._fresh_cap: dict[str, int] = {}
        self._now = 0.0

    # ----------------------------------------------------------------- estimates

    def _k_blocks(self, history: BoundedHistory | None, protected_mean: float | None, prior: float) -> float:
        """Conservative reference footprint (blocks): window quantile, prior while few samples,
        never below the mean observed blocks of protected sessions."""
        cfg = self.config
        k = history.quantile(cfg.k_quantile) if history is not None and len(history) else 0.0
        if history is None or len(history) < cfg.k_min_samples:
            k = max(k, prior)
        if protected_mean is not None:
            k = max(k, protected_mean)
        return max(1.0, k)

    def reference_blocks(self, candidate: SessionRecord | None = None) -> float:
        """k_ref: class-agnostic conservative session footprint in KV blocks (section 4.1).

        ``candidate``: the session being decided; its observed blocks count as if it were
        admitted (see ``instance_caps``).
        """
        ledger = self.session_ledger
        return self._k_blocks(ledger.blocks_history_all, ledger.protected_mean_blocks_all(candidate),
                              self._prior_blocks(self.config.k_prior_blocks, self.config.k_prior_tokens))

    def _prior_blocks(self, blocks: float | None, tokens: float) -> float:
        """A footprint prior in blocks: ``blocks`` when given, else ``tokens`` at the block
        size the instances report (the largest, so the prior stays conservative)."""
        if blocks is not None:
            return float(blocks)
        sizes = [m.block_size for m in self.metrics.values() if m is not None and m.block_size]
        return math.ceil(tokens / (max(sizes) if sizes else self.config.block_size_fallback_tokens))

    def _fresh(self, view: InstanceView) -> bool:
        return view.metrics is not None and view.metrics_age_s is not None and view.metrics_age_s <= self.config.metrics_stale_s

    def _known_metrics(self, view: InstanceView) -> InstanceMetrics | None:
        return view.metrics or self.metrics.get(view.instance)

    def protected_capacity_blocks(self, view: InstanceView) -> tuple[float, bool]:
        """(C_w in KV blocks, stale). Stale or missing metrics: the fallback (or less)."""
        cfg = self.config
        known = self._known_metrics(view)
        num_blocks = known.num_blocks if known is not None and known.num_blocks else None
        stale = not self._fresh(view)
        if num_blocks is None:
            num_blocks = cfg.fallback_num_blocks
        elif stale:
            num_blocks = min(num_blocks, cfg.fallback_num_blocks)
        return cfg.protected_fraction * num_blocks, stale

    def _block_size(self, instance: str) -> int:
        m = self.metrics.get(instance) or (self.views[instance].metrics if instance in self.views else None)
        return m.block_size if m is not None and m.block_size else self.config.block_size_fallback_tokens

    def _prefill_rate(self, instance: str) -> float:
        ctl = self.control.get(instance)
        rate = ctl.prefill_tokens_per_s() if ctl is not None else None
        return rate or self.config.prefill_tokens_per_s_prior

    def _queue_delay_s(self, view: InstanceView) -> float:
        """q_w / d_w: waiting requests x mean prompt tokens / F_w (seconds)."""
        waiting = view.metrics.num_requests_waiting if self._fresh(view) else view.in_flight
        mean_prompt = self.prompt_tokens.mean() if len(self.prompt_tokens) else self.config.prompt_tokens_prior
        return waiting * mean_prompt / self._prefill_rate(view.instance)

    # ----------------------------------------------------------------- caps

    def _class_demand_blocks(
        self, demand: dict[str, int], candidate: SessionRecord | None = None
    ) -> tuple[dict[str, float], dict[str, float]] | None:
        """(k_b, D_b) per class for class caps (k_b as if ``candidate`` were admitted), or
        None when admission is class-agnostic."""
        return None

    def _class_quotas(
        self, budget_blocks: float, demand_blocks: dict[str, float], k_blocks: dict[str, float]
    ) -> tuple[dict[str, float], dict[str, int], tuple[str, ...]]:
        """(M_{w,b}, K_{w,b}, floor classes); only policies with class caps define it."""
        raise NotImplementedError(f"{self.name} has no class caps")

    def _demand(self, instance: str, candidate: SessionRecord | None) -> dict[str, int]:
        """N_{w,b}: active + pending on w, held anywhere, plus the candidate (MISA-T section 4.2)."""
        demand = self.session_ledger.held_counts()
        for b, n in self.session_ledger.class_counts(instance).items():
            demand[b] = demand.get(b, 0) + n
        if candidate is not None and candidate.state != HELD:
            demand[candidate.workload_class] = demand.get(candidate.workload_class, 0) + 1
        return demand

    def instance_caps(self, view: InstanceView, candidate: SessionRecord | None = None) -> InstanceCaps:
        """Caps of ``view``'s instance as seen when evaluating ``candidate`` (None: no candidate).

        The footprints k_b (k_ref) are estimated on the ledger as it will be once the
        candidate is admitted: its demand is counted in N_{w,b}, and its observed blocks
        (a rebound or re-acquiring session has some) in the protected mean that bounds
        k_b from below. Otherwise admitting a session with a large observed footprint
        would raise k_b right after the Eq. (3) check and leave Σ k~_s above C_w.
        """
        w = view.instance
        C, stale = self.protected_capacity_blocks(view)
        counts = dict(self.session_ledger.class_counts(w))
        n = sum(counts.values())
        split = self._class_demand_blocks(self._demand(w, candidate), candidate)
        if split is None or not split[1]:
            k_ref = self.reference_blocks(candidate)
            k_by_class = {b: k_ref for b in counts}
            if candidate is not None:
                k_by_class[candidate.workload_class] = k_ref
            ref, demand_blocks = k_ref, None
        else:
            k_by_class, demand_blocks = split
            # demand-weighted footprint: Σ_b K_{w,b} <= floor(C_w / ref) = K_base
            ref = sum(demand_blocks.values()) / sum(d / k_by_class[b] for b, d in demand_blocks.items())
        raw = math.floor(C / ref)  # K_base = ⌊C_w / k̄_w⌋  (MISA-T section 4.1)
        base = max(1, raw)
        ctl = self.control.get(w)
        cap = min(base, ctl.cap_limit) if ctl is not None and ctl.cap_limit is not None else base  # K_w <= K_base
        if stale:
            cap = min(cap, self._fresh_cap.get(w, cap))  # stale metrics: no cap growth
        else:
            self._fresh_cap[w] = cap
        budget = C * cap / base
        occupancy = sum(c * k_by_class.get(b, ref) for b, c in counts.items())
        caps = InstanceCaps(w, C, ref, base, raw == 0, cap, budget, n, occupancy, counts, k_by_class, stale=stale)
        if demand_blocks is not None:
            caps.class_quota_blocks, caps.class_caps, caps.floor_classes = self._class_quotas(
                budget, demand_blocks, k_by_class
            )
        return caps

    # ----------------------------------------------------------------- decide

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Continuations go to their instance; new or re-acquiring sessions need cap headroom."""
        self._advance(now)
        for v in view.instances:
            self.views[v.instance] = v
        ledger = self.session_ledger
        rec = ledger.session(request.session_id)
        healthy = view.healthy()
        if rec is not None and rec.protected:
            if any(v.instance == rec.instance for v in healthy):
                self.stats.admits += 1
                self.counters["continuations"] += 1
                return Admit(rec.instance, reason="continuation")
            ledger.unbind(rec)
            self.counters["rebinds"] += 1
        if rec is None:
            rec = ledger.open(request.session_id, request.workload_class, request.group_id, now)
            previous = ledger.finished(request.session_id)
            if previous is not None and previous.reason == "idle_timeout":
                rec.cached_instance, rec.observed_blocks = previous.instance, previous.observed_blocks
        if not healthy:
            return self._hold(rec, HOLD_NO_INSTANCE, self.config.no_healthy_recheck_s, now, "no healthy instance")
        earlier = ledger.earlier_cap_hold(rec)
        if earlier is not None:
            return self._hold(rec, HOLD_CAP, self._recheck_s(rec), now, "behind an earlier held session of its class")
        floor_of: dict[str, bool] = {}
        for v in healthy:
            ok, floor, _ = self.instance_caps(v, rec).headroom(rec.workload_class)
            if ok:
                floor_of[v.instance] = floor
        if not floor_of:
            return self._hold(rec, HOLD_CAP, self._recheck_s(rec), now, "no admission headroom")
        candidates = [v for v in healthy if v.instance in floor_of]
        matched = self.index.longest_prefix_match(request.block_hashes) if request.block_hashes else {}
        chosen = self._place(candidates, request, matched)
        if rec.cached_instance is not None:
            target = self._eq7_hold_for_cache(rec, request, healthy, candidates, chosen, matched, now)
            if isinstance(target, Hold):
                return target
            chosen = target
        return self._admit(rec, chosen.instance, floor_of[chosen.instance], now)

    def _eq7_hold_for_cache(
        self,
        rec: SessionRecord,
        request: Request,
        healthy: tuple[InstanceView, ...],
        candidates: list[InstanceView],
        cold: InstanceView,
        matched: dict[str, int],
        now: float,
    ) -> Hold | InstanceView:
        """Where a re-acquiring continuation goes: its cached instance h if h has headroom, else
        Hold for h when MISA-T Eq. 7 holds, else the cold instance ``cold``."""
        by_id = {v.instance: v for v in healthy}
        if matched:
            best = max((w for w in matched if w in by_id), key=matched.__getitem__, default=None)
            hit_tokens = matched[best] * self._block_size(best) if best is not None else 0
        else:
            best = rec.cached_instance if rec.cached_instance in by_id else None
            hit_tokens = min(request.prompt_tokens, rec.observed_blocks * self._block_size(best)) if best else 0
        if best is None or hit_tokens <= 0:
            return cold
        if any(v.instance == best for v in candidates):
            return by_id[best]
        recheck = self._recheck_s(rec)
        delta = (now - rec.held_since_s if rec.state == HELD else 0.0) + recheck
        q_hit, q_cold = self._queue_delay_s(by_id[best]), self._queue_delay_s(cold)
        if delta + q_hit - q_cold < hit_tokens / self._prefill_rate(best):  # Δ_r + q_hit − q_cold < H_r / F  (Eq. 7)
            self.counters["eq7_hold_for_cache"] += 1
            return self._hold(rec, HOLD_CACHE, recheck, now, f"hold for cached instance {best} (Eq. 7)")
        self.counters["eq7_cold_route"] += 1
        return cold

    def _place(self, candidates: list[InstanceView], request: Request, matched: dict[str, int]) -> InstanceView:
        if self.config.placement == "cost":
            hits = {w: m * self._block_size(w) for w, m in matched.items()}
            return min_prefill_cost(
                candidates, request.prompt_tokens, hits, self._queue_delay_s, lambda v: self._prefill_rate(v.instance)
            )
        return longest_match_or_least_loaded(candidates, matched)[0]

    def _admit(self, rec: SessionRecord, instance: str, floor: bool, now: float) -> Admit:
        if rec.state == HELD and now - rec.held_since_s >= self.config.long_hold_s:
            self.counters["long_holds_admitted"] += 1
        rebound = rec.state == REBOUND or rec.cached_instance is not None
        self.session_ledger.admit(rec, instance, now, floor)
        self.stats.admits += 1
        if floor:
            self.counters["floor_admissions"] += 1
        return Admit(instance, reason=("floor " if floor else "") + ("rebound" if rebound else "new"))

    def _hold(self, rec: SessionRecord, why: str, recheck_s: float, now: float, reason: str) -> Hold:
        self.session_ledger.hold(rec, why, now)
        self.stats.holds += 1
        return Hold(recheck_s, reason=reason)

    def _recheck_s(self, rec: SessionRecord) -> float:
        """Recheck delay: shrinks as more GRPO siblings of the session become visible (section 4.1)."""
        cfg = self.config
        return max(cfg.recheck_min_s, cfg.recheck_max_s / (1 + self.session_ledger.visible_siblings(rec.group_id)))

    def _advance(self, now: float) -> None:
        """Expire idle sessions and abandoned holds up to ``now`` (emits nothing)."""
        self._now = max(self._now, now)
        self.session_ledger.expire_idle(now, self.config.idle_timeout_s)
        self.session_ledger.forget_abandoned_holds(now, self.config.held_forget_s)

    # ----------------------------------------------------------------- observe

    def observe(self, event: Event) -> None:
        """Update the ledger, prefix index and overload control from one event."""
        self._advance(event.now)
        ledger = self.session_ledger
        if isinstance(event, RequestStarted):
            self.prompt_tokens.append(event.request.prompt_tokens)
            blocks = math.ceil(event.request.prompt_tokens / self._block_size(event.instance))
            ledger.request_started(event.request.session_id, event.now, blocks)
        elif isinstance(event, RequestFinished) and not event.instance:
            # dropped before admission (client gone, or no healthy engine): it never started
            ledger.abandon_hold(event.request.session_id, event.now)
        elif isinstance(event, RequestFinished):
            tokens = (event.prompt_tokens or event.request.prompt_tokens) + event.completion_tokens
            blocks = math.ceil(tokens / self._block_size(event.instance))
            ledger.request_finished(event.request.session_id, event.now, blocks, event.request.session_end)
        elif isinstance(event, SessionEnded):
            ledger.end(event.session_id, event.now, event.reason)
        elif isinstance(event, BlocksStored):
            self.index.store(event.instance, event.block_hashes)
            ledger.mark_visible(event.instance, event.now)
        elif isinstance(event, BlocksRemoved):
            self.index.remove(event.instance, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.index.clear(event.instance)
        elif isinstance(event, MetricsSampled):
            self._on_metrics(event)
        elif isinstance(event, InstanceHealthChanged) and not event.healthy:
            self.counters["rebinds"] += ledger.unbind_instance(event.instance)

    def _on_metrics(self, event: MetricsSampled) -> None:
        w = event.instance
        self.metrics[w] = event.metrics
        self.session_ledger.mark_visible(w, event.now)
        view = InstanceView(w, metrics=event.metrics, metrics_age_s=0.0)
        caps = self.instance_caps(view)
        ctl = self.control.get(w)
        if ctl is None:
            ctl = self.control[w] = OverloadControl(self.config)
        ctl.on_sample(event.metrics, event.now, caps.cap, caps.base_cap)

    # ----------------------------------------------------------------- state

    def state(self) -> dict:
        """JSON snapshot: decisions, ledger sizes, caps per instance (and class), holds, floor."""
        now = self._now
        held = self.session_ledger.held_sessions()
        instances = {}
        for w, view in sorted(self.views.items()):
            caps = self.instance_caps(view).as_dict()
            ctl = self.control.get(w)
            if ctl is not None:
                caps.update(
                    contracted=ctl.cap_limit is not None, h_star=ctl.h_star, h_hat=ctl.h_hat, pressure_gap=ctl.gap,
                    contractions=ctl.contractions, recoveries=ctl.recoveries, prefill_tokens_per_s=ctl.prefill_tokens_per_s(),
                )  # fmt: skip
            caps["active"], caps["pending"] = self.session_ledger.active_count(w), self.session_ledger.pending_count(w)
            caps["floor_sessions"] = sum(r.floor_admitted for r in self.session_ledger.protected_sessions(w))
            instances[w] = caps
        ledger_state = self.session_ledger.state(now)
        return {
            "policy": self.name,
            "admits": self.stats.admits,
            "holds": self.stats.holds,
            **self.counters,
            # the service's gauges: {instance: {class or "all": cap}} and {ledger: size}
            "caps": {w: {"all": c["cap"], **c["class_caps"]} for w, c in instances.items()},
            "ledger_sizes": {
                "active": sum(ledger_state["active"].values()),
                "pending": sum(ledger_state["pending"].values()),
                "held": len(held),
                "tracked": ledger_state["sessions_tracked"],
                "finished": ledger_state["finished_remembered"],
                "prefix_index_blocks": len(self.index),
            },
            "held_count": len(held),
            "oldest_hold_age_s": max((now - r.held_since_s for r in held), default=0.0),
            "long_holds": sum(now - r.held_since_s >= self.config.long_hold_s for r in held),
            "floor_sessions": sum(i["floor_sessions"] for i in instances.values()),
            "reference_blocks": self.reference_blocks(),
            "ledger": ledger_state,
            "instances": instances,
            "prefix_index": self.index.state(),
        }
