"""One vLLM-like engine: waiting / running queues, continuous batching, chunked prefill,
recompute preemption, over a :class:`~router.sim.kv_cache.KVCache`.

The scheduler follows vLLM v1 (``vllm/v1/core/sched/scheduler.py``): each step has a token
budget (``max_num_batched_tokens``). Running requests are served first, in order, each
with the tokens it still needs (a decode needs 1, a prefill the rest of its prompt, cut
to the budget: chunked prefill). When a running request's blocks do not fit, the
*last* running request is preempted (its blocks freed, its progress recomputed later)
until they do. Then, if nothing was preempted, waiting requests are admitted in FIFO
order while budget, ``max_num_seqs`` and KV allow, after a prefix-cache lookup.

Token accounting per request: ``num_tokens = prompt + generated``; ``computed`` tokens
have KV. A step computes some tokens; when ``computed`` reaches ``num_tokens`` the step
also samples one new token. So a decode step computes 1 token and samples 1, and the
last prefill chunk samples the first output token.

Speed: when a step is decode only and nothing waiting can be admitted, the engine plans
up to ``max_decode_chunk_steps`` identical decode steps at once (the batch cannot change
before a request finishes). Step times then grow linearly with context (the cost models
are linear in it), so a new arrival can cut the chunk short exactly at a step boundary
(:meth:`Engine.interrupt`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from router.policies.base import InstanceMetrics, Request
from router.sim.kv_cache import KVCache, KVHolding


@dataclass(frozen=True)
class EngineConfig:
    """Options of one simulated engine (vLLM flag names where one exists).

    Attributes:
        num_blocks: KV blocks in the pool (``num_gpu_blocks``).
        block_size: tokens per KV block (``--block-size``).
        max_num_batched_tokens: per-step token budget (``--max-num-batched-tokens``).
        max_num_seqs: most running requests (``--max-num-seqs``).
        max_decode_chunk_steps: most decode steps simulated as one event (speed only).
    """

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_decode_chunk_steps: int = 64


@dataclass(eq=False)
class SimRequest:
    """A request inside the simulator.

    Attributes:
        request: what the policy sees.
        output_tokens: tokens this request will generate (known to the simulator only).
        stream_hashes: chained hashes of every full block of prompt + output, in order.
        computed: tokens with KV; output_done: tokens generated so far.
        hit_tokens: prefix-cache hit (tokens) at its first schedule.
    """

    request: Request
    output_tokens: int
    stream_hashes: list[int]
    computed: int = 0
    output_done: int = 0
    n_cached_blocks: int = 0
    hit_tokens: int = 0
    scheduled_once: bool = False
    holding: KVHolding = field(default_factory=KVHolding)
    instance: str = ""
    start_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def prompt_tokens(self) -> int:
        """L_r, prompt length in tokens."""
        return self.request.prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus tokens generated so far."""
        return self.request.prompt_tokens + self.output_done


@dataclass
class EngineCounters:
    """Cumulative counters, as the engine's Prometheus /metrics reports them (tokens)."""

    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    prompt_tokens: int = 0
    prefill_computed_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    busy_s: float = 0.0


def _is_decode(req: SimRequest, n_new: int) -> bool:
    """A decode step of ``req``: one token whose KV is computed while a new one is sampled."""
    return n_new == 1 and req.output_done > 0 and req.computed == req.num_tokens - 1


class Engine:
    """One engine replica. The cluster calls :meth:`schedule` when it is idle, :meth:`complete`
    at the planned end, and :meth:`interrupt` when a request arrives mid-chunk.

    Args:
        instance: the instance id.
        config: :class:`EngineConfig`.
        cost: an object with ``step_time_s(prefill_tokens, decode_seqs, context_tokens)``.
    """

    def __init__(self, instance: str, config: EngineConfig, cost) -> None:
        self.instance = instance
        self.config = config
        self.cost = cost
        self.kv = KVCache(config.num_blocks, config.block_size)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = EngineCounters()
        self.busy = False
        self._plan: list[tuple[SimRequest, int]] = []
        self._steps = 0
        self._start_s = 0.0
        self._t0_s = 0.0  # first step's duration
        self._dt_s = 0.0  # growth of step duration per step (linear in context)
        self.end_s = 0.0

    # ------------------------------------------------------------------ queueing
    def add(self, req: SimRequest) -> None:
        """Queue an admitted request (it waits for the next step boundary)."""
        req.instance = self.instance
        self.waiting.append(req)

    def _blocks_for(self, tokens: int) -> int:
        bs = self.config.block_size
        return -(-tokens // bs)

    def _preempt(self, req: SimRequest) -> None:
        self.kv.free(req.holding)
        req.computed = 0
        req.n_cached_blocks = 0
        self.counters.preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ one step
    def schedule(self, now: float) -> float | None:
        """Plan the next step starting at ``now``; return its end time, or None if idle."""
        cfg, kv = self.config, self.kv
        budget = cfg.max_num_batched_tokens
        plan: list[tuple[SimRequest, int]] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n_new = min(req.num_tokens - req.computed, budget)
            need = self._blocks_for(req.computed + n_new) - req.holding.num_blocks
            while not kv.allocate(req.holding, need):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                plan.append((req, n_new))
                budget -= n_new
                i += 1
                continue
            break  # req itself was preempted: it was the last running request
        admit_blocked = bool(self.waiting)
        if not preempted:
            admit_blocked = self._admit_waiting(plan, budget, now)
        if not plan:
            self.busy = False
            return None
        steps = 1
        if (admit_blocked or not self.waiting) and len(plan) == len(running):
            steps = self._decode_chunk_steps(plan)
        decode = sum(1 for r, n in plan if _is_decode(r, n))
        prefill = sum(n for r, n in plan if not _is_decode(r, n))
        ctx = sum(r.computed + n for r, n in plan)
        t0 = self.cost.step_time_s(prefill, decode, ctx)
        dt = 0.0
        if steps > 1:
            dt = (self.cost.step_time_s(0, decode, ctx + len(plan) * (steps - 1)) - t0) / (steps - 1)
        self._plan, self._steps, self._start_s, self._t0_s, self._dt_s = plan, steps, now, t0, dt
        self.end_s = now + self._chunk_time_s(steps)
        self.busy = True
        return self.end_s

    def _admit_waiting(self, plan: list[tuple[SimRequest, int]], budget: int, now: float) -> bool:
        """Move waiting requests into the batch (FIFO). Returns True if one was left waiting."""
        cfg, kv, bs = self.config, self.kv, self.config.block_size
        while self.waiting and budget > 0:
            if len(self.running) >= cfg.max_num_seqs:
                return True
            req = self.waiting[0]
            # NOTE: when the whole prompt hits, the last token is recomputed to get logits.
            hit = kv.match_prefix(req.stream_hashes, (req.num_tokens - 1) // bs)
            kv.acquire(req.holding, req.stream_hashes[:hit])
            n_new = min(req.num_tokens - hit * bs, budget)
            if not kv.allocate(req.holding, self._blocks_for(hit * bs + n_new) - hit):
                kv.free(req.holding)
                return True
            self.waiting.popleft()
            c = self.counters
            c.prefix_queries_tokens += req.num_tokens
            c.prefix_hits_tokens += hit * bs
            if not req.scheduled_once:
                req.scheduled_once = True
                req.hit_tokens = hit * bs
                req.start_s = now
                c.prompt_tokens += req.prompt_tokens
            req.computed = hit * bs
            req.n_cached_blocks = hit
            self.running.append(req)
            plan.append((req, n_new))
            budget -= n_new
        return False

    def _decode_chunk_steps(self, plan: list[tuple[SimRequest, int]]) -> int:
        """How many identical decode steps the batch can run before it must change."""
        if not all(_is_decode(r, n) for r, n in plan):
            return 1
        steps = min([self.config.max_decode_chunk_steps] + [r.output_tokens - r.output_done for r, _ in plan])
        if steps <= 1:
            return 1
        extra = sum(
            self._blocks_for(r.computed + steps) - self._blocks_for(r.computed + 1) for r, _ in plan
        )
        return steps if self.kv.can_allocate(extra) else 1

    def _chunk_time_s(self, steps: int) -> float:
        """Duration of the first ``steps`` steps of the current plan."""
        return steps * self._t0_s + self._dt_s * steps * (steps - 1) / 2

    def interrupt(self, now: float) -> float | None:
        """A request arrived at ``now`` during a multi-step decode chunk: end the chunk at the
        step boundary after ``now``. Returns the new end time, or None if unchanged."""
        if not self.busy or self._steps <= 1 or now >= self.end_s:
            return None
        elapsed = now - self._start_s
        k = 1
        while k < self._steps and self._chunk_time_s(k) <= elapsed:
            k += 1
        if k >= self._steps:
            return None
        self._steps = k
        self.end_s = self._start_s + self._chunk_time_s(k)
        return self.end_s

    def complete(self, now: float) -> list[SimRequest]:
        """Apply the planned step(s) at their end ``now``; return the requests that finished."""
        kv, bs, c = self.kv, self.config.block_size, self.counters
        steps = self._steps
        c.busy_s += now - self._start_s
        finished = []
        for req, n_new in self._plan:
            if steps > 1:
                kv.allocate(req.holding, self._blocks_for(req.computed + steps) - req.holding.num_blocks)
                req.computed += steps
                req.output_done += steps
                c.generation_tokens += steps
            else:
                if not _is_decode(req, n_new):
                    c.prefill_computed_tokens += n_new
                req.computed += n_new
                if req.computed >= req.num_tokens:
                    req.output_done += 1
                    c.generation_tokens += 1
                    if req.first_token_s is None:
                        req.first_token_s = now
            full = min(req.computed // bs, len(req.stream_hashes))
            if full > req.n_cached_blocks:
                kv.cache_full_blocks(req.holding, req.stream_hashes[req.n_cached_blocks:full])
                req.n_cached_blocks = full
            if req.output_done >= req.output_tokens:
                req.finish_s = now
                kv.free(req.holding)
                finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
        self._plan = []
        self.busy = False
        return finished

    # ------------------------------------------------------------------ signals
    def reset_prefix_cache(self) -> None:
        """Weight sync: forget every cached prefix (emits AllBlocksCleared)."""
        self.kv.reset([r.holding for r in self.running])

    def metrics(self) -> InstanceMetrics:
        """The engine's /metrics as one sample."""
        c = self.counters
        return InstanceMetrics(
            num_requests_running=len(self.running),
            num_requests_waiting=len(self.waiting),
            kv_cache_usage=self.kv.usage,
            num_blocks=self.config.num_blocks,
            block_size=self.config.block_size,
            prefix_cache_queries_total=float(c.prefix_queries_tokens),
            prefix_cache_hits_total=float(c.prefix_hits_tokens),
            prompt_tokens_total=float(c.prompt_tokens),
            generation_tokens_total=float(c.generation_tokens),
            num_preemptions_total=float(c.preemptions),
        )
