"""router.replay: the trainer-like HTTP client of the real-engine benchmark, against a fake engine."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from router.replay import (ReplayError, RequestRecord, WordText, replay, request_times, router_hold_seconds, step_wait_s,
                           window_summary)
from router.sim.trace import TraceRecord, TraceSession
from router.sim.trainer import Trainer
from tests.http_app import serving
from tests.router.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def word_text(model_path) -> WordText:
    from transformers import AutoTokenizer

    return WordText(AutoTokenizer.from_pretrained(model_path))


def test_word_text_has_exact_token_counts_and_is_deterministic(word_text, model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    for n in (1, 17, 300):
        text = word_text.text("class:agent", n)
        assert len(tok.encode(text, add_special_tokens=False)) == n
        assert word_text.text("class:agent", n) == text
    assert word_text.text("class:agent", 50) != word_text.text("class:rlvr", 50)
    assert word_text.text("k", 0) == ""


def test_word_text_refuses_a_tokenizer_without_words():
    class Tiny:
        def get_vocab(self):
            return {"a": 0, "b": 1}

        def convert_tokens_to_string(self, tokens):
            return "".join(tokens)

        def encode(self, text, add_special_tokens=False):
            return [0] * len(text)

    with pytest.raises(ReplayError, match="one-token words"):
        WordText(Tiny())


@pytest.fixture
def fake_engine():
    """A fake vLLM server on its own event loop in a thread (replay() runs its own loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = FakeEngine(delay_s=0.02, completion_tokens=3)
    url = asyncio.run_coroutine_threadsafe(engine.start(), loop).result(10)
    yield engine, url
    asyncio.run_coroutine_threadsafe(engine.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _agent(sid: str, gid: str) -> TraceSession:
    recs = [TraceRecord(sid, "agent", k, 20 + 10 * k, 3, unit_id=sid, group_id=gid, tool_gap_s=0.05,
                        session_end=k == 2, group_prefix_tokens=20, class_prefix_tokens=8) for k in range(3)]
    return TraceSession(sid, "agent", sid, gid, recs)


def _rlvr(sid: str, gid: str) -> TraceSession:
    rec = TraceRecord(sid, "rlvr", 0, 12, 3, unit_id=sid, group_id=gid, session_end=True, group_prefix_tokens=12)
    return TraceSession(sid, "rlvr", sid, gid, [rec])


def test_replay_drives_sessions_like_a_trainer(fake_engine, word_text):
    engine, url = fake_engine
    sessions = [_agent("a0", "ga"), _agent("a1", "ga"), _agent("b0", "gb"), _agent("b1", "gb"),
                _rlvr("r0", "gr"), _rlvr("r1", "gr"), _rlvr("s0", "gs"), _rlvr("s1", "gs")]
    res = replay(url, "fake-model", sessions, {"agent": 1, "rlvr": 1}, ceiling=2, duration_s=60,
                 text=word_text, engine_urls=[url])
    assert res.errors == []
    # Groups alternate by deficit (ga, gr, gb); releasing stops when the agent pool is empty,
    # so the consumed stream never departs from rho by more than a group.
    assert res.summary["units_released"] == res.summary["units_completed"] == 6
    assert len(res.requests) == 4 * 3 + 2
    assert res.summary["consumed_mixture"]["agent"] == pytest.approx(4 / 6)

    bodies = [(json.loads(r.body), r.headers) for r in engine.received]
    by_session: dict[str, list] = {}
    for body, headers in bodies:
        by_session.setdefault(headers["X-Session-Id"], []).append((body, headers))
    a0 = by_session["a0"]
    assert [h.get("X-Session-End") for _, h in a0] == [None, None, "1"]
    assert all(h["X-Workload-Class"] == "agent" and h["X-Group-Id"] == "ga" for _, h in a0)
    # Append-only context: each turn's prompt = the previous prompt + the answer + an observation.
    for (prev, _), (cur, _) in zip(a0, a0[1:]):
        assert cur["prompt"].startswith(prev["prompt"] + "tok" * 3)
        assert len(cur["prompt"]) > len(prev["prompt"]) + 9
    # GRPO siblings share the group's prompt; outputs are forced to the trace's length.
    assert a0[0][0]["prompt"] == by_session["a1"][0][0]["prompt"]
    assert all(b["max_tokens"] == b["min_tokens"] == 3 and b["ignore_eos"] for b, _ in bodies)
    # Ceiling 2 with groups of 2: the second group is released only after the first completed.
    ends = {g: max(r.finish_s for r in res.requests if r.group_id == g) for g in ("ga", "gr")}
    starts = {g: min(r.arrival_s for r in res.requests if r.group_id == g) for g in ("gr", "gb")}
    assert starts["gr"] >= ends["ga"] and starts["gb"] >= ends["gr"]
    # The recorded trace is the trace format again, with the engine's token counts.
    recorded = {s.session_id: s for s in res.recorded_trace()}
    assert [r.turn for r in recorded["a0"].requests] == [0, 1, 2]
    assert recorded["a0"].requests[-1].session_end is True


def test_replay_counts_a_failing_unit_as_failed_not_complete(fake_engine, word_text):
    engine, url = fake_engine
    engine.fail_status = 503
    res = replay(url, "fake-model", [_rlvr("r0", "gr")], {"rlvr": 1}, ceiling=1, duration_s=30,
                 text=word_text, engine_urls=[url])
    assert res.summary["units_completed"] == 0
    assert res.summary["units_failed"] == 1
    assert len(res.errors) == 1 and "HTTP 503" in res.errors[0]


def test_replay_refuses_a_non_positive_duration(word_text):
    with pytest.raises(ReplayError, match="duration_s"):
        replay("http://127.0.0.1:1", "m", [_rlvr("r0", "g")], {"rlvr": 1}, 1, 0, word_text, [])
    with pytest.raises(ReplayError, match="warmup_s must be in"):
        replay("http://127.0.0.1:1", "m", [_rlvr("r0", "g")], {"rlvr": 1}, 1, 10, word_text, [], warmup_s=10)


def test_replay_measures_the_window_after_its_warm_up(fake_engine, word_text):
    """With ``warmup_s`` a second window starts at the first engine sample after it: 100
    groups one after another (ceiling 2, groups of 2) take at least 100 x 20 ms, past it."""
    engine, url = fake_engine
    sessions = [_rlvr(f"r{g}-{k}", f"g{g}") for g in range(100) for k in range(2)]
    res = replay(url, "fake-model", sessions, {"rlvr": 1}, ceiling=2, duration_s=60, text=word_text,
                 engine_urls=[url], warmup_s=0.5)
    whole, warm = res.summary, res.after_warmup
    assert warm is not None and whole["units_completed"] == 200
    assert whole["window_s"][0] <= warm["window_s"][0] and 0.5 <= warm["window_s"][0] < warm["window_s"][1]
    assert warm["window_s"][1] == whole["window_s"][1]
    assert 0 < warm["samples_per_min"]
    # Without a warm-up there is no second window.
    assert replay(url, "fake-model", sessions[:4], {"rlvr": 1}, ceiling=2, duration_s=60, text=word_text,
                  engine_urls=[url]).after_warmup is None


def test_window_summary_counts_only_units_completed_in_the_window():
    from router.policies.base import InstanceMetrics

    trainer = Trainer([_rlvr("r0", "g0"), _rlvr("r1", "g1")], {"rlvr": 1}, ceiling=2)
    trainer.release(0.0)
    trainer.complete("r0", 5.0)
    trainer.complete("r1", 50.0)
    c0 = [InstanceMetrics(prefix_cache_queries_total=100, prefix_cache_hits_total=10, generation_tokens_total=0)]
    c1 = [InstanceMetrics(prefix_cache_queries_total=300, prefix_cache_hits_total=110, generation_tokens_total=600)]
    s = window_summary(trainer, [], (0.0, 30.0), (c0, c1))
    assert s["samples_per_min"] == pytest.approx(2.0)  # one unit in 30 s
    assert s["prefix_hit_rate"] == pytest.approx(0.5)
    assert s["decode_tok_s"] == pytest.approx(20.0)
    assert s["completion_s"]["rlvr"]["p50"] == pytest.approx(5.0)


def test_window_summary_reports_the_composition_of_completed_against_released_units():
    """Hand-computed: units of 7 and 300 output tokens released, only the short one completes
    in a 60 s window: 7 tokens per completed sample against a released mean of 153.5, 7
    output tokens/min, 7 / 153.5 length-adjusted samples/min."""
    from router.policies.base import InstanceMetrics

    short, long_ = _rlvr("r0", "g0"), _rlvr("r1", "g1")
    long_.requests[0].output_tokens = 300
    short.requests[0].output_tokens = 7
    trainer = Trainer([short, long_], {"rlvr": 1}, ceiling=2)
    trainer.release(0.0)
    trainer.complete("r0", 10.0)
    c = [InstanceMetrics()]
    s = window_summary(trainer, [], (0.0, 60.0), (c, c))
    total = s["composition"]["total"]
    assert total["decode_tokens_per_sample"] == s["decode_tokens_per_sample"] == 7
    assert total["released_decode_tokens_per_sample"] == pytest.approx(153.5)
    assert s["output_tokens_per_min"] == pytest.approx(7.0)
    assert s["length_adjusted_samples_per_min"] == pytest.approx(7 / 153.5)
    assert s["samples_per_min"] == pytest.approx(1.0)


def test_replay_samples_the_vllm_routers_missing_tokens_times(fake_engine, word_text):
    """With the vLLM Router's metrics address, the replay records its placements by branch and
    a time per missing_tokens placement (here: none at the first sample, 2 by the last)."""
    from aiohttp import web

    engine, url = fake_engine
    counts = iter([0, 2])
    calls = []

    async def metrics(_request):
        calls.append(1)
        n = next(counts, 2)
        return web.Response(text=(
            "# TYPE vllm_router_prefix_routing_decisions_total counter\n"
            f'vllm_router_prefix_routing_decisions_total{{outcome="prefix_hit"}} {len(calls)}\n'
            f'vllm_router_prefix_routing_decisions_total{{outcome="missing_tokens"}} {n}\n'))

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    asyncio.run_coroutine_threadsafe(runner.setup(), loop).result(10)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    asyncio.run_coroutine_threadsafe(site.start(), loop).result(10)
    port = site._server.sockets[0].getsockname()[1]
    try:
        res = replay(url, "fake-model", [_rlvr("r0", "gr"), _rlvr("r1", "gr")], {"rlvr": 1}, ceiling=2,
                     duration_s=30, text=word_text, engine_urls=[url],
                     router_metrics_url=f"http://127.0.0.1:{port}/")
        plain = replay(url, "fake-model", [_rlvr("r0", "gr")], {"rlvr": 1}, ceiling=1, duration_s=30,
                       text=word_text, engine_urls=[url])
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert res.router_decisions == {"prefix_hit": len(calls), "missing_tokens": 2}
    assert len(res.missing_tokens_s) == 2 and all(0 <= t <= 30 for t in res.missing_tokens_s)
    assert plain.router_decisions is None and plain.missing_tokens_s is None


async def test_router_sample_keeps_caps_signals_and_the_policys_per_engine_state(word_text):
    """What the replay samples from our router's /state into its timeline."""
    from aiohttp import ClientSession, web

    from router.replay import _Replay

    state = {
        "policy": {"caps": {"http://e0": {"all": 3, "budget_fill": 0.5}},
                   "instances": {"http://e0": {"reserved_blocks": 30.0, "budget_blocks": 59.0,
                                               "sessions": {"agent": 2, "rlvr": 1}}}},
        "held_requests": 4,
        "instances": [{"instance": "http://e0", "healthy": True, "metrics_age_s": 0.2, "scrapes_failed": 1,
                       "kv_event_gaps": 0, "kv_mapped_blocks": 12, "metrics": {"x": 1}}],
    }

    async def handler(_request):
        return web.json_response(state)

    app = web.Application()
    app.router.add_get("/state", handler)
    async with serving(app) as url:
        rp = _Replay(url, "m", [_rlvr("r0", "gr")], {"rlvr": 1}, 1, word_text, [], router_state=True)
        async with ClientSession() as http:
            rp.http = http
            sample = await rp._router_sample()
    assert sample["held"] == 4 and sample["caps"]
    assert sample["router_signals"] == [{"instance": "http://e0", "metrics_age_s": 0.2, "scrapes_failed": 1,
                                         "kv_event_gaps": 0, "kv_mapped_blocks": 12}]
    assert sample["policy_instances"]["http://e0"]["sessions"] == {"agent": 2, "rlvr": 1}


def _request(arrival: float, finish: float) -> RequestRecord:
    return RequestRecord("s", "agent", "u", None, 0, arrival, finish, 100, 10, 0.0, True, 0, 0)


def test_request_times_split_client_time_into_outside_api_server_and_engine_core():
    """Two engines, 4 requests between the samples: client 1.0 s each on average, the engines
    0.6 s: 0.4 s outside the engines. A request finished before the first sample is not
    counted. Behind our router, whose hold counter counts other requests than those that
    finished, the held time is reported and the overhead is not separated."""
    timeline = [{"t_s": 10.0, "e2e_s": [5.0, 1.0], "e2e_n": [4, 2], "hold_s": 2.0,
                 "queue_s": [0.0, 0.0], "prefill_s": [1.0, 1.0], "decode_s": [2.0, 0.0]},
                {"t_s": 15.0, "e2e_s": [6.0, 2.0]},  # no counts: not used
                {"t_s": 20.0, "e2e_s": [6.2, 2.2], "e2e_n": [6, 4], "hold_s": 2.4,
                 "queue_s": [0.2, 0.0], "prefill_s": [1.2, 1.2], "decode_s": [3.0, 0.6]}]
    requests = [_request(0.0, 9.0), _request(10.0, 10.8), _request(11.0, 12.2), _request(12.0, 13.0),
                _request(18.0, 19.0)]
    got = request_times(requests, timeline)
    assert got["engine_s"] == pytest.approx(0.6) and got["hold_s"] == pytest.approx(0.1)
    assert got["client_s"] == pytest.approx(1.0) and got["overhead_s"] is None
    assert got["requests"] == 4
    # the engine core's split: queue 0.05, prefill 0.1, decode 0.4, the API server the rest
    assert (got["queue_s"], got["prefill_s"], got["decode_s"]) == pytest.approx((0.05, 0.1, 0.4))
    assert got["api_s"] == pytest.approx(0.05)
    assert "between_s" not in got  # no request followed one of its session
    turns = [RequestRecord("t", "agent", "t", None, 0, 11.0, 12.0, 100, 10, 0.5, False, 0, 0),
             RequestRecord("t", "agent", "t", None, 1, 12.75, 13.0, 120, 10, 0.0, True, 0, 0)]
    assert request_times(requests + turns, timeline)["between_s"] == pytest.approx(0.25)
    # the vLLM Router has no hold counter
    for t in timeline:
        t.pop("hold_s", None)
    assert request_times(requests, timeline)["overhead_s"] == pytest.approx(0.4)
    # too few samples, or none finished between them: no figure
    assert request_times(requests, timeline[:1]) is None
    assert request_times([_request(0.0, 9.0)], timeline) is None


def test_step_wait_is_half_the_busy_engines_step_weighted_by_finished_requests():
    """Engine 0 runs at both ends of the first interval, 10 steps in 5 s: its 4 requests wait
    half a 0.5-s step each; engine 1 idled (nothing running at the first sample): its 2 wait 0.
    In the second interval engine 0 finished nothing and engine 1 ran 2 steps in 5 s: 2 more
    requests wait 1.25 s. A sample without the counters is skipped."""
    timeline = [{"t_s": 0.0, "steps": [0, 0], "running": [3, 0], "e2e_n": [0, 0]},
                {"t_s": 2.0, "running": [3, 1]},  # no step counters: not used
                {"t_s": 5.0, "steps": [10, 4], "running": [2, 1], "e2e_n": [4, 2]},
                {"t_s": 10.0, "steps": [10, 6], "running": [0, 1], "e2e_n": [4, 4]}]
    assert step_wait_s(timeline) == pytest.approx((4 * 0.25 + 2 * 0 + 2 * 1.25) / 8)
    assert step_wait_s(timeline[:2]) is None  # one usable sample: no interval
    assert step_wait_s([dict(t, e2e_n=[0, 0]) for t in timeline if "steps" in t]) is None  # nothing finished


def test_router_hold_seconds_sums_the_classes():
    text = ("# TYPE router_hold_seconds histogram\n"
            'router_hold_seconds_bucket{workload_class="agent",le="+Inf"} 3.0\n'
            'router_hold_seconds_count{workload_class="agent"} 3.0\n'
            'router_hold_seconds_sum{workload_class="agent"} 1.5\n'
            'router_hold_seconds_bucket{workload_class="rlvr",le="+Inf"} 1.0\n'
            'router_hold_seconds_count{workload_class="rlvr"} 1.0\n'
            'router_hold_seconds_sum{workload_class="rlvr"} 0.25\n')
    assert router_hold_seconds(text) == pytest.approx(1.75)
    assert router_hold_seconds("other_metric 1.0\n") == 0.0
