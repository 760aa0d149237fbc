"""A real vLLM engine with the real model: completions, metrics, prefix cache, KV events."""

from __future__ import annotations

import time

import httpx
import msgspec
import pytest
import zmq

from tests.conftest import SERVED_NAME

pytestmark = pytest.mark.engine


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_engine_answers_a_real_chat_completion(real_engine_url):
    r = httpx.post(f"{real_engine_url}/v1/chat/completions", timeout=120, json={
        "model": SERVED_NAME, "messages": [{"role": "user", "content": "What is 2+3?"}],
        "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["prompt_tokens"] > 10
    assert 0 < body["usage"]["completion_tokens"] <= 16


def test_engine_metrics_report_kv_capacity_and_prefix_counters(real_engine_url):
    text = httpx.get(f"{real_engine_url}/metrics", timeout=30).text
    info = next(l for l in text.splitlines() if l.startswith("vllm:cache_config_info{"))
    assert 'enable_prefix_caching="True"' in info
    assert 'block_size="128"' in info
    blocks = int(info.split('num_gpu_blocks="')[1].split('"')[0])
    assert blocks > 0
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        _metric(text, name)


def test_repeated_long_prompt_hits_the_prefix_cache(real_engine_url):
    prompt = "Count the words. " + " ".join(f"w{i}" for i in range(400))
    before = httpx.get(f"{real_engine_url}/metrics", timeout=30).text
    for _ in range(2):
        r = httpx.post(f"{real_engine_url}/v1/completions", timeout=120, json={
            "model": SERVED_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
    after = httpx.get(f"{real_engine_url}/metrics", timeout=30).text
    hits = _metric(after, "vllm:prefix_cache_hits_total") - _metric(before, "vllm:prefix_cache_hits_total")
    # The second call reuses every full 128-token block of the first.
    assert hits >= 128 * 2


def test_kv_events_arrive_over_zmq_with_token_ids(real_engine):
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(real_engine.kv_events_endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    time.sleep(0.5)  # let the subscription reach the publisher
    try:
        prompt = "Unique event probe. " + " ".join(f"z{i}" for i in range(300))
        r = httpx.post(f"{real_engine.url}/v1/completions", timeout=120, json={
            "model": SERVED_NAME, "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200
        stored = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not stored:
            if sub.poll(500):
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv-events" and len(seq) == 8
                _ts, events, *_ = msgspec.msgpack.decode(payload)
                # The batch is array-like; each event is a map tagged by "type".
                stored += [ev for ev in events if ev.get("type") == "BlockStored"]
        assert stored, "no BlockStored event within 20 s"
        ev = stored[0]
        hashes, token_ids, block_size = ev["block_hashes"], ev["token_ids"], ev["block_size"]
        assert len(hashes) >= 1 and block_size == 128
        assert len(token_ids) == len(hashes) * block_size
    finally:
        sub.close(linger=0)
