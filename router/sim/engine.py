"""One vLLM-like engine: waiting / running queues, continuous batching, chunked prefill,
recompute preemption, over a :class:`~router.sim.kv_cache.KVCache`.

The scheduler follows vLLM v1 (``vllm/v1/core/sched/scheduler.py``): each step has a token
budget (``max_num_batched_tokens``). Running requests are served first: every decoding
request gets 1 token, then requests still in prefill get the rest of their prompt, cut
to the budget (chunked prefill). When a running request's blocks do not fit, the most
recently admitted running request is preempted (blocks freed, progress recomputed later)
until they do. Then, if nothing was preempted, waiting requests are admitted in FIFO
order while budget, ``max_num_seqs`` and KV allow, after a prefix-cache lookup.

Token accounting per request: ``num_tokens = prompt + generated``; ``computed`` tokens
have KV. A step computes some tokens; when ``computed`` reaches ``num_tokens`` the step
samples one new token. A decode step computes 1 token and samples 1; the last prefill
chunk samples the first output token. KV blocks are allocated when scheduled, and a full
block is cached (hashed, BlockStored) when it is allocated for the tokens this step computes,
as vLLM's ``allocate_slots`` does (``cache_blocks`` up to computed + new tokens): a second
request admitted in the same step (a GRPO sibling sent at the same moment) hits the first
one's prompt blocks. The prefix-cache counters count a request at its first admission only
(vLLM records a preempted request's lookups apart from ``vllm:prefix_cache_queries``).

Speed (the per-step work never scans the batch): decoding requests advance together, one
token per step, so each keeps only its join point (``clock`` and tokens at joining) and
the engine keeps ``clock`` (steps run), the number of decoders and the sum of their
contexts. Two heaps say when something happens to one of them: the step at which it
finishes, and the step at which it needs its next KV block (and its last block is full).
When a step is decode-only and nothing waiting can be admitted, up to
``max_decode_chunk_steps`` steps are planned as one event; step times grow linearly with
context, so a new arrival cuts the chunk short exactly at a step boundary
(:meth:`Engine.interrupt`).
"""

from __future__ import annotations

import heapq
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
    max_decode_chunk_steps: int = 256


@dataclass(eq=False)
class SimRequest:
    """A request inside the simulator.

    Attributes:
        request: what the policy sees.
        output_tokens: tokens this request will generate (known to the simulator only).
        stream_hashes: chained hashes of every full block of prompt + output, in order.
        computed: tokens with KV; output_done: tokens generated (both exact while the
            request is not decoding; a decoding request's are derived from its join point).
        hit_tokens: prefix-cache hit (tokens) at its first schedule.
        admitted_s / start_s / first_token_s / finish_s: when the router admitted it to this
            engine, the engine first scheduled it, its first token and its last (s).
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
    admitted_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    admit_seq: int = 0
    join_clock: int = -1  # >= 0 while decoding: engine clock when it started decoding
    epoch: int = 0  # bumped on preemption so stale heap entries are skipped

    @property
    def prompt_tokens(self) -> int:
        """L_r, prompt length in tokens."""
        return self.request.prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus tokens generated so far (exact while not decoding)."""
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
    decode_seq_steps: int = 0
    """Decoding sequences summed over steps: the decode tokens, without the first token a
    prefill step emits (the simulator's own; vLLM has no such counter)."""
    decode_context_tokens: int = 0
    """Context tokens of the decoding sequences summed over steps (the KV a decode step
    reads, a shared prefix once per sequence); with ``decode_seq_steps`` it gives the mean
    context per decode token."""
    decode_kv_tokens: int = 0
    """KV tokens of the decoders (blocks referenced, a shared block once, less the blocks of
    requests still in prefill, x block size) summed over the steps that decode: with
    ``decode_context_tokens`` it says how many context tokens the cache holds per token of KV
    (prefix sharing). A prefilling request's block shared with a decoder is subtracted too,
    so the sharing it gives errs high, never low."""


class Engine:
    """One engine replica. The cluster calls :meth:`schedule` when it is idle, :meth:`complete`
    at the planned end, and :meth:`interrupt` when a request arrives mid-chunk.

    Args:
        instance: the instance id.
        config: :class:`EngineConfig`.
        cost: an object with ``step_time_s(prefill_tokens, decode_seqs, context_tokens,
            attention_pairs)`` (``router/sim/cost_model.py``).
    """

    def __init__(self, instance: str, config: EngineConfig, cost) -> None:
        self.instance = instance
        self.config = config
        self.cost = cost
        self.kv = KVCache(config.num_blocks, config.block_size)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # admission order; preemption takes the last
        self.prefilling: list[SimRequest] = []  # running requests not yet decoding, in order
        self.counters = EngineCounters()
        self.busy = False
        self.clock = 0  # steps run
        self._n_dec = 0
        self._dec_base = 0  # sum over decoders of (computed at join - join clock)
        self._finish_heap: list[tuple[int, int, int, SimRequest]] = []
        self._block_heap: list[tuple[int, int, int, SimRequest]] = []
        self._seq = 0
        self._plan: list[tuple[SimRequest, int]] = []
        self._steps = 0
        self._start_s = 0.0
        self._t0_s = 0.0
        self._dt_s = 0.0
        self._dec_ctx0 = 0  # context of the decoders at the plan's first step
        self._kv_tokens0 = 0  # KV tokens in use then
        self.end_s = 0.0

    # ------------------------------------------------------------------ queueing
    def add(self, req: SimRequest) -> None:
        """Queue an admitted request (it waits for the next step boundary)."""
        req.instance = self.instance
        self.waiting.append(req)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _sync(self, req: SimRequest) -> None:
        """Make a decoding request's computed/output_done exact at the current clock."""
        if req.join_clock >= 0:
            d = self.clock - req.join_clock
            req.computed += d
            req.output_done += d
            req.join_clock = self.clock

    def _start_decoding(self, req: SimRequest) -> None:
        bs = self.config.block_size
        req.join_clock = self.clock
        self._n_dec += 1
        self._dec_base += req.computed - self.clock
        self._seq += 1
        heapq.heappush(self._finish_heap, (self.clock + req.output_tokens - req.output_done, self._seq, req.epoch, req))
        # next block needed when computed reaches held * block_size
        need_at = self.clock + req.holding.num_blocks * bs - req.computed
        heapq.heappush(self._block_heap, (need_at, self._seq, req.epoch, req))

    def _stop_decoding(self, req: SimRequest) -> None:
        self._sync(req)
        self._n_dec -= 1
        self._dec_base -= req.computed - self.clock
        req.join_clock = -1
        req.epoch += 1

    def _remove_running(self, req: SimRequest) -> None:
        if self.running and self.running[-1] is req:
            self.running.pop()
        else:
            self.running.remove(req)
        if req.join_clock >= 0:
            self._stop_decoding(req)
        else:
            self.prefilling.remove(req)

    def _preempt_last(self) -> SimRequest:
        victim = self.running[-1]
        self._remove_running(victim)
        self.kv.free(victim.holding)
        victim.computed = 0
        victim.n_cached_blocks = 0
        victim.epoch += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _cache_full(self, req: SimRequest, upto_tokens: int | None = None) -> None:
        """Cache ``req``'s full blocks up to ``upto_tokens`` (default: its computed tokens)."""
        tokens = req.computed if upto_tokens is None else upto_tokens
        full = min(tokens // self.config.block_size, len(req.stream_hashes))
        if full > req.n_cached_blocks:
            self.kv.cache_full_blocks(req.holding, req.stream_hashes[req.n_cached_blocks:full])
            req.n_cached_blocks = full

    # ------------------------------------------------------------------ one step
    def _decode_blocks_due(self, upto_clock: int) -> bool:
        """Give every decoder whose next block is due by ``upto_clock`` its blocks.

        Returns False if a decoder was preempted for lack of KV (then nothing else is due).
        """
        heap, bs, kv = self._block_heap, self.config.block_size, self.kv
        while heap and heap[0][0] <= upto_clock:
            _, _, epoch, req = heap[0]
            if epoch != req.epoch:
                heapq.heappop(heap)
                continue
            heapq.heappop(heap)
            self._sync(req)
            need = self._blocks_for(req.computed + 1 + (upto_clock - self.clock)) - req.holding.num_blocks
            while not kv.allocate(req.holding, need):
                if self._preempt_last() is req:
                    return False
            self._cache_full(req)
            self._seq += 1
            heapq.heappush(heap, (self.clock + req.holding.num_blocks * bs - req.computed, self._seq, req.epoch, req))
        return True

    def schedule(self, now: float) -> float | None:
        """Plan the next step(s) starting at ``now``; return their end time, or None if idle."""
        cfg, kv = self.config, self.kv
        preempted_before = self.counters.preemptions
        # 1. decoders first: blocks for this step's token
        self._decode_blocks_due(self.clock)
        budget = cfg.max_num_batched_tokens - self._n_dec
        plan: list[tuple[SimRequest, int]] = []
        # 2. running requests still in prefill (chunked)
        i = 0
        while i < len(self.prefilling) and budget > 0:
            req = self.prefilling[i]
            n_new = min(req.num_tokens - req.computed, budget)
            ok = True
            while not kv.allocate(req.holding, self._blocks_for(req.computed + n_new) - req.holding.num_blocks):
                if self._preempt_last() is req:
                    ok = False
                    break
            if not ok:
                break
            self._cache_full(req, req.computed + n_new)  # vLLM caches at allocation
            plan.append((req, n_new))
            budget -= n_new
            i += 1
        # 3. waiting requests, unless this step preempted something
        admit_blocked = bool(self.waiting)
        if self.counters.preemptions == preempted_before:
            admit_blocked = self._admit_waiting(plan, budget, now)
        if not plan and not self._n_dec:
            self.busy = False
            return None
        steps = 1
        if not plan and (admit_blocked or not self.waiting):
            steps = self._decode_chunk_steps()
        prefill = sum(n for _, n in plan)
        dec_ctx = self._dec_base + self._n_dec * (self.clock + 1)
        ctx = dec_ctx + sum(r.computed + n for r, n in plan)
        # a decode token attends its context; a chunk of n after c computed: n*c + n(n+1)/2
        pairs = dec_ctx + sum(n * r.computed + n * (n + 1) // 2 for r, n in plan)
        t0 = self.cost.step_time_s(prefill, self._n_dec, ctx, pairs)
        dt = 0.0
        if steps > 1:
            last = ctx + self._n_dec * (steps - 1)
            dt = (self.cost.step_time_s(0, self._n_dec, last, last) - t0) / (steps - 1)
        self._plan, self._steps, self._start_s, self._t0_s, self._dt_s = plan, steps, now, t0, dt
        self._dec_ctx0 = dec_ctx
        if self._n_dec:  # the decoders' KV: blocks in use less those of requests in prefill
            prefill_blocks = sum(r.holding.num_blocks for r in self.prefilling)
            self._kv_tokens0 = max(0, kv.num_used_blocks - prefill_blocks) * cfg.block_size
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
            if not req.scheduled_once:  # vLLM counts a preempted request's lookup apart
                c.prefix_queries_tokens += req.num_tokens
                c.prefix_hits_tokens += hit * bs
                req.scheduled_once = True
                req.hit_tokens = hit * bs
                req.start_s = now
                c.prompt_tokens += req.prompt_tokens
            req.computed = hit * bs
            req.n_cached_blocks = hit
            self._cache_full(req, req.computed + n_new)  # vLLM caches at allocation: a sibling
            # admitted next in this step hits these blocks
            self._seq += 1
            req.admit_seq = self._seq
            self.running.append(req)
            self.prefilling.append(req)
            plan.append((req, n_new))
            budget -= n_new
        return False

    def _decode_chunk_steps(self) -> int:
        """How many decode-only steps can run as one event before the batch must change."""
        fh = self._finish_heap
        while fh and fh[0][2] != fh[0][3].epoch:
            heapq.heappop(fh)
        steps = self.config.max_decode_chunk_steps
        if fh:
            steps = min(steps, fh[0][0] - self.clock)
        bh = self._block_heap
        while bh and bh[0][2] != bh[0][3].epoch:
            heapq.heappop(bh)
        if bh and bh[0][0] < self.clock + steps:
            # Blocks fall due inside the chunk; allow it only if even the worst case fits:
            # each decoder due in it needs at most steps // block_size + 1 blocks.
            end = self.clock + steps
            due = sum(1 for e in bh if e[0] < end and e[2] == e[3].epoch)
            if not self.kv.can_allocate(due * (steps // self.config.block_size + 1)):
                steps = min(steps, bh[0][0] - self.clock)
        return max(1, steps)

    def _chunk_time_s(self, steps: int) -> float:
        """Duration of the first ``steps`` steps of the current plan."""
        return steps * self._t0_s + self._dt_s * steps * (steps - 1) / 2

    def interrupt(self, now: float) -> float | None:
        """A request arrived at ``now`` during a multi-step decode chunk: end the chunk at the
        step boundary after ``now``. Returns the new end time, or None if unchanged."""
        if not self.busy or self._steps <= 1 or now >= self.end_s:
            return None
        elapsed = now - self._start_s
        # smallest k with T(k) > elapsed, T(k) = k*t0 + dt*k(k-1)/2
        lo, hi = 1, self._steps
        while lo < hi:
            mid = (lo + hi) // 2
            if self._chunk_time_s(mid) > elapsed:
                hi = mid
            else:
                lo = mid + 1
        if lo >= self._steps:
            return None
        self._steps = lo
        self.end_s = self._start_s + self._chunk_time_s(lo)
        return self.end_s

    def complete(self, now: float) -> list[SimRequest]:
        """Apply the planned step(s) at their end ``now``; return the requests that finished."""
        c = self.counters
        steps = self._steps
        c.busy_s += now - self._start_s
        c.generation_tokens += self._n_dec * steps
        c.decode_seq_steps += self._n_dec * steps
        c.decode_context_tokens += self._dec_ctx0 * steps + self._n_dec * steps * (steps - 1) // 2
        if self._n_dec:  # the cache grows by about a token per decoder and step, as the context does
            c.decode_kv_tokens += self._kv_tokens0 * steps + self._n_dec * steps * (steps - 1) // 2
        if steps > 1:
            # blocks that fell due inside the chunk (checked to fit when it was planned)
            self._decode_blocks_due(self.clock + steps - 1)
        self.clock += steps
        finished: list[SimRequest] = []
        for req, n_new in self._plan:
            c.prefill_computed_tokens += n_new
            req.computed += n_new
            self._cache_full(req)
            if req.computed >= req.num_tokens:
                req.output_done += 1
                c.generation_tokens += 1
                if req.first_token_s is None:
                    req.first_token_s = now
                self.prefilling.remove(req)
                if req.output_done >= req.output_tokens:
                    self.running.remove(req)
                    self._finish(req, now, finished)
                else:
                    self._start_decoding(req)
        fh = self._finish_heap
        while fh and fh[0][0] <= self.clock:
            _, _, epoch, req = heapq.heappop(fh)
            if epoch != req.epoch:
                continue
            self._remove_running(req)
            self._cache_full(req)
            self._finish(req, now, finished)
        self._plan = []
        self.busy = False
        return finished

    def _finish(self, req: SimRequest, now: float, out: list[SimRequest]) -> None:
        req.finish_s = now
        req.epoch += 1
        self.kv.free(req.holding)
        out.append(req)

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
