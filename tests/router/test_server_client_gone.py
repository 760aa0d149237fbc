"""Clients that go away while their request is held: the request is dropped, never
forwarded, and its demand leaves the policy's ledger at once (live router, fake engines)."""

from __future__ import annotations

import asyncio
import json

import httpx

from router.policies import RoundRobinPolicy, make_policy
from router.policies.base import Hold, RequestFinished
from router.server import RouterService
from router.service_config import ServiceConfig
from tests.router.fake_engine import running_engines


class KAtATimePolicy(RoundRobinPolicy):
    """Admit while fewer than ``k`` requests run; hold the rest far beyond the test (only a
    finishing request wakes them)."""

    name = "k_at_a_time"

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.running = 0

    def decide(self, request, view, now):
        if self.running >= self.k:
            return Hold(600.0, reason="k at a time")
        self.running += 1
        return super().decide(request, view, now)

    def observe(self, event) -> None:
        if isinstance(event, RequestFinished) and event.instance:  # an admitted request finished
            self.running -= 1


async def _start(engines, policy) -> RouterService:
    service = RouterService(policy, [e.url for e in engines],
                            config=ServiceConfig(probe_interval_s=0.05, scrape_interval_s=0.05))
    await service.start()
    return service


async def _open_request(url: str, body: dict, headers: dict | None = None) -> asyncio.StreamWriter:
    """Send one POST /v1/completions on a raw connection and leave it open (the caller closes it)."""
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    raw = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n{head}"
                 f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    await writer.drain()
    return writer


async def _until(condition, timeout_s: float = 20.0) -> bool:
    """Poll ``condition`` every 10 ms for at most ``timeout_s``; returns whether it came true."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def test_held_requests_whose_clients_left_never_reach_an_engine():
    # 4 requests run (the engine takes 5 s), 20 are held; then all 24 clients leave at once.
    # The 4 that finish wake held ones in the same loop step as those are cancelled: on
    # Python 3.11 asyncio.wait_for returned the wake-up and swallowed the cancellation,
    # so the held requests were admitted and generated for nobody.
    async with running_engines(1, delay_s=5.0) as engines:
        service = await _start(engines, KAtATimePolicy(k=4))
        try:
            writers = [await _open_request(service.url, {"model": "m", "prompt": str(i)}) for i in range(24)]
            assert await _until(lambda: len(engines[0].received) == 4 and service.state()["held_requests"] == 20)
            for w in writers:
                w.close()
            done = await _until(lambda: service.state()["held_requests"] == 0
                                and service.instances[engines[0].url].in_flight == 0, timeout_s=10.0)
            assert done, f"still held {service.state()['held_requests']}, in flight " \
                         f"{service.instances[engines[0].url].in_flight}"
            assert len(engines[0].received) == 4
            assert service.policy.running == 0
        finally:
            await service.stop()


def _one_session_cap_policy():
    # C_w = 0.9 * 72 = 64.8 blocks, k_ref = 1024 tokens / 16 = 64 blocks: one session per engine.
    return make_policy("session_admission", {"k_prior_tokens": 1024.0})


async def test_an_abandoned_held_session_leaves_the_ledger_and_does_not_block_its_class():
    async with running_engines(1, num_blocks=72, block_size=16) as engines:
        service = await _start(engines, _one_session_cap_policy())
        ledger = service.policy.session_ledger
        try:
            async with httpx.AsyncClient(base_url=service.url, timeout=60) as client:
                agent = {"X-Workload-Class": "agent"}
                first = await client.post("/v1/completions", json={"model": "m", "prompt": "turn 1"},
                                          headers={**agent, "X-Session-Id": "s1"})
                assert first.status_code == 200  # s1 is protected: the engine's one session
                # Session "a" is held for cap headroom; its client then leaves (no X-Session-End).
                writer = await _open_request(service.url, {"model": "m", "prompt": "a"}, {**agent, "X-Session-Id": "a"})
                assert await _until(lambda: ledger.held_counts() == {"agent": 1})
                writer.close()
                assert await _until(lambda: service.state()["held_requests"] == 0)
                assert ledger.held_counts() == {} and ledger.session("a") is None  # at once, not after held_forget_s
                assert ledger.finished("a").reason == "abandoned_hold"
                # s1 ends: its cap is free; a later agent session gets it at once (not behind "a").
                last = await client.post("/v1/completions", json={"model": "m", "prompt": "turn 2"},
                                         headers={**agent, "X-Session-Id": "s1", "X-Session-End": "1"})
                assert last.status_code == 200
                later = await asyncio.wait_for(
                    client.post("/v1/completions", json={"model": "m", "prompt": "b"},
                                headers={**agent, "X-Session-Id": "b"}), timeout=30)
                assert later.status_code == 200
                assert [r.body for r in engines[0].received].count(b'{"model": "m", "prompt": "a"}') == 0
        finally:
            await service.stop()
