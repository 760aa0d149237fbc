"""The discrete-event loop: trainer -> policy (decide / observe) -> engines, on one clock.

The simulator is a transport, like the live router: it builds ``Request`` values, asks
the policy ``decide(request, view, now)``, re-asks held requests after their
``recheck_after_s``, forwards admitted ones to an :class:`~router.sim.engine.Engine`,
and feeds the policy the same events the live router does (RequestStarted,
RequestFinished, SessionEnded, KV events, periodic MetricsSampled like a scrape), with a
configurable delay and loss for signals.

Held requests wait in queues (:class:`_HeldQueue`), each an
:class:`~router.held_queue.ArrivalQueue`, the ordering the live router's held requests
use too (its contract, arrival order, wake the oldest, cancellation, is written once in
:mod:`router.held_queue`). New sessions (a session's first request) of one workload
class share a queue, in arrival order; any other held request (a continuation that must
re-acquire admission) is a queue of its own. Only the head of a queue is re-asked after its ``recheck_after_s``; when it is
admitted, the next one is asked at once, and so on until one is held again (it becomes
the head). The others are re-asked only every ``held_refresh_s`` (so a policy never
takes them for abandoned). This rests on a property every policy here has: a policy
holds a new session while an older new session of its class is held (session_admission,
misa, misa_t, progress_ttl admit held sessions of a class in arrival order; aimd and tool_pause hold
new sessions on conditions that do not depend on the session; cache_aware and
round_robin hold only when no instance is healthy). A younger new session is therefore
admitted at the moment the one before it is, not up to one recheck delay later.

The head of a new-session queue is re-asked (at its recheck time) only if something that
can make room for a new session reached the policy since it was last asked: a session
admitted or ended, a new request held (class demand changed), a metric sample (caps,
capacity, overload pressure), a cache reset. The other events do not wake it: KV block
events change where an admitted request goes, not whether it is admitted, and a request
of an admitted session starting or finishing only lets the policy see that session
grow, which never opens room (session_admission, misa, misa_t: a larger footprint
lowers caps; aimd, tool_pause: they count sessions and read metrics; progress_ttl: a
program's ownership only grows while it is active). A policy that
admits on request-level signals would see its held sessions re-asked at the next metric
sample (one scrape period) at the latest; so would a session the policy expires for
idleness. Time passing alone does not wake a head, except that every held request is
asked at least every ``held_refresh_s``; a skipped recheck is rescheduled with the last
Hold's delay. Continuations are always re-asked
(MISA-T Eq. 7 weighs the time already held). Before these two rules, re-asking held
requests was most of the simulator's work at the paper's scale: misa_t at ceiling 512
made 13.9 million decide() calls in 109 s; now 0.24 million in 23 s (bench/sim_speed.py).

Events live in one heap ordered by (time, sequence). An engine step is one event; a
multi-step decode chunk is one event that a new arrival can move earlier (a stale step
event is recognised by its sequence number and skipped).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from router.policies.base import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    ClusterView,
    Hold,
    InstanceMetrics,
    InstanceView,
    MetricsSampled,
    Policy,
    Request,
    RequestFinished,
    RequestStarted,
    SessionEnded,
)
from router.held_queue import ArrivalQueue
from router.policy_errors import PolicyErrors
from router.prefix_index import chain_hashes
from router.sim.block_hashes import SessionChain
from router.sim.prompt_text import PromptTexts
from router.sim.engine import Engine, EngineConfig, SimRequest
from router.sim.errors import SimError
from router.sim.metrics import RequestLog, engine_snapshot, summarize
from router.sim.trace import TraceSession
from router.sim.trainer import Trainer

_ARRIVE, _RECHECK, _STEP, _SCRAPE, _DELIVER, _TICK, _SYNC, _REFRESH, _SHIFT = range(9)


@dataclass(frozen=True)
class SignalConfig:
    """How the policy hears from the engines (the transport's signal path).

    Attributes:
        scrape_period_s: metrics scrape period.
        metrics_delay_s / kv_event_delay_s: delivery delay of a sample / a KV event batch.
        metrics_loss / kv_event_loss: probability a sample / a KV event batch is lost.
    """

    scrape_period_s: float = 1.0
    metrics_delay_s: float = 0.0
    kv_event_delay_s: float = 0.0
    metrics_loss: float = 0.0
    kv_event_loss: float = 0.0


@dataclass(frozen=True)
class WorkloadShift:
    """A mid-run change of the workload (experiment 5): units released from ``at_s`` on have
    rlvr outputs x ``rlvr_output_factor`` (clipped to the context limit) and agent tool
    gaps x ``agent_tool_gap_factor``."""

    at_s: float
    rlvr_output_factor: float = 1.0
    agent_tool_gap_factor: float = 1.0


@dataclass(frozen=True)
class SimConfig:
    """One simulation run.

    Attributes:
        instances: engine replicas; engine: their config; cost: their step-time model, or a
            list of one per replica (engines that share a machine unevenly, e.g. one whose
            core also runs more of its scheduler's and server's work).
        mixture: the trainer's target rho (``trainer.rho``); ceiling: its outer concurrency, units
            in flight (``trainer.max_in_flight``).
        signals: signal delay and loss.
        context_limit_tokens: prompt + output limit (the requests' max_tokens).
        warmup_frac: the measurement window starts when this fraction of the units the
            trainer will release has completed, and ends when the trainer stops releasing
            (its first class pool ran dry). If that leaves no window (the ceiling let the
            whole trace in at once) the window is the whole run.
        warmup_s: the window also starts no earlier than this simulated time (s): the first
            unit completion at or after it (``bench.router_real`` measures real runs after a
            wall-clock warm-up; 0 = by ``warmup_frac`` only).
        timeline_period_s: period of the timeline samples (plots).
        min_recheck_s: floor on a Hold's recheck delay (a 0 would stall the clock).
        held_refresh_s: every held request is asked again at least this often, whatever
            happened (a policy may drop a held session nobody re-asks for long:
            session_admission's ``held_forget_s``; 80% of that is used when it is shorter).
        horizon_s: stop the run at this simulated time (None: when all units finished).
        weight_sync_period_s: reset every engine's prefix cache this often (None: never).
        shift: optional workload shift.
        seed: RNG seed of signal loss.
        chars_per_token: prompt text length per token, for policies that match on text
            (``needs_prompt_text``, e.g. vllm_router; ``router/sim/prompt_text.py``).
        request_overhead_s: seconds each request spends outside the engines (router, HTTP
            hops, the engines' API servers), added before it reaches the router: a session's
            first request arrives this long after its release, each later one this long after
            its tool gap. ``bench.router_real`` measures it on real runs
            (:func:`router.replay.request_times`); 0 in the paper-sized recipes, whose
            requests run for seconds on GPUs.
        continuation_delay_s: seconds a session's client takes between a response and its
            next request beyond the tool gap (parsing the answer, building the next prompt),
            added to each later request's arrival; ``bench.router_real`` measures its replay
            client's (``between_s`` of :func:`router.replay.request_times`); 0 by default.
        raise_policy_errors: an exception out of the policy stops the run (True, for tests
            and policy development), or is counted in ``summary["policy_errors"]`` and the
            run goes on as in the live router (False; :mod:`router.policy_errors`).
    """

    instances: int
    engine: EngineConfig
    cost: Any
    mixture: dict[str, float]
    ceiling: int
    signals: SignalConfig = SignalConfig()
    context_limit_tokens: int = 131072
    warmup_frac: float = 0.1
    warmup_s: float = 0.0
    timeline_period_s: float = 30.0
    min_recheck_s: float = 0.05
    held_refresh_s: float = 240.0
    horizon_s: float | None = None
    weight_sync_period_s: float | None = None
    shift: WorkloadShift | None = None
    seed: int = 0
    chars_per_token: float = 4.0
    request_overhead_s: float = 0.0
    continuation_delay_s: float = 0.0
    raise_policy_errors: bool = True


@dataclass
class _SessionRun:
    trace: TraceSession
    chain: SessionChain | None
    turn: int = 0
    model_s: float = 0.0
    gap_s: float = 0.0
    gap_factor: float = 1.0
    output_factor: float = 1.0
    released_s: float = 0.0
    admitted_s: float | None = None
    final_tokens: int = 0


class _HeldQueue:
    """Held requests sharing a recheck (see the module docstring), oldest first.

    Attributes:
        requests: the held requests by arrival; only the oldest (the head,
            ``requests.peek()``) has a recheck event.
        hold: the head's last Hold; asked_epoch / asked_s: the simulator's epoch and the
            time when the head was last asked.
    """

    __slots__ = ("requests", "hold", "asked_epoch", "asked_s")

    def __init__(self, sreq: SimRequest, hold: Hold, epoch: int, now: float) -> None:
        self.requests: ArrivalQueue[SimRequest] = ArrivalQueue()
        self.requests.push(sreq, sreq.request.arrival_s)
        self.hold, self.asked_epoch, self.asked_s = hold, epoch, now


@dataclass
class SimResult:
    """What one run produced: ``summary`` (metrics of the window), ``timeline`` (samples)."""

    summary: dict
    timeline: list[dict] = field(default_factory=list)


class Simulation:
    """One run of ``sessions`` under ``policy``.

    Args:
        config: :class:`SimConfig`.
        sessions: the trace (from :func:`router.sim.workload.generate_trace` or
            :func:`router.sim.trace.read_trace`).
        policy: any object with the Policy protocol (from ``make_policy``).

    Raises:
        SimError: a recorded trace whose ``block_size`` differs from the engines'.
    """

    def __init__(self, config: SimConfig, sessions: list[TraceSession], policy: Policy) -> None:
        self.cfg = config
        self.policy = policy
        self.policy_errors = PolicyErrors(getattr(policy, "name", type(policy).__name__),
                                          raise_errors=config.raise_policy_errors)
        bs = config.engine.block_size
        if config.engine.num_blocks * bs < config.context_limit_tokens:
            # vLLM refuses to start such an engine; here a request larger than the pool would
            # preempt itself forever and the run would never end
            raise SimError(
                f"engine KV cache holds {config.engine.num_blocks} blocks x {bs} tokens = "
                f"{config.engine.num_blocks * bs} tokens, less than one sequence at the context limit "
                f"({config.context_limit_tokens} tokens); give the engines more blocks or lower the limit"
            )
        for s in sessions:
            for r in s.requests:
                if r.prompt_tokens >= config.context_limit_tokens:
                    raise SimError(
                        f"session {s.session_id!r} turn {r.turn}: prompt of {r.prompt_tokens} tokens does not fit "
                        f"the context limit ({config.context_limit_tokens} tokens); raise context_limit_tokens"
                    )
                if r.prompt_hashes is not None and r.block_size != bs:
                    raise SimError(
                        f"session {s.session_id!r} turn {r.turn}: prompt_hashes use block_size {r.block_size} "
                        f"but the engines use {bs}; set engine.block_size to match the trace"
                    )
        costs = list(config.cost) if isinstance(config.cost, (list, tuple)) else [config.cost] * config.instances
        if len(costs) != config.instances:
            raise SimError(f"SimConfig.cost: {len(costs)} step-time models for {config.instances} instances; "
                           "give one model, or one per instance")
        self.engines = [Engine(f"engine-{i}", config.engine, cost) for i, cost in enumerate(costs)]
        self.by_name = {e.instance: e for e in self.engines}
        self.trainer = Trainer(sessions, config.mixture, config.ceiling)
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self._step_seq = [0] * len(self.engines)
        self._in_flight = {e.instance: 0 for e in self.engines}
        self._latest: dict[str, tuple[InstanceMetrics, float]] = {}
        self._rng = random.Random(config.seed)
        self._shared_chains: dict = {}
        # prompt text only for a policy that reads it (building it costs memory and time)
        self._texts = (PromptTexts(config.chars_per_token, config.seed)
                       if getattr(policy, "needs_prompt_text", False) else None)
        self._keys: dict[str, int] = {}
        self.log = RequestLog()
        self.timeline: list[dict] = []
        self._runs: dict[str, _SessionRun] = {}
        # held requests: queue key -> requests in the order first held; only the head has
        # a recheck event in the heap (see the module docstring)
        self._held: dict[str, _HeldQueue] = {}
        # bumped whenever the policy hears something that can change a held request's decision
        self._epoch = 0
        forget_s = getattr(getattr(policy, "config", None), "held_forget_s", None)
        self._refresh_s = min(config.held_refresh_s, 0.8 * forget_s) if forget_s else config.held_refresh_s
        self._window: dict[str, float] = {}
        self._window_counters: dict[str, list] = {}
        total = self.trainer.releasable_units()
        self._warmup_units = max(1, int(config.warmup_frac * total))

    # ------------------------------------------------------------------ heap
    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Run to the end; ``progress(fraction_of_units_done)`` is called now and then."""
        self._release()
        self._push(0.0, _SCRAPE)
        self._push(0.0, _TICK)
        self._push(self._refresh_s, _REFRESH)
        if self.cfg.weight_sync_period_s:
            self._push(self.cfg.weight_sync_period_s, _SYNC)
        if self.cfg.shift is not None:  # the engines' counters at the shift: figures per phase
            self._push(self.cfg.shift.at_s, _SHIFT)
        handlers = {
            _ARRIVE: self._on_arrive, _RECHECK: self._on_recheck, _STEP: self._on_step,
            _SCRAPE: self._on_scrape, _DELIVER: self._on_deliver, _TICK: self._on_tick, _SYNC: self._on_sync,
            _REFRESH: self._on_refresh, _SHIFT: lambda _a, _b: self._mark_window("shift"),
        }
        horizon = self.cfg.horizon_s
        n_events = 0
        total_units = max(1, self.trainer.releasable_units())
        heap = self._heap
        while heap and not self.trainer.done:
            t, _, kind, a, b = heapq.heappop(heap)
            if horizon is not None and t > horizon:
                break
            self.now = t
            handlers[kind](a, b)
            n_events += 1
            if progress is not None and n_events % 20000 == 0:
                progress(sum(self.trainer.completed.values()) / total_units)
        if "stop" not in self._window:
            self._mark_window("stop")
        self._mark_window("end")
        self.timeline.append(self.log.timeline_sample(self))
        summary = summarize(self, n_events)
        summary["policy_errors"] = dict(self.policy_errors.counts)
        # the policy's own counts at the end (kv_horizon's backfill_admissions, holds, ...)
        summary["policy_counters"] = {k: v for k, v in self.policy.state().items()
                                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return SimResult(summary, self.timeline)

    # ------------------------------------------------------------------ trainer
    def _release(self) -> None:
        was_stopped = self.trainer.stopped_s is not None
        for s in self.trainer.release(self.now):
            run = _SessionRun(s, self._chain_for(s), released_s=self.now)
            shift = self.cfg.shift
            if shift is not None and self.now >= shift.at_s:
                if s.workload_class == "rlvr":
                    run.output_factor = shift.rlvr_output_factor
                if s.workload_class == "agent":
                    run.gap_factor = shift.agent_tool_gap_factor
            self._runs[s.session_id] = run
            self._push(self.now + self.cfg.request_overhead_s, _ARRIVE, run)
        if not was_stopped and self.trainer.stopped_s is not None:
            self._mark_window("stop")

    def _mark_window(self, edge: str) -> None:
        self._window[edge] = self.now
        self._window_counters[edge] = [engine_snapshot(e) for e in self.engines]

    def _key(self, name: str) -> int:
        k = self._keys.get(name)
        if k is None:
            k = self._keys[name] = len(self._keys) + 1
        return k

    def _chain_for(self, s: TraceSession) -> SessionChain:
        r0 = s.requests[0]
        return SessionChain(
            self._key("c:" + s.workload_class), self._key("g:" + (s.group_id or s.session_id)),
            self._key("s:" + s.session_id), class_prefix_tokens=r0.class_prefix_tokens,
            group_prefix_tokens=r0.group_prefix_tokens, block_size=self.cfg.engine.block_size,
            shared=self._shared_chains,
        )

    # ------------------------------------------------------------------ requests
    def _make_request(self, run: _SessionRun) -> SimRequest:
        rec = run.trace.requests[run.turn]
        bs = self.cfg.engine.block_size
        limit = self.cfg.context_limit_tokens
        output = rec.output_tokens
        if run.output_factor != 1.0:
            output = round(output * run.output_factor)
        # the engine stops at max_tokens = limit - prompt, as vLLM does
        output = int(min(max(1, output), limit - rec.prompt_tokens))
        n_prompt_blocks = rec.prompt_tokens // bs
        n_stream_blocks = (rec.prompt_tokens + output) // bs
        if rec.prompt_hashes is not None:
            # Recorded trace: the prompt's hashes as recorded; output blocks continue the
            # session's own chain from there.
            head = list(rec.prompt_hashes[:n_prompt_blocks])
            tail = chain_hashes([self._key(f"o:{rec.session_id}:{rec.turn}:{i}") for i in range(
                n_stream_blocks - len(head))], 1, parent=head[-1] if head else None)
            stream = head + tail
        else:
            stream = run.chain.blocks(n_stream_blocks)[:n_stream_blocks]
        s = run.trace
        req = Request(
            request_id=f"{s.session_id}#{rec.turn}", session_id=s.session_id, workload_class=s.workload_class,
            group_id=s.group_id, unit_id=s.unit_id, session_end=bool(rec.session_end),
            prompt_tokens=rec.prompt_tokens, block_hashes=tuple(stream[:n_prompt_blocks]),
            prompt_text=self._texts.prompt(s, rec) if self._texts is not None else "",
            max_tokens=max(1, limit - rec.prompt_tokens), arrival_s=self.now,
        )
        return SimRequest(req, output, stream)

    def _view(self) -> ClusterView:
        now = self.now
        views = []
        for e in self.engines:
            latest = self._latest.get(e.instance)
            views.append(InstanceView(
                e.instance, True, self._in_flight[e.instance],
                latest[0] if latest else None, now - latest[1] if latest else None,
            ))
        return ClusterView(tuple(views))

    def _on_arrive(self, run: _SessionRun, _b: Any) -> None:
        sreq = self._make_request(run)
        hold = self._decide(sreq)
        if hold is None:
            if run.turn == 0:
                self._epoch += 1  # a session admitted
            return
        self._epoch += 1  # one more held session: class demand (MISA's N_wb) changed
        # a new session queues behind its class's held new sessions; a continuation alone
        key = "new:" + sreq.request.workload_class if run.turn == 0 else "session:" + sreq.request.session_id
        queue = self._held.get(key)
        if queue is not None:
            queue.requests.push(sreq, sreq.request.arrival_s)  # behind the head: asked when it is admitted
        else:
            self._held[key] = _HeldQueue(sreq, hold, self._epoch, self.now)
            self._push_recheck(key, hold)

    def _push_recheck(self, key: str, hold: Hold) -> None:
        self._push(self.now + max(hold.recheck_after_s, self.cfg.min_recheck_s), _RECHECK, key)

    def _on_recheck(self, key: str, _b: Any) -> None:
        """Ask the head of held queue ``key`` again; on admission the next one, until one is held."""
        queue = self._held[key]
        if (queue.asked_epoch == self._epoch and key.startswith("new:")
                and self.now - queue.asked_s < self._refresh_s):
            self._push_recheck(key, queue.hold)  # nothing it depends on changed: still held
            return
        requests = queue.requests
        while requests:
            hold = self._decide(requests.peek())
            if hold is not None:
                queue.hold, queue.asked_epoch, queue.asked_s = hold, self._epoch, self.now
                self._push_recheck(key, hold)
                return
            requests.pop()
            self._epoch += 1  # a session admitted
        del self._held[key]

    def _on_refresh(self, _a: Any, _b: Any) -> None:
        """Ask every held request behind the head of its queue again (see ``held_refresh_s``)."""
        for queue in self._held.values():
            for ticket, sreq in queue.requests.entries()[1:]:
                if self._decide(sreq) is None:
                    queue.requests.discard(ticket)
                    self._epoch += 1  # a session admitted
        self._push(self.now + self._refresh_s, _REFRESH)

    def _observe(self, event: Any) -> None:
        """Give ``event`` to the policy; an exception is treated as router/policy_errors.py says."""
        self.policy_errors.observe(self.policy, event)

    def _decide(self, sreq: SimRequest) -> Hold | None:
        """Ask the policy about ``sreq``: forward it if admitted (returns None), else return the Hold."""
        try:
            decision = self.policy.decide(sreq.request, self._view(), self.now)
        except Exception:  # a policy bug: raised, or counted and decided again (router/policy_errors.py)
            return self.policy_errors.decide_failed(sreq.request.request_id)
        if isinstance(decision, Hold):
            return decision
        engine = self.by_name.get(decision.instance)
        if engine is None:
            raise SimError(f"policy {self.policy.name!r} admitted on unknown instance {decision.instance!r}")
        self._observe(RequestStarted(sreq.request, engine.instance, self.now))
        self._in_flight[engine.instance] += 1
        sreq.start_s = sreq.admitted_s = self.now  # the engine moves start_s to its first schedule
        self.log.admitted(sreq, self.now)
        run = self._runs[sreq.request.session_id]
        if run.admitted_s is None:
            run.admitted_s = self.now
        engine.add(sreq)
        i = self.engines.index(engine)
        if not engine.busy:
            self._schedule(i)
        else:
            end = engine.interrupt(self.now)
            if end is not None:
                self._step_seq[i] += 1
                self._push(end, _STEP, i, self._step_seq[i])
        return None

    def _schedule(self, i: int) -> None:
        engine = self.engines[i]
        end = engine.schedule(self.now)
        self._publish_kv(engine)
        if end is not None:
            self._step_seq[i] += 1
            self._push(end, _STEP, i, self._step_seq[i])

    def _on_step(self, i: int, seq: int) -> None:
        if seq != self._step_seq[i]:
            return  # superseded by an interrupted chunk's earlier end
        engine = self.engines[i]
        finished = engine.complete(self.now)
        self._publish_kv(engine)
        for sreq in finished:
            self._finish(engine, sreq)
        self._schedule(i)

    def _finish(self, engine: Engine, sreq: SimRequest) -> None:
        req = sreq.request
        self._in_flight[engine.instance] -= 1
        self._observe(RequestFinished(
            req, engine.instance, self.now, prompt_tokens=req.prompt_tokens,
            completion_tokens=sreq.output_tokens, cached_tokens=sreq.hit_tokens,
        ))
        self.log.finished(sreq, self.now)
        run = self._runs[req.session_id]
        run.model_s += self.now - req.arrival_s
        if req.session_end:
            self._epoch += 1  # a session ended
            self._observe(SessionEnded(req.session_id, self.now))
            del self._runs[req.session_id]
            self.trainer.complete(run.trace.unit_id, self.now)
            if ("start" not in self._window and sum(self.trainer.completed.values()) >= self._warmup_units
                    and self.now >= self.cfg.warmup_s):
                self._mark_window("start")
            self.log.session_done(run.trace.workload_class, run.model_s, run.gap_s, run.released_s,
                                  run.admitted_s, self.now, -(-(req.prompt_tokens + sreq.output_tokens)
                                                             // self.cfg.engine.block_size))
            self._release()
        else:
            gap = run.trace.requests[run.turn].tool_gap_s * run.gap_factor
            run.gap_s += gap
            run.turn += 1
            self._push(self.now + gap + self.cfg.continuation_delay_s + self.cfg.request_overhead_s, _ARRIVE, run)

    # ------------------------------------------------------------------ signals
    def _publish_kv(self, engine: Engine) -> None:
        if not engine.kv.events:
            return
        sig = self.cfg.signals
        batch = []
        for kind, hashes in engine.kv.drain_events():
            if sig.kv_event_loss and self._rng.random() < sig.kv_event_loss:
                continue
            if kind == "stored":
                batch.append(BlocksStored(engine.instance, tuple(hashes), self.now))
            elif kind == "removed":
                batch.append(BlocksRemoved(engine.instance, tuple(hashes), self.now))
            else:
                batch.append(AllBlocksCleared(engine.instance, self.now))
        self._send(batch, sig.kv_event_delay_s)

    def _send(self, batch: list, delay_s: float) -> None:
        """Deliver signal events to the policy now, or as one heap event after ``delay_s``."""
        if not batch:
            return
        if delay_s > 0:
            self._push(self.now + delay_s, _DELIVER, batch)
        else:
            self._on_deliver(batch, None)

    def _on_scrape(self, _a: Any, _b: Any) -> None:
        sig = self.cfg.signals
        batch = [MetricsSampled(e.instance, e.metrics(), self.now) for e in self.engines
                 if not (sig.metrics_loss and self._rng.random() < sig.metrics_loss)]
        self._send(batch, sig.metrics_delay_s)
        self._push(self.now + sig.scrape_period_s, _SCRAPE)

    def _on_deliver(self, batch: list, _b: Any) -> None:
        for ev in batch:
            if isinstance(ev, MetricsSampled):
                self._latest[ev.instance] = (ev.metrics, ev.now)
                self._epoch += 1
            elif not isinstance(ev, (BlocksStored, BlocksRemoved)):
                self._epoch += 1
            self._observe(ev)

    def _on_sync(self, _a: Any, _b: Any) -> None:
        for e in self.engines:
            e.reset_prefix_cache()
            self._publish_kv(e)
        self._push(self.now + self.cfg.weight_sync_period_s, _SYNC)

    def _on_tick(self, _a: Any, _b: Any) -> None:
        self.timeline.append(self.log.timeline_sample(self))
        self._push(self.now + self.cfg.timeline_period_s, _TICK)
