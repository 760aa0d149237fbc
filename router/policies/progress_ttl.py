"""progress_ttl: program-level admission with a KV time-to-live over tool calls.

An admission anchor for the simulator's comparisons (issue 15), after the design proposed
for the vLLM Router as Program-level Progress-TTL scheduling (vllm-project/router#285, read,
not copied): an agent *program* (a session: model turn, tool call, model turn, ...) owns KV
on the instance it is bound to; when it goes into a tool call its ownership is kept for a
time-to-live worth what a cache miss would cost it, after which, under capacity pressure, the
program is *paused*: its ownership goes to a waiting program, and its next turn must resume
(re-acquire room) before it runs again. At the router, per instance w::

    owned_w = Σ_{active programs p on w} own_p
      own_p = the most blocks p held so far (prompt + output of its requests, its
              class's mean output for a running one; shared prefix matched at its
              admission excluded): ownership never shrinks while p is active, so only a
              program's end, a pause or the clock make room
    room_w  = admit_usage x num_blocks_w - owned_w - Σ_{paused programs waiting for w} own_p

- a request of an *active* program goes to its instance at once (no cap, no queue);
- a *new* program enters an instance whose room fits its prompt plus its class's mean
  output and whose last sample shows KV usage below ``admit_usage`` and at most
  ``waiting_limit`` requests waiting (the engine's own count: programs grow past what they
  own, and ownership does not see it; longest prefix match among
  those, else the most room), or one that nobody owns or waits for (a program larger than
  the budget is not held forever); held new programs of a class enter in arrival order;
- a *paused* program's next request resumes on its own instance when the room there fits
  it, else on another with room (cross-instance), before any new program: its room is
  kept for it; one waiting ``force_resume_s`` resumes on its instance regardless (fairness:
  a program cannot be kept out forever by new ones);
- when a new or resuming program finds no room, programs in a tool call whose TTL ran out
  are paused, the longest expired first, until it fits;
- the TTL of a program that goes into a tool call is ``ttl_scale`` x the seconds its own
  blocks would take to prefill again at the instance's measured prefill rate (the most
  prompt tokens/s over the last ``rate_windows`` metric windows; a prior before any),
  within [``ttl_min_s``, ``ttl_max_s``]: a long history is worth keeping longer.

Not modelled from the proposal: its progress awareness (how many continuous rounds programs
usually complete before a pause, and the batch gain of keeping growth room), priorities and
deadlines carried by requests, and KV transfer between ranks.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from router.estimators import BoundedHistory, MetricWindows
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
class ProgressTtlConfig:
    """Options of progress_ttl; the reason for each default under it."""

    admit_usage: float = 0.9
    """Share of an instance's KV blocks the active programs may own: vLLM preempts only at a
    full cache, 10% covers the output of running requests beyond their class mean."""
    ttl_scale: float = 4.0
    """TTL = this x the seconds a cache miss would cost the program (its own blocks
    re-prefilled): keeping KV for a few times the cost of losing it is worth it while tool
    calls are short against that."""
    ttl_min_s: float = 1.0
    """Shortest TTL: a program's next turn after a quick tool call finds its KV."""
    ttl_max_s: float = 60.0
    """Longest TTL: a program in a long tool call gives its room back within a minute."""
    force_resume_s: float = 30.0
    """A paused program waiting this long resumes on its instance regardless of room."""
    prefill_tokens_per_s_prior: float = 4000.0
    """Prefill rate before any metric (a GPU engine's order of magnitude)."""
    rate_windows: int = 16
    """Metric windows whose largest prefill rate is the instance's (a quiet window
    measures the demand, not what the engine can do)."""
    rate_window_s: float = 1.0
    """Length of one such window (:class:`router.estimators.MetricWindows`): one scrape
    period of the simulator and the live router."""
    output_prior_tokens: float = 1024.0
    """A running request's output before 8 of its class finished (tokens)."""
    waiting_limit: int = 8
    """No new program on an instance whose waiting queue is longer (it is already behind)."""
    fallback_num_blocks: int = 364
    """KV blocks assumed before an instance reports its size (as kv_horizon)."""
    block_size_fallback_tokens: int = 16
    """Tokens per block until an instance reports it (vLLM's GPU default)."""
    metrics_stale_s: float = 10.0
    """A sample older than this does not say the waiting queue."""
    recheck_s: float = 0.5
    """Recheck delay of a held program."""
    idle_timeout_s: float = 600.0
    """A program with nothing in flight this long has ended (longer than any tool call)."""
    held_forget_s: float = 300.0
    """A held program not re-decided for this long is dropped (its caller gave up); at least
    ``recheck_s``, or one would be dropped between two rechecks."""
    history: int = 256
    """Outputs kept per class for its mean."""

    def __post_init__(self) -> None:
        bad = []
        if not 0 < self.admit_usage <= 1:
            bad.append(f"admit_usage must be in (0, 1], got {self.admit_usage}")
        if not 0 < self.ttl_min_s <= self.ttl_max_s:
            bad.append(f"need 0 < ttl_min_s <= ttl_max_s, got {self.ttl_min_s} and {self.ttl_max_s}")
        bad += option_bound_errors(
            self,
            positive=("ttl_scale", "force_resume_s", "prefill_tokens_per_s_prior", "output_prior_tokens",
                      "metrics_stale_s", "recheck_s", "idle_timeout_s", "held_forget_s", "rate_window_s"),
            non_negative=("waiting_limit",),
            at_least_one=("rate_windows", "fallback_num_blocks", "block_size_fallback_tokens", "history"),
            not_below=(("held_forget_s", "recheck_s"),))  # else a held program is forgotten between two rechecks
        if bad:
            raise ValueError("; ".join(bad))


_NEW, _ACTIVE, _PAUSED = "new", "active", "paused"


class _Program:
    """One unfinished program (session) and its ownership."""

    __slots__ = ("session_id", "workload_class", "state", "instance", "own", "shared", "running", "tool_since_s",
                 "ttl_s", "waiting_since_s", "last_decided_s", "last_activity_s")

    def __init__(self, session_id: str, workload_class: str, now: float) -> None:
        self.session_id = session_id
        self.workload_class = workload_class
        self.state = _NEW
        self.instance: str | None = None  # bound (active), or last bound (paused: None when it went away)
        self.own = 0.0  # blocks it owns while active (its peak, shared prefix excluded)
        self.shared = 0  # blocks its first prompt matched on its instance
        self.running = 0
        self.tool_since_s: float | None = None  # its last request finished (in a tool call) at
        self.ttl_s = 0.0
        self.waiting_since_s: float | None = None  # held (new, or paused and asking to resume) since
        self.last_decided_s = now
        self.last_activity_s = now


class ProgressTtlPolicy:
    """Program admission with KV ownership kept over tool calls for a TTL (module docstring)."""

    name = "progress_ttl"

    def __init__(self, config: ProgressTtlConfig | None = None) -> None:
        self.config = config or ProgressTtlConfig()
        self.stats = PolicyStats()
        self.index = PrefixIndex()
        self.programs: dict[str, _Program] = {}
        self.owned: dict[str, float] = {}  # instance -> Σ own of its active programs
        self.resuming: dict[str, float] = {}  # instance -> Σ own of paused programs waiting for it
        self.held: dict[str, OrderedDict[str, _Program]] = {}  # class -> held new programs, arrival order
        self.in_tool: dict[str, dict[str, _Program]] = {}  # instance -> its active programs in a tool call
        self._next_sweep_s = -math.inf
        self.outputs: dict[str, BoundedHistory] = {}
        self._block_size: dict[str, int] = {}
        self._num_blocks: dict[str, int] = {}
        self._rates: dict[str, deque[float]] = {}  # instance -> prefill tokens/s of recent windows
        self._windows: dict[str, MetricWindows] = {}
        self.counters = {"continuations": 0, "new": 0, "resumes": 0, "forced_resumes": 0, "pauses": 0,
                         "holds_new": 0, "holds_resume": 0, "ended_idle": 0, "abandoned_holds": 0}

    # ------------------------------------------------------------------ estimates

    def _bs(self, w: str) -> int:
        return self._block_size.get(w, self.config.block_size_fallback_tokens)

    def _budget(self, w: str) -> float:
        return self.config.admit_usage * self._num_blocks.get(w, self.config.fallback_num_blocks)

    def _room(self, w: str) -> float:
        return self._budget(w) - self.owned.get(w, 0.0) - self.resuming.get(w, 0.0)

    def _out_tokens(self, workload_class: str) -> float:
        h = self.outputs.get(workload_class)
        return h.mean() if h is not None and len(h) >= 8 else self.config.output_prior_tokens

    def prefill_rate(self, w: str) -> float:
        """Instance ``w``'s prefill rate, prompt tokens/s: the largest of its last
        ``rate_windows`` metric windows, the prior before any."""
        rates = self._rates.get(w)
        return max(rates) if rates else self.config.prefill_tokens_per_s_prior

    def ttl(self, w: str, own_blocks: float) -> float:
        """TTL (s) of a program owning ``own_blocks`` on ``w`` that goes into a tool call:
        ``ttl_scale`` x its re-prefill time, within [``ttl_min_s``, ``ttl_max_s``]."""
        cfg = self.config
        miss_s = own_blocks * self._bs(w) / self.prefill_rate(w)
        return min(cfg.ttl_max_s, max(cfg.ttl_min_s, cfg.ttl_scale * miss_s))

    def _need(self, request: Request, w: str, shared: int = 0) -> float:
        bs = self._bs(w)
        return max(0.0, math.ceil((request.prompt_tokens + self._out_tokens(request.workload_class)) / bs) - shared)

    # ------------------------------------------------------------------ ledger

    def _own(self, p: _Program, blocks: float) -> None:
        """Raise active ``p``'s ownership to ``blocks`` (it never shrinks while active)."""
        if blocks > p.own:
            self.owned[p.instance] = self.owned.get(p.instance, 0.0) + blocks - p.own
            p.own = blocks

    def _release(self, p: _Program) -> None:
        """``p`` stops owning blocks (it paused or ended)."""
        if p.state == _ACTIVE and p.instance is not None:
            self.owned[p.instance] = max(0.0, self.owned.get(p.instance, 0.0) - p.own)
            self._tool_call(p, None)

    def _tool_call(self, p: _Program, now: float | None) -> None:
        """``p`` goes into a tool call at ``now`` (its TTL from its ownership), or leaves it (None)."""
        if now is None:
            p.tool_since_s = None
            self.in_tool.get(p.instance, {}).pop(p.session_id, None)
        else:
            p.tool_since_s, p.ttl_s = now, self.ttl(p.instance, p.own)
            self.in_tool.setdefault(p.instance, {})[p.session_id] = p

    def _stop_waiting(self, p: _Program) -> None:
        if p.waiting_since_s is None:
            return
        if p.state == _NEW:
            self.held.get(p.workload_class, {}).pop(p.session_id, None)
        elif p.instance is not None:  # its reserved room to resume in
            self.resuming[p.instance] = max(0.0, self.resuming.get(p.instance, 0.0) - p.own)
        p.waiting_since_s = None

    def _end(self, session_id: str) -> None:
        p = self.programs.pop(session_id, None)
        if p is not None:
            self._stop_waiting(p)
            self._release(p)

    def _pause(self, p: _Program) -> None:
        self._release(p)
        p.state = _PAUSED
        self.counters["pauses"] += 1

    def _activate(self, p: _Program, w: str, request: Request, now: float) -> Admit:
        """Bind new or paused ``p`` (owning nothing) to ``w``: it owns its peak there again, or
        what ``request`` needs."""
        self._stop_waiting(p)
        fresh = p.state == _NEW or p.instance != w
        if fresh:  # its prefix on w counts once, with whatever shares it
            hashes = request.block_hashes
            p.shared = self.index.longest_prefix_match(hashes).get(w, 0) if hashes else 0
        own, p.own = p.own, 0.0
        p.state, p.instance = _ACTIVE, w
        self._own(p, max(0.0 if fresh else own, self._need(request, w, p.shared)))
        p.last_activity_s = now
        self.stats.admits += 1
        return Admit(w)

    def _advance(self, now: float) -> None:
        """End programs idle past ``idle_timeout_s`` and holds nobody asked for in
        ``held_forget_s`` (a sweep of all programs at most every 10 s: both are minutes)."""
        if now < self._next_sweep_s:
            return
        self._next_sweep_s = now + 10.0
        cfg = self.config
        for p in list(self.programs.values()):
            if p.waiting_since_s is not None and now - p.last_decided_s >= cfg.held_forget_s:
                self.counters["abandoned_holds"] += 1
                self._end(p.session_id)
            elif not p.running and p.waiting_since_s is None and now - p.last_activity_s >= cfg.idle_timeout_s:
                self.counters["ended_idle"] += 1
                self._end(p.session_id)

    def _reclaim(self, w: str, need: float, now: float) -> bool:
        """Pause programs of ``w`` in a tool call past their TTL, the longest expired first,
        until ``need`` blocks fit; whether they do (none is paused when all of them would not
        make enough room)."""
        expired = sorted((p for p in self.in_tool.get(w, {}).values() if now - p.tool_since_s >= p.ttl_s),
                         key=lambda p: p.tool_since_s + p.ttl_s)
        if self._room(w) + sum(p.own for p in expired) < need:
            return False
        for p in expired:
            if self._room(w) >= need:
                break
            self._pause(p)
        return self._room(w) >= need

    # ------------------------------------------------------------------ decide

    def _open(self, v: InstanceView) -> bool:
        """Whether ``v`` takes new programs by its last fresh sample: measured KV usage below
        ``admit_usage`` and at most ``waiting_limit`` requests waiting (without one: yes)."""
        m, cfg = v.metrics, self.config
        fresh = m is not None and v.metrics_age_s is not None and v.metrics_age_s <= cfg.metrics_stale_s
        return not fresh or (m.kv_cache_usage < cfg.admit_usage and m.num_requests_waiting <= cfg.waiting_limit)

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Active program: its instance. Paused: resume where it fits (forced after
        ``force_resume_s``). New: an instance with room, in arrival order per class."""
        self._advance(now)
        p = self.programs.get(request.session_id)
        healthy = {v.instance: v for v in view.healthy()}
        for v in healthy.values():  # sizes from the view too: a policy may decide before its first sample
            if v.metrics is not None:
                self._sizes(v.instance, v.metrics)
        if p is None:
            p = self.programs[request.session_id] = _Program(request.session_id, request.workload_class, now)
        p.last_decided_s = now
        if p.state == _ACTIVE and p.instance in healthy:
            self.counters["continuations"] += 1
            self.stats.admits += 1
            p.last_activity_s = now
            return Admit(p.instance, reason="continuation")
        if p.state == _ACTIVE:  # its instance went away: it resumes wherever there is room
            self._pause(p)
            p.instance = None
        if not healthy:
            return self._hold(p, now, "no healthy instance")
        if p.state == _PAUSED:
            return self._resume(p, request, healthy, now)
        queue = self.held.setdefault(p.workload_class, OrderedDict())
        if queue and next(iter(queue)) != p.session_id:  # an older new program of its class waits
            return self._hold(p, now, "behind an older held program of its class")
        open_ = [v for v in healthy.values() if self._open(v)]
        fits = [v for v in open_ if self._room(v.instance) >= self._need(request, v.instance)]
        if not fits:  # room from programs past their TTL, on the first instance that has enough
            fits = next(([v] for v in open_ if self._reclaim(v.instance, self._need(request, v.instance), now)), [])
        if not fits:  # an instance nobody owns or waits for takes a program larger than its budget
            fits = [v for v in open_ if not self.owned.get(v.instance) and not self.resuming.get(v.instance)][:1]
        if not fits:
            return self._hold(p, now, "no instance with room")
        matched = self.index.longest_prefix_match(request.block_hashes) if request.block_hashes else {}
        chosen = max(fits, key=lambda v: (matched.get(v.instance, 0), self._room(v.instance)))
        self.counters["new"] += 1
        return self._activate(p, chosen.instance, request, now)

    def _resume(self, p: _Program, request: Request, healthy: dict[str, InstanceView], now: float) -> Decision:
        """Paused ``p`` back on its instance, or another with room, or after ``force_resume_s``
        on its own regardless; else held, its room on its instance kept for it."""
        own_w = p.instance if p.instance in healthy else None
        if p.waiting_since_s is not None and p.instance is not None:  # the room it kept counts for it now
            self.resuming[p.instance] = max(0.0, self.resuming.get(p.instance, 0.0) - p.own)
        need = max(p.own, self._need(request, own_w, p.shared)) if own_w else None
        order = ([own_w] if own_w else []) + sorted((w for w in healthy if w != own_w), key=self._room, reverse=True)
        chosen = next((w for w in order if self._room(w) >= (need if w == own_w else self._need(request, w))), None)
        if chosen is None and own_w is not None and self._reclaim(own_w, need, now):
            chosen = own_w
        forced = (chosen is None and p.waiting_since_s is not None
                  and now - p.waiting_since_s >= self.config.force_resume_s)
        if forced:
            chosen = own_w or max(healthy, key=self._room)
        if chosen is None:
            if p.instance is not None:
                self.resuming[p.instance] = self.resuming.get(p.instance, 0.0) + p.own
            return self._hold(p, now, "paused: no room to resume")
        p.waiting_since_s = None  # the room it kept was taken back above
        self.counters["forced_resumes" if forced else "resumes"] += 1
        return self._activate(p, chosen, request, now)

    def _hold(self, p: _Program, now: float, reason: str) -> Hold:
        if p.waiting_since_s is None:
            p.waiting_since_s = now
            if p.state == _NEW:
                self.held.setdefault(p.workload_class, OrderedDict())[p.session_id] = p
        self.counters["holds_new" if p.state == _NEW else "holds_resume"] += 1
        self.stats.holds += 1
        return Hold(self.config.recheck_s, reason=reason)

    # ------------------------------------------------------------------ observe

    def observe(self, event: Event) -> None:
        """Programs' sizes and tool calls from request events, prefixes from KV events,
        block sizes and prefill rates from metrics."""
        self._advance(event.now)
        if isinstance(event, RequestStarted):
            p = self.programs.get(event.request.session_id)
            if p is not None and p.state == _ACTIVE and p.instance == event.instance:
                p.running += 1
                self._tool_call(p, None)
                self._own(p, self._need(event.request, event.instance, p.shared))
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
            for p in [p for p in self.programs.values() if p.instance == event.instance]:
                self._stop_waiting(p)
                if p.state == _ACTIVE:
                    self._pause(p)
                p.instance, p.running = None, 0  # its requests there are lost

    def _on_finished(self, event: RequestFinished) -> None:
        req = event.request
        p = self.programs.get(req.session_id)
        if not event.instance:  # dropped before admission: its client left
            if p is not None and p.waiting_since_s is not None and not p.running:
                self.counters["abandoned_holds"] += 1
                self._end(req.session_id)
            return
        if event.ok and event.completion_tokens:
            self.outputs.setdefault(req.workload_class, BoundedHistory(self.config.history)).append(
                event.completion_tokens)
        if p is None or p.instance != event.instance:
            return
        if req.session_end:
            self._end(req.session_id)
            return
        p.running = max(0, p.running - 1)
        p.last_activity_s = event.now
        if p.state == _ACTIVE and not p.running:
            total = (event.prompt_tokens or req.prompt_tokens) + event.completion_tokens
            self._own(p, math.ceil(total / self._bs(p.instance)) - p.shared)
            self._tool_call(p, event.now)

    def _sizes(self, w: str, m: InstanceMetrics) -> None:
        if m.block_size:
            self._block_size[w] = m.block_size
        if m.num_blocks:
            self._num_blocks[w] = m.num_blocks

    def _on_metrics(self, event: MetricsSampled) -> None:
        m, w = event.metrics, event.instance
        self._sizes(w, m)
        windows = self._windows.setdefault(w, MetricWindows(self.config.rate_window_s, 0.0))
        window = windows.add(m, event.now)
        if window is not None and window.prefill_tokens_per_s > 0:
            self._rates.setdefault(w, deque(maxlen=self.config.rate_windows)).append(window.prefill_tokens_per_s)

    # ------------------------------------------------------------------ state

    def state(self) -> dict:
        """JSON snapshot: decisions, counters, per instance the owned blocks, room and prefill rate."""
        instances = {w: {"owned_blocks": self.owned.get(w, 0.0), "room_blocks": self._room(w),
                         "prefill_tokens_per_s": self.prefill_rate(w),
                         "active": sum(1 for p in self.programs.values() if p.state == _ACTIVE and p.instance == w),
                         "paused": sum(1 for p in self.programs.values() if p.state == _PAUSED and p.instance == w)}
                     for w in sorted(set(self.owned) | set(self._num_blocks))}
        return {"policy": self.name, "admits": self.stats.admits, "holds": self.stats.holds, **self.counters,
                "held_new": sum(len(q) for q in self.held.values()), "instances": instances}
