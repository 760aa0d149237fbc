"""Signals: vLLM /metrics parsing and KV events over ZMQ with hash translation."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq
import zmq.asyncio

from router.policies.base import AllBlocksCleared, BlocksRemoved, BlocksStored, InstanceMetrics
from router.prefix_index import chain_hashes
from router.signals import KvEventSubscriber, KvHashTranslator, MetricsScraper, parse_engine_metrics
from tests.router.fake_engine import FakeEngine, vllm_metrics_text

BLOCK = 4
INSTANCE = "http://engine-0:8000"


def test_vllm_metrics_page_parsed_into_instance_metrics():
    text = vllm_metrics_text(running=3, waiting=2, block_size=128, num_blocks=364, served=5, engine_s=2.5,
                             core_s=(0.5, 0.75, 1.0))
    m = parse_engine_metrics(text)
    assert m == InstanceMetrics(
        num_requests_running=3, num_requests_waiting=2, kv_cache_usage=0.25, num_blocks=364, block_size=128,
        prefix_cache_queries_total=5000.0, prefix_cache_hits_total=4480.0, prompt_tokens_total=5000.0,
        generation_tokens_total=640.0, num_preemptions_total=0.0, engine_steps_total=640.0, prefills_total=5.0,
        e2e_latency_s_total=2.5, e2e_requests_total=5.0, queue_time_s_total=0.5, prefill_time_s_total=0.75,
        decode_time_s_total=1.0,
    )  # a step per generated token here: 128 steps per request, the fake's page says


def test_metrics_of_two_engine_cores_are_summed_and_usage_is_the_max():
    one = vllm_metrics_text(running=1, waiting=0, block_size=16, num_blocks=10)
    two = one.replace('engine="0"', 'engine="1"').replace("_perc{engine=\"1\",model_name=\"fake-model\"} 0.25",
                                                          "_perc{engine=\"1\",model_name=\"fake-model\"} 0.75")
    body_two = "\n".join(line for line in two.splitlines() if not line.startswith("#"))
    m = parse_engine_metrics(one + body_two + "\n")
    assert m.num_requests_running == 2 and m.kv_cache_usage == 0.75


@pytest.mark.parametrize("text", ["", "garbage {{{ not prometheus", "other_metric 1.0\n"])
def test_garbage_or_foreign_metrics_page_is_rejected(text):
    with pytest.raises(ValueError):
        parse_engine_metrics(text)


async def test_scraper_reports_good_engines_and_skips_dead_ones():
    engine = FakeEngine(block_size=32)
    await engine.start()
    samples, failed = [], []
    scraper = MetricsScraper([engine.url, "http://127.0.0.1:9"], lambda i, m, now: samples.append((i, m)),
                             timeout_s=1.0, clock=lambda: 7.0, on_failure=failed.append)
    try:
        await scraper.scrape_once()
        await scraper.scrape_once()
    finally:
        await scraper.close()
        await engine.stop()
    assert [(i, m.block_size) for i, m in samples] == [(engine.url, 32)] * 2
    assert failed == ["http://127.0.0.1:9"] * 2  # every failure counted (only the first is logged)


@pytest.mark.parametrize("scraped_just_now, expected", [(False, 1), (True, 0)])
async def test_scrape_loop_waits_an_interval_first_when_the_caller_just_scraped(scraped_just_now, expected):
    # the router scrapes once before serving; its loop must not scrape again at once (that
    # second scrape raced with what happened to an engine right after start)
    engine = FakeEngine(block_size=32)
    await engine.start()
    samples = []
    scraper = MetricsScraper([engine.url], lambda i, m, now: samples.append(i), interval_s=3600.0,
                             timeout_s=5.0)
    task = asyncio.create_task(scraper.run(scraped_just_now=scraped_just_now))
    try:
        for _ in range(500):  # up to 5 s for the immediate scrape, under load
            if samples:
                break
            await asyncio.sleep(0.01)
        assert len(samples) == expected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await engine.stop()


async def test_scrape_loop_slows_while_idle_and_a_wake_scrapes_at_once():
    # idle engines: rounds every idle_interval_s (an hour here) instead of interval_s; a
    # request going out (wake) ends that wait and the next round comes at once
    engine = FakeEngine(block_size=32)
    await engine.start()
    samples, idle = [], [False]
    scraper = MetricsScraper([engine.url], lambda i, m, now: samples.append(i), interval_s=0.01,
                             timeout_s=5.0, idle=lambda: idle[0], idle_interval_s=3600.0)
    task = asyncio.create_task(scraper.run())

    async def until(n):  # up to 10 s under load
        for _ in range(1000):
            if len(samples) >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(samples)} scrapes, expected {n}")

    try:
        await until(3)  # busy: a round every 10 ms
        idle[0] = True
        for _ in range(30):  # a round under way when it went idle may still end
            quiet = len(samples)
            await asyncio.sleep(0.3)  # 30 rounds at the busy interval
            if len(samples) == quiet:
                break
        assert len(samples) == quiet
        idle[0] = False
        scraper.wake()
        await until(quiet + 2)  # at once, and busy again after it
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await engine.stop()
    assert scraper.idle_interval_s == 3600.0
    # never faster than the busy interval
    assert MetricsScraper([], lambda *a: None, interval_s=2.0, idle_interval_s=0.5).idle_interval_s == 2.0


# --------------------------------------------------------------------------- KV events
# Frames shaped like vLLM's ZmqEventPublisher: (topic, seq as 8 bytes big-endian,
# msgpack [ts, [event maps tagged "type"], dp_rank]); vllm/distributed/kv_events.py.


def stored(vllm_hashes, parent, token_ids, block_size=BLOCK):
    return {"type": "BlockStored", "block_hashes": vllm_hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}


def removed(vllm_hashes):
    return {"type": "BlockRemoved", "block_hashes": vllm_hashes, "medium": "GPU"}


def frames(seq, events, topic=b"kv-events"):
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.encode([1.0, events, None])]


def make_subscriber(endpoint="tcp://127.0.0.1:1"):
    sink = []
    sub = KvEventSubscriber({INSTANCE: endpoint}, sink.append, KvHashTranslator(block_size=BLOCK), clock=lambda: 3.0)
    return sub, sink


def test_block_stored_translated_into_project_hash_chain_across_events():
    sub, sink = make_subscriber()
    tokens = list(range(12))
    sub.handle_frames(INSTANCE, frames(0, [stored([b"\xaa" * 32, b"\xbb" * 32], None, tokens[:8])]))
    sub.handle_frames(INSTANCE, frames(1, [stored([b"\xcc" * 32], b"\xbb" * 32, tokens[8:])]))
    expected = chain_hashes(tokens, BLOCK)
    assert sink == [BlocksStored(INSTANCE, tuple(expected[:2]), 3.0), BlocksStored(INSTANCE, (expected[2],), 3.0)]
    sub.handle_frames(INSTANCE, frames(2, [removed([b"\xbb" * 32, b"\xcc" * 32, b"\x00"])]))
    assert sink[-1] == BlocksRemoved(INSTANCE, (expected[1], expected[2]), 3.0)
    assert sub.translator.mapped_blocks(INSTANCE) == 1


def test_block_with_unknown_parent_is_skipped():
    sub, sink = make_subscriber()
    sub.handle_frames(INSTANCE, frames(0, [stored([5], 999, [1, 2, 3, 4])]))
    assert sink == [] and sub.translator.mapped_blocks(INSTANCE) == 0


def test_all_blocks_cleared_forgets_the_instance():
    sub, sink = make_subscriber()
    sub.handle_frames(INSTANCE, frames(0, [stored([1], None, [1, 2, 3, 4]), {"type": "AllBlocksCleared"}]))
    assert isinstance(sink[-1], AllBlocksCleared) and sub.translator.mapped_blocks(INSTANCE) == 0


def test_sequence_gap_clears_the_instance_index():
    sub, sink = make_subscriber()
    sub.handle_frames(INSTANCE, frames(0, [stored([1], None, [1, 2, 3, 4])]))
    sub.handle_frames(INSTANCE, frames(5, [stored([2], None, [5, 6, 7, 8])]))  # batches 1-4 lost
    assert [type(e).__name__ for e in sink] == ["BlocksStored", "AllBlocksCleared", "BlocksStored"]
    assert sub.translator.mapped_blocks(INSTANCE) == 1


@pytest.mark.parametrize("bad", [[b"kv-events", b"\x00"], [b"kv-events", (0).to_bytes(8, "big"), b"\xc1garbage"],
                                 [b"kv-events", (0).to_bytes(8, "big"), msgspec.msgpack.encode({"not": "a batch"})]])
def test_garbage_kv_frames_are_dropped_without_raising(bad):
    sub, sink = make_subscriber()
    sub.handle_frames(INSTANCE, bad)
    assert sink == []


async def test_kv_events_received_over_zmq_pub_socket():
    ctx = zmq.asyncio.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub, sink = make_subscriber(f"tcp://127.0.0.1:{port}")
    task = asyncio.create_task(sub.run())
    try:
        tokens = [7] * 8
        # PUB drops messages until the subscription has propagated: publish until one arrives.
        for seq in range(200):
            await pub.send_multipart(frames(seq, [stored([seq * 10 + 1, seq * 10 + 2], None, tokens)]))
            await asyncio.sleep(0.01)
            if sink:
                break
        assert sink[0] == BlocksStored(INSTANCE, tuple(chain_hashes(tokens, BLOCK)), 3.0)
        assert INSTANCE in sub.last_event_s
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close(linger=0)
