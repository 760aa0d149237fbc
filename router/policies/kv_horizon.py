"""kv_horizon: admission by each session's KV blocks now plus its growth over a horizon.

The project's own policy past the paper (issue 15). MISA-T reserves, for every protected
session, one class footprint k_b (a quantile of completed sessions) for its whole life;
footprints that grow during decode make that reservation too large early and too small
late, and the caps end up counting sessions, not blocks. Here instance w reserves, in KV
blocks, what its protected sessions hold now plus what they can add over ``horizon_s``,
but never less than their classes' mean lifetime footprint::

    R_w(t) = max( H_w(t) + Σ_s g_s + Σ_{s idle} last_s ,  Σ_b n_{w,b} k̄_b )
      H_w(t) = KV usage x num_blocks at w's last fresh sample + own prompt blocks of the
               requests started since (``current_from: metrics``); or, with stale metrics,
               Σ_running (own prompt blocks + r_w (t - start_s) / block_size)
      own    = prompt blocks minus those the session matched in w's cache at admission
               (class / group prefix: stored once on the instance)
      g_s    = min(gamma_b horizon_s, G_b) / block_size  (``growth_model: session``):
               gamma_b = the class's mean growth rate over completed sessions, (final -
               first prompt) tokens / residency, r_w (measured per-sequence decode rate)
               before 8 of them; G_b = their mean (final - first prompt) tokens, before 8
               of them the footprint prior below (``growth_bound``): no session reserves
               more growth than a whole one adds;
               and for a session's last request (``X-Session-End``) at most its
               ``max_tokens`` (``request_bound``): it cannot decode more;
               and at most what it has left, G_b - grown_s (``growth_remaining``):
               grown_s = own blocks now - own blocks of its first prompt, a running
               request's decode so far counted as r_w x elapsed (summed per class, see
               the option)
      last_s = own blocks of a session between requests (an agent in a tool gap: its
               history sits unreferenced in the cache, so the engine's count omits it)
      k̄_b    = mean time-averaged footprint Z_s / T_s (Eq. 2) of completed class-b
               sessions (``lifetime_floor``; before 8, the prior
               min(``footprint_prior_tokens``, ``footprint_prior_share`` x num_blocks_w));
               for a session's last request at most own + max_tokens / block_size
               (``request_bound``)

A new session of class b may enter w when (Eq. 3 with these reservations)::

    R_w(t) + max(own_new + g_new, k̄_b) <= U_w * num_blocks_w

with U_w the operating usage target. Sums are kept per instance, so a decision costs
O(instances x classes).

Fast and slow signals (engine metrics): a sample that shows new preemptions lowers U_w
multiplicatively (``backoff``, down to ``min_target_usage``), clean samples raise it back
at ``recovery_per_s`` up to ``target_usage``; while w's waiting queue holds more than
``waiting_limit`` requests no new session enters it (the fast signal: the engine is
already behind); measured KV usage above U_w (the slow signal) does the same.

Order and floors: new sessions are admitted in arrival order over all classes (the order
the trainer released them; a held session holds every younger new one), so no class can be
starved by another's demand. With ``backfill_share`` > 0 (off by default) a younger one may
pass a held one into room the held one cannot use yet, within that share of the instance's
budget and while its class is not ahead of its arrivals (backfilling: a small RLHF sample
need not wait behind a large session), counted in ``state()["backfill_admissions"]``. A
*class floor* guarantees each class ``class_floor_sessions`` protected sessions per instance
even when the budget is full: such a session may pass the queue and exceed R_w <= U_w
num_blocks; these are the only admissions that break Eq. 3,
at most ``class_floor_sessions`` per class and instance at a time, counted in
``state()["floor_admissions"]``.

Continuations (a request of a session already bound to a healthy instance) are admitted
there at once: no cap, no budget, no queue. A session whose instance went unhealthy
re-acquires admission like a new one but without queueing behind new sessions.

Placement among instances with room, MISA-T Eq. 1 with the prefix index's match
H_{r,w} and the reservation fill as the backlog term::

    c_w = (L_r - H_{r,w}) / block_size + balance_blocks * R_w(t) / (U_w num_blocks_w)
          + interference_blocks * |phi_b - Phi_w|

with the last term (off by default) keeping prefill-heavy classes (agent turns: new prompt
text, few output tokens) and decode-heavy ones (RLVR, RLHF) on separate instances where the
budget allows: phi_b is the class's measured prefill share of its requests' tokens, Phi_w
the mean over w's protected sessions (``interference_blocks``).

GRPO siblings share their group prompt, so a sibling follows the first one (longer match)
unless that instance is much fuller.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Literal

from router.estimators import BoundedHistory
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
from router.prefix_index import PrefixIndex


@dataclass(frozen=True)
class KvHorizonConfig:
    """Options of kv_horizon; the reason for each default is under it."""

    target_usage: float = 0.92
    """U: share of an instance's KV blocks the reservations may fill. vLLM preempts only at
    100%; 8% covers estimate error and the blocks of requests between two metric samples.
    Up to 2: above 1 the reservations overcommit the cache (a bet that not every session
    grows at once, where batching pays more than the engine's preemptions cost); give
    ``min_target_usage`` the same value or preemptions back it off below 1 at once."""
    min_target_usage: float = 0.6
    """Lowest U_w the preemption backoff goes to (below it, admission would idle the engine)."""
    backoff: float = 0.95
    """U_w <- U_w * 0.95 on a sample with new preemptions: a few preemptions cost a re-prefill
    each, so a small step per sample suffices; repeated ones compound."""
    recovery_per_s: float = 0.002
    """U_w regains 0.2 points per second without preemptions (about a minute per 10 points)."""
    current_from: Literal["metrics", "model"] = "metrics"
    """What running requests hold now: ``metrics`` = the engine's KV usage at the last fresh
    sample plus the prompts started since (exact up to one scrape; shared prefixes once);
    ``model`` = prompt + r_w x elapsed per request (over-counts requests waiting or
    preempted in the engine; used anyway when metrics are stale)."""
    growth_model: Literal["request", "session"] = "session"
    """What a protected session may add over ``horizon_s``: ``session`` = gamma_b x horizon,
    gamma_b the class's mean growth rate over whole sessions ((final - first prompt) tokens
    / residency s, completed sessions; r_w before 8), for running and idle sessions alike:
    agent sessions grow across turns and RLVR ones through their decode, and both keep
    growing past a short horizon; ``request`` = a running request's min(r_w horizon, out_b)
    and an idle session's mean turn growth (only the next minute: measured to admit too
    many sessions that grow later and preempt, see the module docstring)."""
    lifetime_floor: bool = True
    """Also reserve at least k̄_b per protected session of class b: the class's mean
    time-averaged footprint (Z_s / T_s, Eq. 2) over completed sessions, i.e. the instance
    reserves max(current + growth, Σ_b n_b k̄_b). Without it a young session commits only its
    prompt and a horizon of growth, so when load drops dozens enter at once, outgrow the
    pool together later and preempt (measured: 40 sessions per replica where 16 fit)."""
    footprint_prior_tokens: float = 32768.0
    """k̄_b before 8 sessions of class b completed (tokens, at the instance's block size): a
    long sample, so the start does not admit a flood of small young sessions."""
    footprint_prior_share: float = 0.125
    """...but at most this share of the instance's KV blocks: a prior is an assumption about
    sessions not yet seen, and one that fills an instance alone admits one session per class
    until 8 complete (measured on 2 real CPU engines of 64 blocks x 128 tokens: 32,768 tokens
    = 256 blocks per young session, 3 sessions per engine, KV usage 0.13). 1/8 starts an
    instance at 8 young sessions; the simulated replicas (1,280+ blocks of 256 tokens at
    scale 0.25) are larger than 8 x 32,768 tokens, so this cap does not bind there."""
    growth_bound: bool = True
    """g_s is at most G_b, the class's mean whole-session growth ((final - first prompt)
    tokens of completed sessions): a session is not expected to add more over the horizon
    than a whole session of its class adds in its life; before 8 of them completed, not more
    than the footprint prior (the lifetime floor's, at most ``footprint_prior_share`` of the
    instance): an unmeasured growth of r_w x ``horizon_s`` reserved most of an engine per
    young session (measured on 2 real CPU engines of 64 blocks: 2-3 requests running per
    engine and KV usage 0.1-0.3 for the first minute, while the vLLM Router ran 25; on the
    simulated replicas the prior is 32,768 tokens and binds only at the start: scale 1,
    seed 0, ceiling 192 gives 6.40 samples/min with it and without). Without it, where sessions live
    shorter than ``horizon_s`` the reservation is a multiple of what they ever hold
    (measured on 2 real CPU engines, sessions of 60-100 s: agent growth over 120 s reserved
    10 blocks per session whose whole footprint was 5, 5 sessions per engine at KV usage
    0.2). The simulated replicas' sessions live thousands of seconds, so there it does not
    bind."""
    growth_remaining: bool = True
    """A session reserves only the growth it has left, G_b minus what it grew already (prompt
    growth since its first request, plus r_w x elapsed decode of its running request), not a
    whole g_s on top of what it holds: the engine's count already includes what it grew.
    Without it a session near its end reserves a whole session's growth again (measured on
    the real-engine benchmark's trace in the simulator, 2 engines of 64 blocks: growth 19.4
    of a 65-block reservation for 10.3 running requests, KV usage 0.52, while the vLLM Router
    ran 22.8 requests at 0.88). Kept as sums per class, so a decision stays O(instances x
    classes): Σ_s min(g_s, max(0, G_b - grown_s)) is bounded by min(n_b g_b, max(0, Σ_s
    (G_b - grown_s))) over the class's idle sessions and its running requests that have not
    yet decoded G_b at r_w (those leave the sums, in start order, so a long decode cannot
    cancel other sessions' growth); prompt growth is clipped at G_b when a request starts.
    Applies to either ``growth_model``."""
    request_bound: bool = True
    """A session whose running request is its last (``X-Session-End``) reserves at most that
    request's ``max_tokens`` of growth, and at most own prompt + ``max_tokens`` as its lifetime
    footprint: the engine stops it there, so more is never needed. Without it a single-turn
    RLVR/RLHF sample of 256 output tokens reserved, before 8 of its class completed, the footprint
    prior and 120 s x 30 tok/s of growth: on the default recipe's 2 CPU engines (93 blocks of
    128 tokens) 4 young sessions filled an engine (reservation 112 blocks against a budget of
    84) while the vLLM Router ran 32, and the first iteration's generation took 217 s against
    144 s (3 seeds). Sums of bounds per class keep a decision O(instances x classes): the bound
    applied is min(c_b x g_b, Σ caps), never below the exact Σ min(g_b, cap_s). Where
    ``max_tokens`` is the exact output length (a trace replay), this bound is an oracle; the
    replay benchmark turns it off."""
    horizon_s: float = 120.0
    """Growth horizon: a few metric windows, short against RLVR decodes (tens of minutes).
    Screened on seeds 10-11 at scale 0.25 (step3.7-like): 30 s 2.80 samples/min, 120 s 2.92."""
    output_quantile: float = 0.75
    """out_b = this quantile of the class's completed-request outputs caps horizon growth, so
    short-output classes (agent turns) do not reserve a full horizon of decode."""
    decode_tokens_per_s_prior: float = 30.0
    """Per-sequence decode rate before any metric (a large MoE at ~60 sequences per replica)."""
    rate_smoothing: float = 0.2
    """Weight of the newest scrape in the decode rate r_w = Σ generated tokens / Σ running
    sequences x Δt over scrapes, each older scrape's terms scaled by (1 - rate_smoothing) per
    scrape since. Scrapes in which the counter did not move count too: vLLM's generation
    counter moves in bursts, and a mean of per-scrape rates that skipped them read 16.5
    tokens/s per sequence on the CPU engines where their counters over 5 s gave 7.5-8."""
    turn_growth_prior_tokens: float = 1024.0
    """Prompt growth per agent turn before 8 turns were seen (tool output + model output)."""
    history: int = 256
    """Samples kept per class for out_b and the turn growth (follows drift in a few hundred)."""
    backfill_share: float = 0.0
    """With > 0, a new session held behind an earlier held one may still enter an instance
    whose Eq. 3 budget has room for it, while the sessions admitted that way on the instance
    reserve (their k~_new at admission, until they end) at most this share of its budget,
    and only while its class holds at least its share of the new sessions seen among the held
    ones (:meth:`KvHorizonPolicy._fair_to_pass`): a small session (an RLHF sample) need not
    wait behind a large one that fits nowhere yet, the large one loses at most this share of
    the room it waits for (EASY-style backfilling), and no class gets ahead of its arrivals.
    Off by default: in strict arrival order every class waits the same queue time, so rlhf,
    whose sessions are short, completes at 2.8x the sweep-tuned vLLM Router's p50 time
    (step3.7-like, trainer ceiling 192, scale 1, seeds 0-2) where agent and rlvr are at 1.5x;
    0.05 brought it to 2.7x (qwen3.6-like at 144: 2.1x -> 2.0x) and cost 1.1-1.3 points of
    samples/min, within the seeds' spread (README "Which router to pick"). Without the
    class-share rule rlhf passed freely at trainer ceiling 512 and the consumed mixture
    moved 3.7 points from the target (screening seeds 10-11)."""
    class_floor_sessions: int = 1
    """Protected sessions per class and instance that are admitted even when the budget is
    full: a class is never starved (MISA-T keeps caps >= 1 for the same reason)."""
    waiting_limit: int = 8
    """No new session on an instance whose waiting queue is longer: it is already behind
    (a few waiting prefills are normal under chunked prefill)."""
    balance_blocks: float = 64.0
    """Eq. 1 backlog weight: a full instance costs as much as 64 uncached prompt blocks."""
    interference_blocks: float = 0.0
    """Placement weight of prefill-decode interference, in blocks: a new class-b session
    costs ``interference_blocks x |phi_b - Phi_w|`` more on instance w, with phi_b the class's
    prefill share (:meth:`KvHorizonPolicy.prefill_share`: tokens a request adds to its
    session's prompt over those plus its output, over the class's last ``history`` finished
    requests, once 8 finished) and Phi_w the mean phi of w's protected sessions. An engine
    step batches every running sequence's next token with the prefill chunks scheduled in
    it, so a decode-heavy sample (RLVR, RLHF: short prompt, long output) on an instance that
    also prefills agent turns (long new prompt text, a few output tokens) waits each token for
    those chunks; kept apart, like with like, the decode-heavy classes get short steps.
    Measured on 2 real CPU engines (bench.router_real, seeds 0-2, after 5 min; README "Where
    rlvr and rlhf wait"): 64 at trainer ceiling 20 took rlvr/rlhf from 0.185/0.201 s per
    output token (0 at 24) to 0.139/0.159, samples/min unchanged; the ceiling changed too, and
    where the KV budget binds (ceiling 24 in the simulator) the agents spill onto the decode
    engine and it does little; on the simulator's paper shapes (scale 1, seeds 0-2) 64 moved
    samples/min by -0.5% and each class's p50 by under 1.5%. Alone at c=20 it did as little
    (stop 50). 256 with ``target_usage`` 1.1 at c=20 kept the agents on one engine (README
    "Agents kept on one engine"): rlvr 0.131 s per token, still 2.00x the vLLM Router's p50,
    and the agents' engine became the bottleneck (-5.5% samples/min against the vLLM Router
    at 16). Off (0) by default: no setting measured helps both."""
    fallback_num_blocks: int = 364
    """KV blocks assumed before an instance reports its size (the smallest engine here)."""
    block_size_fallback_tokens: int = 16
    """Tokens per block until an instance reports it (vLLM's GPU default)."""
    metrics_stale_s: float = 10.0
    """A sample older than this gives no fast or slow signal (a few scrape periods)."""
    recheck_s: float = 0.5
    """Recheck delay of a held new session (half a scrape period)."""
    no_healthy_recheck_s: float = 1.0
    """Recheck delay when no instance is healthy (a health-probe period)."""
    idle_timeout_s: float = 120.0
    """A protected session with nothing in flight this long ends (longer than tool gaps)."""
    held_forget_s: float = 300.0
    """A held session not re-decided for this long is dropped (its caller gave up); at least
    ``recheck_s`` and ``no_healthy_recheck_s``, or one would be dropped between two rechecks."""

    def __post_init__(self) -> None:
        bad = []
        if not 0 < self.min_target_usage <= self.target_usage <= 2:
            bad.append(f"need 0 < min_target_usage <= target_usage <= 2, got {self.min_target_usage} and "
                       f"{self.target_usage}")
        ranges = {"backoff": (0, 1, False), "rate_smoothing": (0, 1, True), "output_quantile": (0, 1, True),
                  "footprint_prior_share": (0, 1, True)}
        for name, (low, high, closed) in ranges.items():
            v = getattr(self, name)
            if not (low < v <= high if closed else low < v < high):
                bad.append(f"{name} must be in ({low}, {high}{']' if closed else ')'}, got {v}")
        if not 0 <= self.backfill_share <= 1:
            bad.append(f"backfill_share must be in [0, 1], got {self.backfill_share}")
        bad += option_bound_errors(
            self,
            positive=("horizon_s", "decode_tokens_per_s_prior", "footprint_prior_tokens", "metrics_stale_s", "recheck_s",
                      "no_healthy_recheck_s", "idle_timeout_s", "held_forget_s"),
            non_negative=("recovery_per_s", "turn_growth_prior_tokens", "balance_blocks", "interference_blocks",
                          "class_floor_sessions", "waiting_limit"),
            at_least_one=("history", "fallback_num_blocks", "block_size_fallback_tokens"),
            # else a held session is forgotten between two rechecks
            not_below=(("held_forget_s", "recheck_s"), ("held_forget_s", "no_healthy_recheck_s")))
        if bad:
            raise ValueError("; ".join(bad))


_HELD, _BOUND, _LOOSE = "held", "bound", "loose"
"""Session states: held (waiting for admission), bound to an instance, loose (never
admitted yet, or its instance went away: it must acquire admission)."""


class _Session:
    """One unfinished session (mutable; the policy's own ledger)."""

    __slots__ = ("session_id", "workload_class", "state", "instance", "running", "start_s", "prompt_blocks",
                 "last_blocks", "shared_blocks", "last_activity_s", "held_since_s", "last_decided_s", "floor",
                 "rebound", "first_tokens", "admitted_s", "block_seconds", "last_t", "last_blocks_seen",
                 "cap_blocks", "first_own_blocks", "grown_blocks", "growing", "backfill_blocks")

    def __init__(self, session_id: str, workload_class: str, now: float) -> None:
        self.session_id = session_id
        self.workload_class = workload_class
        self.state = _LOOSE
        self.instance: str | None = None
        self.running = 0  # requests in flight
        self.start_s = 0.0  # start of the running request
        self.prompt_blocks = 0  # own prompt blocks of the running request (shared prefix excluded)
        self.last_blocks = 0  # own blocks after its last finished request
        self.shared_blocks = 0  # blocks matched on its instance when first admitted (shared prefix)
        self.last_activity_s = now
        self.held_since_s: float | None = None
        self.last_decided_s = now
        self.floor = False
        self.rebound = False
        self.first_tokens: int | None = None  # prompt tokens of its first request
        self.admitted_s: float | None = None
        self.block_seconds = 0.0  # Z_s = ∫ k_s dt so far (piecewise linear between request events)
        self.last_t: float | None = None
        self.last_blocks_seen = 0
        self.cap_blocks: float | None = None  # max_tokens blocks of a running last request (request_bound)
        self.first_own_blocks = 0  # own prompt blocks of its first request
        self.grown_blocks = 0.0  # min(own blocks now - first_own_blocks, G_b) in its instance's sums (growth_remaining)
        self.growing = False  # running and counted in its instance's growing sums (growth_remaining)
        self.backfill_blocks = 0.0  # k~_new it was admitted with past the queue (backfill_share), else 0

    def integrate(self, now: float, blocks: int) -> None:
        """Add the trapezoid from the last observation to (now, blocks) to Z_s."""
        if self.last_t is not None and now > self.last_t:
            self.block_seconds += 0.5 * (self.last_blocks_seen + blocks) * (now - self.last_t)
        self.last_t, self.last_blocks_seen = now, blocks


class _InstanceLoad:
    """Per-instance sums behind Σ k~_s(t) (see the module docstring), kept incrementally."""

    __slots__ = ("running", "sum_start_s", "prompt_blocks", "running_by_class", "idle_blocks", "idle_by_class",
                 "sessions_by_class", "floor_by_class", "target", "rate", "rate_tokens", "rate_seq_s",
                 "last_metrics", "last_sample_s", "recent",
                 "recent_blocks", "closing_by_class", "closing_growth", "closing_peak", "grown",
                 "start_by_class", "growing_count", "growing", "backfill_blocks")

    def __init__(self, target: float, rate: float) -> None:
        self.running = 0
        self.sum_start_s = 0.0
        self.prompt_blocks = 0
        self.running_by_class: dict[str, int] = {}
        self.idle_blocks = 0
        self.idle_by_class: dict[str, int] = {}
        self.sessions_by_class: dict[str, int] = {}
        self.floor_by_class: dict[str, int] = {}
        self.target = target  # U_w
        self.rate = rate  # r_w, tokens/s per sequence
        self.rate_tokens = 0.0  # decayed Σ generated tokens behind r_w
        self.rate_seq_s = 0.0  # decayed Σ running sequences x Δt (sequence-seconds)
        self.last_metrics: InstanceMetrics | None = None
        self.last_sample_s: float | None = None
        self.recent: deque[tuple[float, int]] = deque()  # (start s, own prompt blocks) since the last sample
        self.recent_blocks = 0
        # running last requests with a known max_tokens (request_bound), per class:
        self.closing_by_class: dict[str, int] = {}
        self.closing_growth: dict[str, float] = {}  # Σ max_tokens / block_size
        self.closing_peak: dict[str, float] = {}  # Σ own prompt blocks + max_tokens / block_size
        # growth_remaining, per class: Σ grown_blocks of idle sessions and growing running ones
        # (a running request is growing until it decoded G_b), Σ start_s and count of the growing
        # running ones, and those in start order (entries of requests that stopped are skipped)
        self.grown: dict[str, float] = {}
        self.start_by_class: dict[str, float] = {}
        self.growing_count: dict[str, int] = {}
        self.growing: dict[str, deque[tuple[float, _Session]]] = {}
        self.backfill_blocks = 0.0  # Σ k~_new of its sessions admitted past the queue (backfill_share)


def _bump(counts: dict, key: str, by: float) -> None:
    n = counts.get(key, 0) + by
    if abs(n) > 1e-9:
        counts[key] = n
    else:
        counts.pop(key, None)


class KvHorizonPolicy:
    """Admission by current KV plus horizon growth, arrival order, class floors (module docstring)."""

    name = "kv_horizon"

    def __init__(self, config: KvHorizonConfig | None = None) -> None:
        self.config = config or KvHorizonConfig()
        cfg = self.config
        self.stats = PolicyStats()
        self.index = PrefixIndex()
        self.sessions: dict[str, _Session] = {}
        self.loads: dict[str, _InstanceLoad] = {}
        self.held: OrderedDict[str, _Session] = OrderedDict()  # new sessions, arrival order
        self._held_by_class: dict[str, int] = {}
        self._arrived_by_class: dict[str, int] = {}  # new sessions seen, per class (backfill_share)
        self._idle: OrderedDict[str, _Session] = OrderedDict()  # bound, nothing in flight, by last activity
        self.outputs: dict[str, BoundedHistory] = {}  # per class: completion tokens per request
        self.turn_growth: dict[str, BoundedHistory] = {}  # per class: prompt growth per turn (tokens)
        self._last_prompt: dict[str, int] = {}  # session -> prompt + output tokens of its last request
        self.session_growth: dict[str, BoundedHistory] = {}  # per class: gamma_b samples (tokens/s)
        self.whole_growth: dict[str, BoundedHistory] = {}  # per class: G_b samples (tokens per session)
        self.footprints: dict[str, BoundedHistory] = {}  # per class: Z_s / T_s of completed sessions (blocks)
        self.added_tokens: dict[str, BoundedHistory] = {}  # per class: prompt tokens a request added (phi_b)
        self.output_tokens: dict[str, BoundedHistory] = {}  # per class: its output tokens, same requests
        self._block_size: dict[str, int] = {}
        self._num_blocks: dict[str, int] = {}
        self._now = 0.0
        self.counters = {"continuations": 0, "rebinds": 0, "floor_admissions": 0, "over_budget_admissions": 0,
                         "backfill_admissions": 0,
                         "holds_budget": 0, "holds_queue": 0, "holds_signal": 0, "backoffs": 0,
                         "idle_expired": 0, "abandoned_holds": 0}
        self._fallback_rate = cfg.decode_tokens_per_s_prior

    # ----------------------------------------------------------------- estimates

    def _load(self, instance: str) -> _InstanceLoad:
        load = self.loads.get(instance)
        if load is None:
            load = self.loads[instance] = _InstanceLoad(self.config.target_usage, self._fallback_rate)
        return load

    def _bs(self, instance: str) -> int:
        return self._block_size.get(instance, self.config.block_size_fallback_tokens)

    def _out_tokens(self, workload_class: str) -> float | None:
        h = self.outputs.get(workload_class)
        return h.quantile(self.config.output_quantile) if h is not None and len(h) >= 8 else None

    def _turn_tokens(self, workload_class: str) -> float:
        h = self.turn_growth.get(workload_class)
        return h.mean() if h is not None and len(h) >= 8 else self.config.turn_growth_prior_tokens

    def _footprint_blocks(self, workload_class: str, instance: str) -> float:
        """k̄_b on ``instance``: the mean time-averaged footprint of completed class-b sessions
        (blocks), or before 8 of them the prior, at most ``footprint_prior_share`` of the
        instance's blocks."""
        h = self.footprints.get(workload_class)
        if h is not None and len(h) >= 8:
            return h.mean()
        cfg = self.config
        return min(cfg.footprint_prior_tokens / self._bs(instance),
                   cfg.footprint_prior_share * self._num_blocks.get(instance, cfg.fallback_num_blocks))

    def _session_growth_blocks(self, load: _InstanceLoad, workload_class: str, bs: int, instance: str) -> float:
        """min(gamma_b x horizon, G_b) in blocks (``growth_model: session``). With
        ``growth_bound``: G_b once 8 sessions of the class completed, before that the
        class's footprint prior on ``instance`` (:meth:`_footprint_blocks`)."""
        h = self.session_growth.get(workload_class)
        rate = h.mean() if h is not None and len(h) >= 8 else load.rate
        blocks = rate * self.config.horizon_s / bs
        if self.config.growth_bound:
            blocks = min(blocks, self._whole_growth_blocks(workload_class, bs, instance))
        return blocks

    def _whole_growth_blocks(self, workload_class: str, bs: int, instance: str) -> float:
        """G_b in blocks: the mean (final - first prompt) tokens of completed class-b sessions
        once 8 completed, before that the class's footprint prior on ``instance``."""
        whole = self.whole_growth.get(workload_class)
        return (whole.mean() / bs if whole is not None and len(whole) >= 8
                else self._footprint_blocks(workload_class, instance))

    def _remaining_blocks(self, load: _InstanceLoad, workload_class: str, bs: int, instance: str, now: float,
                          idle: int) -> float:
        """Upper bound of Σ_s max(0, G_b - grown_s) over the class-b sessions of ``instance``
        (``growth_remaining``, see its docstring), in blocks: a running request that decoded
        G_b at r_w has nothing left and leaves the sums (so its further decode cannot lower
        the others'); the rest count n G_b - Σ grown - r_w Σ (now - start) / block_size."""
        whole = self._whole_growth_blocks(workload_class, bs, instance)
        queue = load.growing.get(workload_class)
        limit = whole * bs / max(load.rate, 1e-9)  # seconds of decode that add G_b
        while queue and (now - queue[0][0] >= limit or not queue[0][1].growing or queue[0][1].start_s != queue[0][0]):
            start_s, rec = queue.popleft()
            if rec.growing and rec.start_s == start_s:
                self._ungrow(rec, load)
        running = load.growing_count.get(workload_class, 0)
        grown = load.grown.get(workload_class, 0.0)
        decoded = load.rate * max(0.0, running * now - load.start_by_class.get(workload_class, 0.0)) / bs
        return max(0.0, (running + idle) * whole - grown - decoded)

    def _cap_blocks(self, request: Request, bs: int) -> float | None:
        """max_tokens / block_size of a session's last request (``request_bound``), else None."""
        if self.config.request_bound and request.session_end and request.max_tokens:
            return request.max_tokens / bs
        return None

    def _growth_blocks(self, load: _InstanceLoad, workload_class: str, bs: int, instance: str) -> float:
        """g_s of a new or running session of ``workload_class`` on ``instance``, in blocks."""
        if self.config.growth_model == "session":
            return self._session_growth_blocks(load, workload_class, bs, instance)
        tokens = load.rate * self.config.horizon_s
        out = self._out_tokens(workload_class)
        if out is not None:
            tokens = min(tokens, out)
        return tokens / bs

    def prefill_share(self, workload_class: str) -> float | None:
        """phi_b (``interference_blocks``): mean prompt tokens a class-b request added to its
        session (its prompt less the session's previous prompt + output, or for a first
        request less the blocks it matched on its instance) over that plus its mean output
        tokens, over the last ``history`` finished requests; in [0, 1]; None before 8."""
        added, out = self.added_tokens.get(workload_class), self.output_tokens.get(workload_class)
        if added is None or out is None or len(added) < 8:
            return None
        a, o = added.mean(), out.mean()
        return a / (a + o) if a + o > 0 else None

    def _mix_share(self, load: _InstanceLoad) -> float | None:
        """Phi_w: the mean phi_b of the instance's protected sessions (classes with a phi_b),
        None when it has none."""
        total = weight = 0.0
        for b, n in load.sessions_by_class.items():
            phi = self.prefill_share(b)
            if phi is not None and n > 0:
                total, weight = total + n * phi, weight + n
        return total / weight if weight else None

    def reserved_blocks(self, instance: str, now: float) -> float:
        """Σ_{s on w} k~_s(t): what the protected sessions of ``instance`` hold and may add (blocks).

        The part running requests hold now is, with a fresh sample, the engine's own count
        (KV usage x blocks at the sample) plus the own prompt blocks of requests started
        since; without one, the model (prompt + decode so far at r_w)."""
        load = self._load(instance)
        bs = self._bs(instance)
        m = load.last_metrics
        if (self.config.current_from == "metrics" and m is not None and load.last_sample_s is not None
                and now - load.last_sample_s <= self.config.metrics_stale_s):
            held = m.kv_cache_usage * self._num_blocks.get(instance, self.config.fallback_num_blocks) + load.recent_blocks
        else:
            held = load.prompt_blocks + load.rate * max(0.0, load.running * now - load.sum_start_s) / bs  # Σ d_s(t)
        growth = 0.0
        for b in load.sessions_by_class:
            n, i = load.running_by_class.get(b, 0), load.idle_by_class.get(b, 0)
            g, c = self._growth_blocks(load, b, bs, instance), load.closing_by_class.get(b, 0)
            grows = (n - c) * g + min(c * g, load.closing_growth.get(b, 0.0))  # request_bound
            if self.config.growth_model == "session":
                grows += i * self._session_growth_blocks(load, b, bs, instance)  # idle sessions' next turns
            else:
                grows += i * self._turn_tokens(b) / bs
            if self.config.growth_remaining:  # no more than the class's sessions have left
                grows = min(grows, self._remaining_blocks(load, b, bs, instance, now, i))
            growth += grows
        reserved = held + growth + load.idle_blocks
        if self.config.lifetime_floor:
            committed = 0.0
            for b, n in load.sessions_by_class.items():
                k, c = self._footprint_blocks(b, instance), load.closing_by_class.get(b, 0)
                committed += (n - c) * k + min(c * k, load.closing_peak.get(b, 0.0))  # request_bound
            reserved = max(reserved, committed)  # max(current + growth, Σ_b n_b k̄_b)
        return reserved

    def budget_blocks(self, instance: str) -> float:
        """U_w * num_blocks_w."""
        return self._load(instance).target * self._num_blocks.get(instance, self.config.fallback_num_blocks)

    def _signal_blocks(self, view: InstanceView) -> str | None:
        """Why fresh metrics of ``view`` forbid new sessions now (None: they do not)."""
        m = view.metrics
        if m is None or view.metrics_age_s is None or view.metrics_age_s > self.config.metrics_stale_s:
            return None
        if m.num_requests_waiting > self.config.waiting_limit:
            return "waiting queue"
        if m.kv_cache_usage > self._load(view.instance).target:
            return "KV usage above target"
        return None

    # ----------------------------------------------------------------- decide

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Continuation: its instance. New session: the cheapest instance with room, in arrival order."""
        self._advance(now)
        cfg = self.config
        rec = self.sessions.get(request.session_id)
        healthy = view.healthy()
        if rec is not None and rec.state == _BOUND:
            if any(v.instance == rec.instance for v in healthy):
                self.stats.admits += 1
                self.counters["continuations"] += 1
                return Admit(rec.instance, reason="continuation")
            self._unbind(rec)
            rec.rebound = True
            self.counters["rebinds"] += 1
        if rec is None:
            rec = self.sessions[request.session_id] = _Session(request.session_id, request.workload_class, now)
            _bump(self._arrived_by_class, rec.workload_class, 1)
        rec.last_decided_s = now
        if not healthy:
            return self._hold(rec, now, cfg.no_healthy_recheck_s, "no healthy instance", None)
        behind = not rec.rebound and self._earlier_held(rec) is not None
        may_pass = behind and cfg.backfill_share > 0 and self._fair_to_pass(rec)
        matched = self.index.longest_prefix_match(request.block_hashes) if request.block_hashes else {}
        best, best_cost, best_need, floor_pick, why = None, math.inf, 0.0, None, "budget"
        phi = self.prefill_share(rec.workload_class) if cfg.interference_blocks > 0 else None
        for v in healthy:
            w = v.instance
            load = self._load(w)
            if load.sessions_by_class.get(rec.workload_class, 0) < cfg.class_floor_sessions:
                floor_pick = floor_pick or v
            if behind and not may_pass:
                continue
            signal = self._signal_blocks(v)
            if signal is not None:
                why = "signal"
                continue
            bs = self._bs(w)
            shared = matched.get(w, 0)
            own = max(0, request.prompt_tokens // bs - shared)
            cap = self._cap_blocks(request, bs)
            growth = self._growth_blocks(load, rec.workload_class, bs, w)
            need = own + (growth if cap is None else min(growth, cap))  # k~_new
            if cfg.lifetime_floor:
                floor_k = self._footprint_blocks(rec.workload_class, w)
                need = max(need, floor_k if cap is None else min(floor_k, own + cap))
            reserved, budget = self.reserved_blocks(w, now), self.budget_blocks(w)
            if reserved + need > budget:  # Σ k~_s + k~_new <= U_w num_blocks  (Eq. 3)
                continue
            if behind and load.backfill_blocks + need > cfg.backfill_share * budget:
                continue  # past the queue only within the backfill share
            cost = own + cfg.balance_blocks * reserved / max(budget, 1e-9)  # c_w (Eq. 1, in blocks)
            if phi is not None:  # prefill-decode interference: like with like
                mix = self._mix_share(load)
                if mix is not None:
                    cost += cfg.interference_blocks * abs(phi - mix)
            if cost < best_cost:
                best, best_cost, best_need = v, cost, need
        if best is not None:
            return self._admit(rec, request, best.instance, matched, now, floor=False,
                               backfill=best_need if behind else None)
        if floor_pick is not None:
            return self._admit(rec, request, floor_pick.instance, matched, now, floor=True)
        if behind:
            return self._hold(rec, now, cfg.recheck_s, "behind an earlier held session", "holds_queue")
        return self._hold(rec, now, cfg.recheck_s, f"no instance with room ({why})",
                          "holds_signal" if why == "signal" else "holds_budget")

    def _fair_to_pass(self, rec: _Session) -> bool:
        """Whether ``rec``'s class may pass the queue (``backfill_share``): only while it holds
        at least its share of the new sessions seen so far among the held ones, ``rec``
        counted, H_b >= (N_b / N) H. A class whose sessions pass does not get ahead of its
        arrivals, so the admitted (and completed) mixture keeps the released one even when
        the queue is deep; without this rule, at trainer ceiling 512 rlhf passed freely and the
        consumed mixture moved 3.7 points from the target. The shares count from the policy's
        start, so after a workload shift they follow the new mix only slowly."""
        b = rec.workload_class
        extra = 0 if rec.state == _HELD else 1
        held_b, held = self._held_by_class.get(b, 0) + extra, len(self.held) + extra
        arrived = sum(self._arrived_by_class.values())
        return arrived > 0 and held_b * arrived >= self._arrived_by_class.get(b, 0) * held

    def _earlier_held(self, rec: _Session) -> _Session | None:
        for head in self.held.values():
            return None if head is rec else head
        return None

    def _admit(self, rec: _Session, request: Request, instance: str, matched: dict[str, int], now: float,
               floor: bool, backfill: float | None = None) -> Admit:
        """Bind ``rec`` to ``instance``; ``backfill``: the k~_new it passed the queue with (None: it did not)."""
        self._unhold(rec)
        load = self._load(instance)
        bs = self._bs(instance)
        rec.state, rec.instance, rec.held_since_s, rec.floor = _BOUND, instance, None, floor
        if not rec.rebound:
            rec.shared_blocks = min(matched.get(instance, 0), request.prompt_tokens // bs)
            rec.first_tokens, rec.admitted_s = request.prompt_tokens, now
            rec.first_own_blocks = max(0, request.prompt_tokens // bs - rec.shared_blocks)
            rec.integrate(now, 0)
        _bump(load.sessions_by_class, rec.workload_class, 1)
        if floor:
            _bump(load.floor_by_class, rec.workload_class, 1)
            self.counters["floor_admissions"] += 1
        if backfill is not None:
            rec.backfill_blocks = backfill
            load.backfill_blocks += backfill
            self.counters["backfill_admissions"] += 1
        # reserved from the admission on (RequestStarted, which follows, restates it)
        if rec.running:
            self._stop_running(rec, load)
        self._start_running(rec, load, max(0, request.prompt_tokens // bs - rec.shared_blocks), now,
                            self._cap_blocks(request, bs))
        if floor and self.reserved_blocks(instance, now) > self.budget_blocks(instance):
            self.counters["over_budget_admissions"] += 1  # the only admissions that break Eq. 3
        self.stats.admits += 1
        return Admit(instance, reason=("floor " if floor else "backfill " if backfill is not None else "")
                     + ("rebound" if rec.rebound else "new"))

    def _unhold(self, rec: _Session) -> None:
        """``rec`` leaves the queue of held new sessions (admitted, or ended), if it is in it."""
        if rec.state == _HELD:
            del self.held[rec.session_id]
            _bump(self._held_by_class, rec.workload_class, -1)

    def _hold(self, rec: _Session, now: float, recheck_s: float, reason: str, counter: str | None) -> Hold:
        if rec.state != _HELD:
            rec.state, rec.held_since_s = _HELD, now
            self.held[rec.session_id] = rec
            _bump(self._held_by_class, rec.workload_class, 1)
        if counter:
            self.counters[counter] += 1
        self.stats.holds += 1
        return Hold(recheck_s, reason=reason)

    # ----------------------------------------------------------------- ledger

    def _grown(self, rec: _Session, own_blocks: int) -> float:
        """min(own_blocks - first own prompt blocks, G_b) of bound ``rec`` (0 without ``growth_remaining``)."""
        if not self.config.growth_remaining:
            return 0.0
        whole = self._whole_growth_blocks(rec.workload_class, self._bs(rec.instance), rec.instance)
        return min(max(0.0, float(own_blocks - rec.first_own_blocks)), whole)

    def _idle_add(self, rec: _Session, load: _InstanceLoad) -> None:
        load.idle_blocks += rec.last_blocks
        _bump(load.idle_by_class, rec.workload_class, 1)
        rec.grown_blocks = self._grown(rec, rec.last_blocks)
        _bump(load.grown, rec.workload_class, rec.grown_blocks)
        self._idle.pop(rec.session_id, None)
        self._idle[rec.session_id] = rec

    def _idle_remove(self, rec: _Session, load: _InstanceLoad) -> None:
        load.idle_blocks -= rec.last_blocks
        _bump(load.idle_by_class, rec.workload_class, -1)
        _bump(load.grown, rec.workload_class, -rec.grown_blocks)
        self._idle.pop(rec.session_id, None)

    def _unbind(self, rec: _Session) -> None:
        """``rec`` leaves its instance's sums (it ended, or its instance went away)."""
        if rec.state != _BOUND:
            return
        load = self._load(rec.instance)
        if rec.running:
            self._stop_running(rec, load)
        else:
            self._idle_remove(rec, load)
        _bump(load.sessions_by_class, rec.workload_class, -1)
        if rec.floor:
            _bump(load.floor_by_class, rec.workload_class, -1)
        if rec.backfill_blocks:
            load.backfill_blocks = max(0.0, load.backfill_blocks - rec.backfill_blocks)
            rec.backfill_blocks = 0.0
        rec.state, rec.instance, rec.running, rec.floor = _LOOSE, None, 0, False

    def _start_running(self, rec: _Session, load: _InstanceLoad, prompt_blocks: int, now: float,
                       cap_blocks: float | None = None) -> None:
        rec.running, rec.start_s, rec.prompt_blocks, rec.cap_blocks = 1, now, prompt_blocks, cap_blocks
        if cap_blocks is not None:
            _bump(load.closing_by_class, rec.workload_class, 1)
            _bump(load.closing_growth, rec.workload_class, cap_blocks)
            _bump(load.closing_peak, rec.workload_class, prompt_blocks + cap_blocks)
        load.running += 1
        load.sum_start_s += now
        load.prompt_blocks += prompt_blocks
        _bump(load.running_by_class, rec.workload_class, 1)
        if self.config.growth_remaining:
            rec.grown_blocks, rec.growing = self._grown(rec, prompt_blocks), True
            _bump(load.grown, rec.workload_class, rec.grown_blocks)
            _bump(load.start_by_class, rec.workload_class, now)
            _bump(load.growing_count, rec.workload_class, 1)
            load.growing.setdefault(rec.workload_class, deque()).append((now, rec))
        load.recent.append((now, prompt_blocks))
        load.recent_blocks += prompt_blocks

    def _stop_running(self, rec: _Session, load: _InstanceLoad) -> None:
        load.running -= 1
        load.sum_start_s -= rec.start_s
        load.prompt_blocks -= rec.prompt_blocks
        _bump(load.running_by_class, rec.workload_class, -1)
        if rec.growing:
            self._ungrow(rec, load)
        if rec.cap_blocks is not None:
            _bump(load.closing_by_class, rec.workload_class, -1)
            _bump(load.closing_growth, rec.workload_class, -rec.cap_blocks)
            _bump(load.closing_peak, rec.workload_class, -(rec.prompt_blocks + rec.cap_blocks))
            rec.cap_blocks = None

    @staticmethod
    def _ungrow(rec: _Session, load: _InstanceLoad) -> None:
        """``rec``'s running request leaves the growing sums (it stopped, or decoded G_b)."""
        _bump(load.grown, rec.workload_class, -rec.grown_blocks)
        _bump(load.start_by_class, rec.workload_class, -rec.start_s)
        _bump(load.growing_count, rec.workload_class, -1)
        rec.growing = False

    def _end(self, session_id: str) -> None:
        rec = self.sessions.pop(session_id, None)
        self._last_prompt.pop(session_id, None)
        if rec is None:
            return
        self._unhold(rec)
        self._unbind(rec)
        self._idle.pop(session_id, None)

    def _advance(self, now: float) -> None:
        """Expire idle sessions and abandoned holds up to ``now``."""
        self._now = max(self._now, now)
        cfg = self.config
        while self._idle:
            sid, rec = next(iter(self._idle.items()))
            if now - rec.last_activity_s < cfg.idle_timeout_s:
                break
            self.counters["idle_expired"] += 1
            self._end(sid)
        while self.held:
            sid, rec = next(iter(self.held.items()))
            if now - rec.last_decided_s < cfg.held_forget_s:
                break
            self.counters["abandoned_holds"] += 1
            self._end(sid)

    # ----------------------------------------------------------------- observe

    def observe(self, event: Event) -> None:
        """Sessions' sizes from request events, the prefix index from KV events, U_w and r_w from metrics."""
        self._advance(event.now)
        if isinstance(event, RequestStarted):
            self._on_started(event)
        elif isinstance(event, RequestFinished):
            self._on_finished(event)
        elif isinstance(event, SessionEnded):
            self._end(event.session_id)
        elif isinstance(event, BlocksStored):
            self.index.store(event.instance, event.block_hashes)
        elif isinstance(event, BlocksRemoved):
            self.index.remove(event.instance, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.index.clear(event.instance)
        elif isinstance(event, MetricsSampled):
            self._on_metrics(event)
        elif isinstance(event, InstanceHealthChanged) and not event.healthy:
            for rec in [r for r in self.sessions.values() if r.instance == event.instance]:
                self._unbind(rec)
                rec.rebound = True
                self.counters["rebinds"] += 1

    def _on_started(self, event: RequestStarted) -> None:
        rec = self.sessions.get(event.request.session_id)
        if rec is None or rec.state != _BOUND or rec.instance != event.instance:
            return
        load = self._load(event.instance)
        bs = self._bs(event.instance)
        tokens = event.request.prompt_tokens
        last = self._last_prompt.get(rec.session_id)
        if last is not None and tokens > last:
            self.turn_growth.setdefault(rec.workload_class, BoundedHistory(self.config.history)).append(tokens - last)
        if rec.running:  # restates the admission's accounting (or a second request in flight: its latest prompt)
            self._stop_running(rec, load)
            if (rec.start_s, rec.prompt_blocks) in load.recent:
                load.recent.remove((rec.start_s, rec.prompt_blocks))
                load.recent_blocks -= rec.prompt_blocks
        else:
            self._idle_remove(rec, load)
        self._start_running(rec, load, max(0, tokens // bs - rec.shared_blocks), event.now,
                            self._cap_blocks(event.request, bs))
        rec.integrate(event.now, max(rec.last_blocks_seen, -(-tokens // bs)))
        rec.last_activity_s = event.now

    def _on_finished(self, event: RequestFinished) -> None:
        req = event.request
        rec = self.sessions.get(req.session_id)
        if not event.instance:  # dropped before admission: its client left
            if rec is not None and rec.state == _HELD and not rec.running:
                self.counters["abandoned_holds"] += 1
                self._end(req.session_id)
            return
        if event.ok and event.completion_tokens:
            self.outputs.setdefault(req.workload_class, BoundedHistory(self.config.history)).append(
                event.completion_tokens)
        if rec is None or rec.state != _BOUND or rec.instance != event.instance or not rec.running:
            return
        prompt = event.prompt_tokens or req.prompt_tokens
        total = prompt + event.completion_tokens
        rec.integrate(event.now, -(-total // self._bs(event.instance)))
        if event.ok:  # phi_b's sample: what this request added to its session's prompt, and its output
            last = self._last_prompt.get(rec.session_id)
            added = prompt - (last if last is not None else rec.shared_blocks * self._bs(event.instance))
            self.added_tokens.setdefault(req.workload_class, BoundedHistory(self.config.history)).append(max(0, added))
            self.output_tokens.setdefault(req.workload_class, BoundedHistory(self.config.history)).append(
                event.completion_tokens)
        if req.session_end:
            if rec.first_tokens is not None and rec.admitted_s is not None and event.now > rec.admitted_s:
                residency = event.now - rec.admitted_s
                grown = max(0, total - rec.first_tokens)  # tokens the session added in its life
                self.session_growth.setdefault(rec.workload_class, BoundedHistory(self.config.history)).append(
                    grown / residency)  # gamma_b sample
                self.whole_growth.setdefault(rec.workload_class, BoundedHistory(self.config.history)).append(grown)
                self.footprints.setdefault(rec.workload_class, BoundedHistory(self.config.history)).append(
                    rec.block_seconds / residency)  # Z_s / T_s  (MISA-T Eq. 2)
            self._end(req.session_id)
            return
        load = self._load(event.instance)
        bs = self._bs(event.instance)
        self._last_prompt[rec.session_id] = total
        self._stop_running(rec, load)
        rec.running = 0
        rec.last_blocks = max(0, -(-total // bs) - rec.shared_blocks)
        rec.last_activity_s = event.now
        self._idle_add(rec, load)

    def _on_metrics(self, event: MetricsSampled) -> None:
        cfg, m, w = self.config, event.metrics, event.instance
        load = self._load(w)
        if m.block_size:
            self._block_size[w] = m.block_size
        if m.num_blocks:
            self._num_blocks[w] = m.num_blocks
        prev, prev_s = load.last_metrics, load.last_sample_s
        if prev_s is not None and event.now < prev_s:
            return  # an older sample delivered late
        load.last_metrics, load.last_sample_s = m, event.now
        while load.recent and load.recent[0][0] <= event.now:  # now inside the engine's own count
            load.recent_blocks -= load.recent.popleft()[1]
        if prev is None or prev_s is None or event.now <= prev_s:
            return
        dt = event.now - prev_s
        generated = max(0.0, m.generation_tokens_total - prev.generation_tokens_total)
        # the larger running count of the two ends: a sequence that joined in the window is
        # counted whole (r_w errs low, which reserves less growth, not more)
        seq_s = max(m.num_requests_running, prev.num_requests_running) * dt
        if generated > 0 or seq_s > 0:  # r_w = Σ Δgen / Σ running Δt, older scrapes decayed
            keep = 1.0 - cfg.rate_smoothing
            load.rate_tokens = keep * load.rate_tokens + generated
            load.rate_seq_s = keep * load.rate_seq_s + seq_s
            if load.rate_tokens > 0 and load.rate_seq_s > 0:
                load.rate = load.rate_tokens / load.rate_seq_s
        if m.num_preemptions_total > prev.num_preemptions_total:  # fast signal: U_w backs off
            load.target = max(cfg.min_target_usage, load.target * cfg.backoff)
            self.counters["backoffs"] += 1
        elif m.num_preemptions_total >= prev.num_preemptions_total:
            load.target = min(cfg.target_usage, load.target + cfg.recovery_per_s * dt)

    # ----------------------------------------------------------------- state

    def state(self) -> dict:
        """JSON snapshot: decisions, counters, per-instance reservation, budget, U_w, r_w, sessions."""
        now = self._now
        instances = {}
        for w, load in sorted(self.loads.items()):
            instances[w] = {
                "reserved_blocks": self.reserved_blocks(w, now), "budget_blocks": self.budget_blocks(w),
                "target_usage": load.target, "decode_tokens_per_s": load.rate, "running": load.running,
                "sessions": dict(load.sessions_by_class), "floor_sessions": dict(load.floor_by_class),
                "backfill_blocks": load.backfill_blocks,
            }
        return {
            "policy": self.name, "admits": self.stats.admits, "holds": self.stats.holds, **self.counters,
            "held_count": len(self.held),
            "oldest_hold_age_s": max((now - r.held_since_s for r in self.held.values() if r.held_since_s is not None),
                                     default=0.0),
            # the timeline's "caps": protected sessions per instance (what a static ceiling would fix)
            "caps": {w: {"all": sum(i["sessions"].values()), "budget_fill": i["reserved_blocks"] / max(i["budget_blocks"], 1e-9)}
                     for w, i in instances.items()},
            "ledger_sizes": {"tracked": len(self.sessions), "held": len(self.held), "prefix_index_blocks": len(self.index)},
            "instances": instances,
            "prefill_share": {b: self.prefill_share(b) for b in sorted(self.added_tokens)},
            "prefix_index": self.index.state(),
        }
