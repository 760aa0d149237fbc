"""The live router over real HTTP, in front of in-process fake engines (no vLLM)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from hydra import compose, initialize_config_dir

from common.config import RECIPES_DIR
from router.__main__ import CONFIG_NAME
from router.policies import RoundRobinPolicy
from router.policies.base import AllBlocksCleared, Hold, RequestFinished, RequestStarted, SessionEnded
from router.server import RouterService, build_service
from router.service_config import ServiceConfig
from tests.router.fake_engine import running_engines


class RecordingPolicy(RoundRobinPolicy):
    """round_robin that records every event and can hold the first ``hold_first`` decisions."""

    name = "recording"

    def __init__(self, hold_first: int = 0) -> None:
        super().__init__()
        self.events: list = []
        self.hold_first = hold_first
        self.decisions = 0

    def decide(self, request, view, now):
        self.decisions += 1
        if self.decisions <= self.hold_first:
            return Hold(0.05, reason="test hold")
        return super().decide(request, view, now)

    def observe(self, event) -> None:
        self.events.append(event)

    def of_type(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def state(self) -> dict:
        started = self.of_type(RequestStarted)
        return {
            **super().state(),
            "requests": [
                {"session_id": e.request.session_id, "workload_class": e.request.workload_class,
                 "group_id": e.request.group_id, "unit_id": e.request.unit_id,
                 "session_end": e.request.session_end, "instance": e.instance}
                for e in started
            ],
        }


@pytest.fixture
async def engines():
    async with running_engines() as pair:
        yield pair


async def start_router(engines, policy=None, **config) -> RouterService:
    service = RouterService(
        policy or RecordingPolicy(), [e.url for e in engines],
        config=ServiceConfig(**{"probe_interval_s": 0.05, "scrape_interval_s": 0.05, **config}),
    )
    await service.start()
    return service


@pytest.fixture
async def router(engines):
    service = await start_router(engines)
    yield service
    await service.stop()


async def test_body_forwarded_unchanged_and_headers_reach_engine(router, engines):
    raw = b'{"model": "fake-model",   "prompt": "Hello there", "max_tokens": 7, "extra": [1, 2.50]}'
    async with httpx.AsyncClient(base_url=router.url) as client:
        r = await client.post("/v1/completions", content=raw,
                              headers={"Content-Type": "application/json", "X-Session-Id": "s-1", "X-Custom": "kept"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    got = [x for e in engines for x in e.received]
    assert len(got) == 1
    assert got[0].body == raw
    assert got[0].headers["X-Session-Id"] == "s-1" and got[0].headers["X-Custom"] == "kept"


async def test_idle_engines_are_scraped_slowly_until_a_request_goes_out(engines):
    # nothing in flight or held and every engine's last sample idle: the scraper waits its
    # idle interval (an hour here); a request going out scrapes at once
    service = await start_router(engines, idle_scrape_interval_s=3600.0)
    try:
        assert service.scraper.idle()
        for _ in range(30):  # a round under way may still end; at 0.05 s none is ever quiet for 0.3 s
            seen = {u: s.metrics_at_s for u, s in service.instances.items()}
            await asyncio.sleep(0.3)
            if {u: s.metrics_at_s for u, s in service.instances.items()} == seen:
                break
        assert {u: s.metrics_at_s for u, s in service.instances.items()} == seen
        engines[0].running = 2  # someone else's requests: not idle once a sample shows them
        service.instances[engines[0].url].in_flight += 1
        assert not service.scraper.idle()
        service.instances[engines[0].url].in_flight -= 1
        async with httpx.AsyncClient(base_url=service.url) as client:
            r = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
        for _ in range(1000):  # up to 10 s under load
            if all(s.metrics_at_s != seen[u] for u, s in service.instances.items()):
                break
            await asyncio.sleep(0.01)
        assert all(s.metrics_at_s != seen[u] for u, s in service.instances.items())
        assert not service.scraper.idle()  # engine 0's sample shows 2 running
    finally:
        await service.stop()


async def test_stream_passes_through_chunk_by_chunk(engines):
    for e in engines:
        e.chunk_delay_s, e.completion_tokens = 0.1, 5
    service = await start_router(engines)
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                chunks = r.aiter_raw()
                first = await chunks.__anext__()
                # The engine is still generating when the first event reaches the client.
                assert sum(e.running for e in engines) == 1
                rest = b"".join([c async for c in chunks])
        assert first.startswith(b"data: ")
        assert (first + rest).count(b'"content": "tok"') == 5 and rest.endswith(b"data: [DONE]\n\n")
        finished = service.policy.of_type(RequestFinished)
        assert finished[0].ok and finished[0].completion_tokens == 5
    finally:
        await service.stop()


async def test_stream_usage_chunk_reported_to_policy(router):
    body = {"model": "m", "prompt": "x" * 40, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=router.url) as client:
        r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200 and b'"usage"' in r.content
    finished = router.policy.of_type(RequestFinished)
    assert (finished[0].prompt_tokens, finished[0].completion_tokens) == (len(json.dumps("x" * 40)) // 4, 4)


async def test_session_headers_reach_policy(router):
    headers = {"X-Session-Id": "traj-7", "X-Workload-Class": "agent", "X-Group-Id": "g-3", "X-Rollout-Unit": "u-9"}
    async with httpx.AsyncClient(base_url=router.url) as client:
        await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers=headers)
        state = (await client.get("/state")).json()
    (req,) = state["policy"]["requests"]
    assert req == {"session_id": "traj-7", "workload_class": "agent", "group_id": "g-3", "unit_id": "u-9",
                   "session_end": False, "instance": req["instance"]}
    assert {i["instance"] for i in state["instances"]} == set(router.instances)
    assert all(i["healthy"] and i["metrics_age_s"] is not None for i in state["instances"])
    assert all(i["scrapes_failed"] == 0 and i["kv_event_gaps"] == 0 for i in state["instances"])


async def test_unknown_class_becomes_default_and_is_counted(router):
    async with httpx.AsyncClient(base_url=router.url) as client:
        await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={"X-Workload-Class": "weird"})
        metrics = (await client.get("/metrics")).text
    assert router.policy.of_type(RequestStarted)[0].request.workload_class == "default"
    assert "router_unknown_workload_class_total 1.0" in metrics


async def test_session_end_emitted_after_last_request_of_session(engines):
    engines[0].delay_s = 0.3  # round_robin: the first request goes to engines[0], the second to engines[1]
    service = await start_router(engines)
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            slow = asyncio.create_task(client.post("/v1/completions", json={"model": "m", "prompt": "a"},
                                                   headers={"X-Session-Id": "s"}))
            while not service.policy.of_type(RequestStarted):
                await asyncio.sleep(0.01)
            await client.post("/v1/completions", json={"model": "m", "prompt": "b"},
                              headers={"X-Session-Id": "s", "X-Session-End": "1"})
            # The session-end request finished, but its sibling is still in flight.
            assert not service.policy.of_type(SessionEnded)
            await slow
        kinds = [type(e).__name__ for e in service.policy.events if not type(e).__name__ == "MetricsSampled"]
        assert kinds[-1] == "SessionEnded" and service.policy.of_type(SessionEnded)[0].session_id == "s"
    finally:
        await service.stop()


async def test_request_without_session_id_is_its_own_one_turn_session(router):
    async with httpx.AsyncClient(base_url=router.url) as client:
        await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
    (started,) = router.policy.of_type(RequestStarted)
    assert started.request.session_end
    assert [e.session_id for e in router.policy.of_type(SessionEnded)] == [started.request.session_id]


async def test_requests_without_session_id_are_counted_per_route(router):
    async with httpx.AsyncClient(base_url=router.url) as client:
        for _ in range(2):
            await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
        await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={"X-Session-Id": ""})
        await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={"X-Session-Id": "s"})
        await client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        text = (await client.get("/metrics")).text
    assert 'router_requests_without_session_id_total{route="/v1/completions"} 3.0' in text
    assert 'router_requests_without_session_id_total{route="/v1/chat/completions"} 1.0' in text


async def test_held_request_is_rechecked_then_admitted(engines):
    service = await start_router(engines, policy=RecordingPolicy(hold_first=3))
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={"X-Workload-Class": "rlvr"})
            metrics = (await client.get("/metrics")).text
        assert r.status_code == 200 and service.policy.decisions == 4
        assert 'router_decisions_total{outcome="hold"} 3.0' in metrics
        assert 'router_held_requests_total{workload_class="rlvr"} 1.0' in metrics
        assert 'router_hold_seconds_count{workload_class="rlvr"} 1.0' in metrics
    finally:
        await service.stop()


async def test_client_gone_while_held_is_reported_as_failed(engines):
    service = await start_router(engines, policy=RecordingPolicy(hold_first=10**6))
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            task = asyncio.create_task(client.post("/v1/completions", json={"model": "m", "prompt": "p"}))
            while service.state()["held_requests"] == 0:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        for _ in range(200):
            if service.policy.of_type(RequestFinished):
                break
            await asyncio.sleep(0.01)
        (finished,) = service.policy.of_type(RequestFinished)
        assert not finished.ok and finished.instance == ""
        assert service.state()["held_requests"] == 0
        assert not any(e.received for e in engines)
    finally:
        await service.stop()


async def test_engine_killed_requests_retried_elsewhere_and_instance_recovers(engines):
    # Scrapes far apart, so the failed request (not a scrape, which since a scrape that
    # cannot connect also marks an engine unhealthy would often win the race: the fake
    # engine's shutdown takes longer than a 50 ms scrape period) finds the dead engine.
    router = await start_router(engines, scrape_interval_s=3600.0)
    try:
        await _killed_engine_is_retried_elsewhere_and_recovers(router, engines)
    finally:
        await router.stop()


async def _killed_engine_is_retried_elsewhere_and_recovers(router, engines):
    dead = engines[0]
    port = dead.port
    await dead.stop()
    async with httpx.AsyncClient(base_url=router.url) as client:
        answers = [await client.post("/v1/completions", json={"model": "m", "prompt": str(i)}) for i in range(4)]
        assert [a.status_code for a in answers] == [200] * 4
        assert len(engines[1].received) == 4
        assert not router.instances[dead.url].healthy
        metrics = (await client.get("/metrics")).text
        assert f'router_engine_failures_total{{instance="{dead.url}"}} 1.0' in metrics
        failed = [e for e in router.policy.of_type(RequestFinished) if not e.ok]
        assert [e.instance for e in failed] == [dead.url]
        await dead.start(port)
        for _ in range(200):
            if router.instances[dead.url].healthy:
                break
            await asyncio.sleep(0.02)
        assert router.instances[dead.url].healthy
        await client.post("/v1/completions", json={"model": "m", "prompt": "again"})
        await client.post("/v1/completions", json={"model": "m", "prompt": "again"})
    assert len(dead.received) == 1
    health = [(e.instance, e.healthy) for e in router.policy.events if type(e).__name__ == "InstanceHealthChanged"]
    assert health == [(dead.url, False), (dead.url, True)]


async def test_engine_503_is_retried_on_another_instance(router, engines):
    engines[0].fail_status = 503
    async with httpx.AsyncClient(base_url=router.url) as client:
        r = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
    assert r.status_code == 200
    assert len(engines[0].received) == 1 and len(engines[1].received) == 1


async def test_all_engines_failing_gives_502_after_max_retries(engines):
    for e in engines:
        e.fail_status = 503
    service = await start_router(engines, max_retries=1, probe_interval_s=10.0)
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "engine_failed"
    finally:
        await service.stop()


async def test_no_healthy_engine_gives_503_after_the_bound_and_health_says_so(engines):
    for e in engines:
        e.fail_status = 503
    service = await start_router(engines, max_retries=10, probe_interval_s=10.0, no_engine_timeout_s=0.5)
    try:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            health = await client.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_engine"
        assert health.status_code == 503 and health.json()["healthy_instances"] == 0
    finally:
        await service.stop()


@pytest.mark.parametrize(
    ("method", "path", "content", "status", "code"),
    [
        ("POST", "/v1/completions", b'{"model": "m", "prompt": ', 400, "invalid_json"),
        ("POST", "/v1/completions", b'["not", "an", "object"]', 400, "invalid_json"),
        ("POST", "/v1/completions", b'{"prompt": "p"}', 400, "missing_field"),
        ("POST", "/v1/completions", b'{"model": "m"}', 400, "missing_field"),
        ("POST", "/v1/chat/completions", b'{"model": "m", "prompt": "p"}', 400, "missing_field"),
        ("POST", "/v1/chat/completions", b'{"model": "m", "messages": "hi"}', 400, "invalid_prompt"),
        ("POST", "/v1/completions", b'{"model": "m", "prompt": {"a": 1}}', 400, "invalid_prompt"),
        ("GET", "/v1/chat/completions", b"", 405, "405"),
        ("PUT", "/v1/completions", b"{}", 405, "405"),
        ("POST", "/v1/nope", b"{}", 404, "404"),
        ("POST", "/v1/completions", b'{"model": "m", "prompt": "' + b"x" * 5000 + b'"}', 413, "413"),
    ],
)
async def test_bad_input_gets_openai_json_error(engines, method, path, content, status, code):
    service = await start_router(engines, max_body_bytes=4096)
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            r = await client.request(method, path, content=content)
        assert r.status_code == status
        err = r.json()["error"]
        assert err["code"] == code and err["type"] == "invalid_request_error" and err["message"]
        assert not any(e.received for e in engines)
    finally:
        await service.stop()


async def test_metrics_exposes_named_series(router):
    async with httpx.AsyncClient(base_url=router.url) as client:
        await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
        text = (await client.get("/metrics")).text
    families = {line.split()[2].removesuffix("_total") for line in text.splitlines() if line.startswith("# TYPE")}
    assert {
        "router_decisions", "router_held_requests", "router_held_requests_now", "router_hold_seconds",
        "router_long_holds", "router_decision_latency_seconds", "router_unknown_workload_class",
        "router_engine_failures", "router_retries", "router_requests", "router_in_flight_requests",
        "router_instance_healthy", "router_metrics_age_seconds", "router_admission_cap", "router_ledger_size",
        "router_kv_events", "router_kv_event_gaps", "router_metric_scrape_failures",
    } <= families
    assert 'router_decisions_total{outcome="admit"} 1.0' in text


async def test_reset_prefix_index_tells_policy_per_instance_or_all(router, engines):
    async with httpx.AsyncClient(base_url=router.url) as client:
        one = await client.post("/admin/reset_prefix_index", json={"instance": engines[1].url})
        every = await client.post("/admin/reset_prefix_index")
        unknown = await client.post("/admin/reset_prefix_index", json={"instance": "http://nowhere:1"})
    assert one.json() == {"cleared": [engines[1].url]}
    assert every.json() == {"cleared": [e.url for e in engines]}
    assert unknown.status_code == 404 and "known" in unknown.json()["error"]["message"]
    assert [e.instance for e in router.policy.of_type(AllBlocksCleared)] == [engines[1].url, engines[0].url, engines[1].url]


async def test_models_forwarded_and_health_answers(router):
    async with httpx.AsyncClient(base_url=router.url) as client:
        models = (await client.get("/v1/models")).json()
        health = (await client.get("/health")).json()
    assert models["data"][0]["id"] == "fake-model"
    assert health == {"status": "ok", "healthy_instances": 2, "instances": 2}


async def test_block_size_read_from_engine_metrics(router, engines):
    assert router.block_size == engines[0].block_size == router.tokenizer.block_size


async def test_hydra_config_builds_service_with_chosen_policy(engines):
    overrides = ["router=round-robin", f"engines.urls=[{engines[0].url},{engines[1].url}]",
                 "+router.params.no_healthy_recheck_s=0.25", "engines.block_size=32"]
    with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=None):
        cfg = compose(CONFIG_NAME, overrides=overrides)
    service = build_service(cfg)
    assert service.policy.name == "round_robin" and service.policy.config.no_healthy_recheck_s == 0.25
    assert list(service.instances) == [engines[0].url, engines[1].url] and service.block_size == 32


async def test_server_long_hold_s_reaches_the_policy_and_the_metrics(engines):
    overrides = ["router=misa-t", f"engines.urls=[{engines[0].url}]", "server.long_hold_s=12.5"]
    with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=None):
        cfg = compose(CONFIG_NAME, overrides=overrides)
    service = build_service(cfg)
    assert service.policy.config.long_hold_s == service.metrics.long_hold_s == 12.5


def test_every_router_recipe_names_a_policy_and_impl():
    from omegaconf import OmegaConf

    recipes = {p.stem: OmegaConf.load(p) for p in (RECIPES_DIR / "router").glob("*.yaml")}
    assert set(recipes) == {"misa-t", "misa", "session-admission", "cache-aware", "round-robin", "vllm",
                            "kv-horizon"}
    assert all(r.impl == ("vllm" if name == "vllm" else "ours") for name, r in recipes.items())
    # The real vLLM Router is launched as a user launches it without flags: the thresholds the
    # simulator's mimic takes as defaults (vllm-router 0.1.17's --help defaults).
    from router.policies.vllm_router import VllmRouterConfig

    mimic = VllmRouterConfig()
    assert (recipes["vllm"].cache_threshold, recipes["vllm"].balance_abs_threshold,
            recipes["vllm"].balance_rel_threshold) == (mimic.cache_threshold, mimic.balance_abs_threshold,
                                                       mimic.balance_rel_threshold) == (0.3, 64, 1.5)


async def test_kv_events_reach_policy_and_state_through_the_service(engines):
    import msgspec
    import zmq
    import zmq.asyncio

    from router.policies.base import BlocksStored
    from router.prefix_index import chain_hashes

    pub = zmq.asyncio.Context.instance().socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    service = RouterService(RecordingPolicy(), [e.url for e in engines],
                            kv_event_endpoints=[f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:1"],
                            config=ServiceConfig(scrape_interval_s=0.05))
    await service.start()
    try:
        tokens = list(range(2 * engines[0].block_size))
        event = {"type": "BlockStored", "block_hashes": [b"h1", b"h2"], "parent_block_hash": None,
                 "token_ids": tokens, "block_size": engines[0].block_size, "lora_id": None, "medium": "GPU"}
        for seq in range(200):  # until the subscription has propagated
            await pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), msgspec.msgpack.encode([0.0, [event], None])])
            await asyncio.sleep(0.01)
            if service.policy.of_type(BlocksStored):
                break
        stored = service.policy.of_type(BlocksStored)[0]
        assert stored.instance == engines[0].url
        assert stored.block_hashes == tuple(chain_hashes(tokens, engines[0].block_size))
        async with httpx.AsyncClient(base_url=service.url) as client:
            state = (await client.get("/state")).json()
        first = state["instances"][0]
        assert first["kv_mapped_blocks"] == 2 and first["kv_event_age_s"] is not None
    finally:
        await service.stop()
        pub.close(linger=0)


class OneAtATimePolicy(RecordingPolicy):
    """Admit one request at a time; hold the rest with a recheck delay far beyond the test."""

    def decide(self, request, view, now):
        self.decisions += 1
        busy = len(self.of_type(RequestStarted)) > len(self.of_type(RequestFinished))
        return Hold(600.0, reason="one at a time") if busy else RoundRobinPolicy.decide(self, request, view, now)


async def test_held_request_rechecked_as_soon_as_a_request_finishes(engines):
    engines[0].delay_s = 0.2
    service = await start_router(engines, policy=OneAtATimePolicy())
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            first = asyncio.create_task(client.post("/v1/completions", json={"model": "m", "prompt": "a"}))
            while not service.policy.of_type(RequestStarted):
                await asyncio.sleep(0.01)
            second = asyncio.create_task(client.post("/v1/completions", json={"model": "m", "prompt": "b"}))
            # Not after the 600 s recheck delay: the first request's finish wakes the held one.
            answers = await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
        assert [a.status_code for a in answers] == [200, 200]
        assert service.policy.decisions == 3 and service.state()["held_requests"] == 0
    finally:
        await service.stop()


async def test_engine_dying_mid_stream_ends_stream_with_error_event(router, engines):
    for e in engines:
        e.break_after_chunks = 2
    async with httpx.AsyncClient(base_url=router.url) as client:
        r = await client.post("/v1/completions", json={"model": "m", "prompt": "p", "stream": True})
    events = [line for line in r.text.split("\n\n") if line]
    assert r.status_code == 200 and len(events) == 3
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "502"
    (finished,) = router.policy.of_type(RequestFinished)
    assert not finished.ok and not router.instances[finished.instance].healthy
    assert sum(len(e.received) for e in engines) == 1  # streaming had begun: no retry


async def test_expect_100_continue_gets_the_go_ahead_and_is_not_forwarded(router, engines):
    body = json.dumps({"model": "m", "prompt": "p"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", int(router.url.rsplit(":", 1)[1]))
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)  # before any body was sent
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        await writer.drain()
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert final.startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
    received = [r for e in engines for r in e.received]
    assert len(received) == 1 and "Expect" not in received[0].headers
    async with httpx.AsyncClient(base_url=router.url) as client:
        r = await client.post("/v1/completions", content=body, headers={"Expect": "gold"})
    assert r.status_code == 417 and "Expect" in r.json()["error"]["message"]


def test_a_cap_gone_from_the_policy_state_is_gone_from_metrics():
    from router.metrics import RouterMetrics

    metrics = RouterMetrics()
    metrics.refresh_from_policy_state({"caps": {"http://e1": {"agent": 3, "rlvr": 2}}, "ledger_sizes": {"open": 5}})
    metrics.refresh_from_policy_state({"caps": {"http://e1": {"rlvr": 4}}, "ledger_sizes": {"open": 1}})
    text = metrics.exposition().decode()
    assert 'router_admission_cap{instance="http://e1",workload_class="rlvr"} 4.0' in text
    assert 'workload_class="agent"' not in text and 'router_ledger_size{ledger="open"} 1.0' in text


async def test_empty_session_id_is_a_one_turn_session_not_one_left_open(router):
    async with httpx.AsyncClient(base_url=router.url) as client:
        for _ in range(3):
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={"X-Session-Id": ""})
            assert r.status_code == 200
    ended = router.policy.of_type(SessionEnded)
    assert len(ended) == 3 and all(e.session_id.startswith("req-") for e in ended)
    assert router.state()["open_sessions"] == 0


async def test_an_engine_nobody_listens_on_is_unhealthy_before_any_request(engines):
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    service = RouterService(RecordingPolicy(), [engines[0].url, dead],
                            config=ServiceConfig(probe_interval_s=0.05, scrape_interval_s=0.05))
    await service.start()
    try:
        state = {i["instance"]: i["healthy"] for i in service.state()["instances"]}
        assert state == {engines[0].url: True, dead: False}
        async with httpx.AsyncClient(base_url=service.url) as client:
            health = (await client.get("/health")).json()
            assert health["healthy_instances"] == 1
            for _ in range(4):
                assert (await client.post("/v1/completions", json={"model": "m", "prompt": "p"})).status_code == 200
        assert service.metrics.retries._value.get() == 0  # no request was sent to the dead engine first
    finally:
        await service.stop()


async def test_malformed_http_from_a_client_is_one_warning_line_not_a_traceback(router, caplog):
    reader, writer = await asyncio.open_connection("127.0.0.1", int(router.url.rsplit(":", 1)[1]))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
    await writer.drain()
    assert (await reader.read(100)).startswith(b"HTTP/1.0 400")
    writer.close()
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [r.levelname for r in records] == ["WARNING"]
    assert "malformed HTTP (answered 400)" in records[0].getMessage() and records[0].exc_info is None


class FailingPolicy(RecordingPolicy):
    """round_robin whose observe() raises on every RequestFinished, and whose decide()
    raises for the session ``boom``: a policy bug, as the live router sees it."""

    def decide(self, request, view, now):
        if request.session_id == "boom":
            raise ZeroDivisionError("policy bug")
        return super().decide(request, view, now)

    def observe(self, event) -> None:
        super().observe(event)
        if isinstance(event, RequestFinished):
            raise KeyError("policy bug")


async def test_policy_exceptions_are_counted_in_metrics(engines):
    service = await start_router(engines, FailingPolicy())
    try:
        async with httpx.AsyncClient(base_url=service.url) as client:
            ok = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            bad = await client.post("/v1/completions", json={"model": "m", "prompt": "p"},
                                    headers={"X-Session-Id": "boom"})
            for _ in range(200):  # RequestFinished is reported once the client has the answer
                metrics = (await client.get("/metrics")).text
                if 'router_policy_errors_total{call="observe"}' in metrics:
                    break
                await asyncio.sleep(0.02)
    finally:
        await service.stop()
    assert ok.status_code == 200  # an observe() bug is logged and counted; the request is served
    assert bad.status_code == 500 and "ZeroDivisionError" in bad.text
    assert 'router_policy_errors_total{call="decide"} 1.0' in metrics
    observe_errors = re.search(r'router_policy_errors_total\{call="observe"\} (\S+)', metrics)
    assert observe_errors and float(observe_errors.group(1)) >= 1.0
