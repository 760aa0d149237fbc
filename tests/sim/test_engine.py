"""The engine model against hand-worked cases: prefix hits, eviction order, preemption, chunked prefill."""

from __future__ import annotations

import pytest

from router.policies.base import Request
from router.sim.cost_model import LinearStepCost
from router.sim.engine import Engine, EngineConfig, SimRequest
from router.sim.kv_cache import KVCache, KVHolding

BS = 4
# 1 ms per step + 1 ms per prefill token + 2 ms per decode sequence + 0.01 ms per context token
COST = LinearStepCost(0.001, 0.001, 0.002, 0.00001)


def make_req(rid: str, prompt: int, output: int, hashes: list[int] | None = None) -> SimRequest:
    n_stream = (prompt + output) // BS
    stream = hashes if hashes is not None else [hash((rid, i)) for i in range(n_stream)]
    return SimRequest(Request(rid, rid, prompt_tokens=prompt), output, list(stream[:n_stream]))


def run_to_idle(engine: Engine, now: float = 0.0, limit: int = 10_000) -> tuple[float, list[SimRequest]]:
    """Step the engine until it has nothing to do; returns (time, finished requests in order)."""
    done = []
    for _ in range(limit):
        end = engine.schedule(now)
        if end is None:
            return now, done
        now = end
        done += engine.complete(now)
    raise AssertionError("engine did not go idle")


def test_second_identical_prompt_hits_all_full_blocks_but_the_last_token():
    engine = Engine("e", EngineConfig(num_blocks=64, block_size=BS), COST)
    shared = [101, 102, 103, 104, 105]  # 20 tokens of prompt + output blocks
    a = make_req("a", 12, 2, shared)
    engine.add(a)
    run_to_idle(engine)
    b = make_req("b", 12, 2, shared)
    engine.add(b)
    run_to_idle(engine)
    # 12 prompt tokens = 3 full blocks, but the last token must be recomputed: (12-1)//4 = 2 blocks hit
    assert a.hit_tokens == 0
    assert b.hit_tokens == 8
    assert engine.counters.prefix_hits_tokens == 8
    assert engine.counters.prefix_queries_tokens == 24


def test_a_sibling_admitted_in_the_same_step_hits_the_blocks_being_computed():
    """vLLM caches a block when it allocates it for this step's tokens (``allocate_slots``),
    so two identical prompts arriving together share the prompt's blocks at once."""
    engine = Engine("e", EngineConfig(num_blocks=64, block_size=BS), COST)
    shared = [101, 102, 103, 104, 105]
    a, b = make_req("a", 12, 2, shared), make_req("b", 12, 2, shared)
    engine.add(a)
    engine.add(b)
    engine.schedule(0.0)
    assert [r.request.request_id for r, _ in engine._plan] == ["a", "b"]  # one step admits both
    assert a.hit_tokens == 0 and b.hit_tokens == 8
    assert dict((r.request.request_id, n) for r, n in engine._plan) == {"a": 12, "b": 4}
    run_to_idle(engine, engine.end_s)
    assert engine.kv.num_used_blocks == 0


def test_prefix_counters_count_a_request_once_not_again_after_preemption():
    """vLLM records a preempted request's second lookup apart from vllm:prefix_cache_queries."""
    engine = Engine("e", EngineConfig(num_blocks=6, block_size=BS, max_decode_chunk_steps=1), COST)
    first, second = make_req("first", 8, 10), make_req("second", 8, 10)
    engine.add(first)
    engine.add(second)
    run_to_idle(engine)
    assert engine.counters.preemptions >= 1
    assert engine.counters.prefix_queries_tokens == 16  # 8 + 8, each prompt once


def test_lru_evicts_oldest_freed_request_tail_block_first():
    kv = KVCache(num_blocks=5, block_size=BS)
    a, b = KVHolding(), KVHolding()
    assert kv.allocate(a, 3)
    kv.cache_full_blocks(a, [1, 2, 3])
    assert kv.allocate(b, 2)
    kv.cache_full_blocks(b, [11, 12])
    kv.free(a)  # freed first: its blocks are the oldest, tail first -> order 3, 2, 1
    kv.free(b)  # then 12, 11
    kv.drain_events()
    c = KVHolding()
    assert kv.allocate(c, 2)
    assert kv.drain_events() == [("removed", [3, 2])]
    assert kv.match_prefix([1, 2, 3], 3) == 1
    assert kv.match_prefix([11, 12], 2) == 2


def test_prefix_hit_takes_blocks_out_of_the_eviction_queue():
    kv = KVCache(num_blocks=3, block_size=BS)
    a = KVHolding()
    kv.allocate(a, 3)
    kv.cache_full_blocks(a, [1, 2, 3])
    kv.free(a)
    b = KVHolding()
    kv.acquire(b, [1, 2])  # referenced again: not evictable
    assert kv.num_used_blocks == 2
    assert kv.can_allocate(1) and not kv.can_allocate(2)
    kv.drain_events()
    c = KVHolding()
    kv.allocate(c, 1)
    assert kv.drain_events() == [("removed", [3])]


def test_chunked_prefill_splits_prompt_by_token_budget():
    cfg = EngineConfig(num_blocks=64, block_size=BS, max_num_batched_tokens=8)
    engine = Engine("e", cfg, COST)
    r = make_req("r", 20, 1)
    engine.add(r)
    chunks = []
    now = 0.0
    while (end := engine.schedule(now)) is not None:
        chunks.append([n for _, n in engine._plan])
        now = end
        engine.complete(now)
    assert chunks == [[8], [8], [4]]
    # step times: 1 ms + 1 ms/token + 0.01 ms per context token (8, 16, 20 tokens of context)
    expected = sum(0.001 + 0.001 * n + 0.00001 * ctx for n, ctx in ((8, 8), (8, 16), (4, 20)))
    assert r.first_token_s == pytest.approx(expected)
    assert r.finish_s == pytest.approx(expected)


def test_kv_exhaustion_preempts_the_latest_admitted_request_and_recomputes_it():
    # 6 blocks of 4 tokens. Two prompts of 8 tokens (2 blocks each) decode 10 tokens each:
    # both need 5 blocks at the end, 10 > 6, so the later one is preempted.
    engine = Engine("e", EngineConfig(num_blocks=6, block_size=BS, max_decode_chunk_steps=1), COST)
    first, second = make_req("first", 8, 10), make_req("second", 8, 10)
    engine.add(first)
    engine.add(second)
    _, done = run_to_idle(engine)
    assert engine.counters.preemptions >= 1
    assert [r.request.request_id for r in done] == ["first", "second"]
    assert first.output_done == 10 and second.output_done == 10
    assert engine.kv.num_used_blocks == 0


@pytest.mark.parametrize("chunk", [1, 7, 256])
def test_multi_step_decode_matches_single_steps_exactly(chunk):
    """Simulating decode in chunks changes nothing: same finish times as one step per event."""

    def finish_times(max_chunk: int) -> list[float]:
        engine = Engine("e", EngineConfig(num_blocks=200, block_size=BS, max_decode_chunk_steps=max_chunk), COST)
        reqs = [make_req(f"r{i}", 10 + 3 * i, 5 + 7 * i) for i in range(4)]
        for r in reqs:
            engine.add(r)
        run_to_idle(engine)
        return [r.finish_s for r in reqs]

    assert finish_times(chunk) == pytest.approx(finish_times(1), rel=1e-9)


def test_arrival_mid_chunk_joins_at_the_next_step_boundary():
    engine = Engine("e", EngineConfig(num_blocks=200, block_size=BS, max_decode_chunk_steps=256), COST)
    a = make_req("a", 8, 100)
    engine.add(a)
    end = engine.schedule(0.0)
    engine.complete(end)  # prefill done, first token sampled
    engine.schedule(end)  # now a decode-only chunk
    assert engine._steps > 1
    t_arrive = engine._start_s + 2.5 * engine._t0_s
    new_end = engine.interrupt(t_arrive)
    assert new_end is not None and new_end > t_arrive
    assert engine._steps == 3  # steps 1, 2 done and step 3 running at the arrival


def test_weight_sync_clears_the_prefix_cache():
    engine = Engine("e", EngineConfig(num_blocks=64, block_size=BS), COST)
    shared = [1, 2, 3, 4]
    engine.add(make_req("a", 12, 1, shared))
    run_to_idle(engine)
    engine.kv.drain_events()
    engine.reset_prefix_cache()
    assert engine.kv.drain_events() == [("cleared", [])]
    b = make_req("b", 12, 1, shared)
    engine.add(b)
    run_to_idle(engine)
    assert b.hit_tokens == 0


def test_the_decode_counters_sum_each_decode_steps_context_and_kv():
    """The step that emits token k + 1 of a 12-token prompt reads 12 + k tokens of context; a
    shared prefix block is one block of KV but context of every sequence that reads it."""
    engine = Engine("e", EngineConfig(num_blocks=64, block_size=BS), COST)
    engine.add(make_req("a", 12, 5))
    run_to_idle(engine)
    c = engine.counters
    assert c.decode_seq_steps == 4  # tokens 2..5; the first comes from the prefill step
    assert c.decode_context_tokens == 13 + 14 + 15 + 16
    assert c.decode_kv_tokens >= c.decode_context_tokens  # nothing shared: KV holds at least the context
    shared = [hash(("s", i)) for i in range(3)]
    engine = Engine("e", EngineConfig(num_blocks=64, block_size=BS), COST)
    engine.add(make_req("a", 12, 5, shared + [1, 2, 3, 4, 5]))
    engine.add(make_req("b", 12, 5, shared + [6, 7, 8, 9, 10]))
    run_to_idle(engine)
    c = engine.counters
    assert c.decode_seq_steps == 8 and c.decode_context_tokens == 2 * 58
    assert c.decode_kv_tokens < c.decode_context_tokens  # the 8 shared prompt tokens are held once
