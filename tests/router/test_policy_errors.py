"""One policy that raises, driven through both transports: the same errors counted per call,
every session served (router/policy_errors.py)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from router.policies import RoundRobinPolicy
from router.policies.base import RequestFinished
from router.policy_errors import POLICY_ERROR_RETRY_S, PolicyErrors
from router.server import RouterService
from router.service_config import ServiceConfig
from router.sim.cost_model import HARDWARE, MODELS, RooflineCost
from router.sim.engine import EngineConfig
from router.sim.simulator import SimConfig, Simulation
from router.sim.trace import TraceRecord, TraceSession
from tests.router.fake_engine import running_engines

SESSIONS, TURNS = 3, 2


class RaisingPolicy(RoundRobinPolicy):
    """round_robin with two bugs: decide() raises on the first decision of each session,
    observe() raises on every RequestFinished (after round_robin saw it)."""

    name = "raising"

    def __init__(self) -> None:
        super().__init__()
        self.decided_sessions: set[str] = set()
        self.finished = 0

    def decide(self, request, view, now):
        if request.session_id not in self.decided_sessions:
            self.decided_sessions.add(request.session_id)
            raise ZeroDivisionError("policy bug in decide")
        return super().decide(request, view, now)

    def observe(self, event) -> None:
        super().observe(event)
        if isinstance(event, RequestFinished) and event.instance:
            self.finished += 1
            raise KeyError("policy bug in observe")


EXPECTED = {"decide": SESSIONS, "observe": SESSIONS * TURNS}


def trace() -> list[TraceSession]:
    sessions = []
    for i in range(SESSIONS):
        sid = f"s{i}"
        recs = [TraceRecord(sid, "rlvr", t, 64, 8, session_end=t == TURNS - 1) for t in range(TURNS)]
        sessions.append(TraceSession(sid, "rlvr", sid, None, recs))
    return sessions


def sim_config(**kw) -> SimConfig:
    return SimConfig(instances=2, engine=EngineConfig(num_blocks=256, block_size=16),
                     cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 1), mixture={"rlvr": 1.0},
                     ceiling=SESSIONS, context_limit_tokens=1024, **kw)


def test_simulator_counts_policy_errors_and_serves_every_session_when_told_not_to_raise() -> None:
    policy = RaisingPolicy()
    summary = Simulation(sim_config(raise_policy_errors=False), trace(), policy).run().summary
    assert summary["policy_errors"] == EXPECTED
    assert summary["requests_finished"] == SESSIONS * TURNS and policy.finished == SESSIONS * TURNS


def test_simulator_raises_a_policy_error_by_default() -> None:
    with pytest.raises(ZeroDivisionError, match="policy bug in decide"):
        Simulation(sim_config(), trace(), RaisingPolicy()).run()


async def test_live_router_counts_the_same_policy_errors_and_serves_every_session() -> None:
    async with running_engines() as engines:
        service = RouterService(RaisingPolicy(), [e.url for e in engines],
                                config=ServiceConfig(probe_interval_s=0.05, scrape_interval_s=0.05))
        await service.start()
        statuses: list[list[int]] = []
        try:
            async with httpx.AsyncClient(base_url=service.url) as client:
                for i in range(SESSIONS):
                    for t in range(TURNS):
                        headers = {"X-Session-Id": f"s{i}", "X-Workload-Class": "rlvr",
                                   "X-Session-End": "1" if t == TURNS - 1 else "0"}
                        tries = []
                        while not tries or tries[-1] == 500:  # the rollout client retries a 5xx
                            r = await client.post("/v1/completions", json={"model": "m", "prompt": "p"},
                                                  headers=headers)
                            tries.append(r.status_code)
                            assert len(tries) <= 3, tries
                        statuses.append(tries)
                # RequestFinished is observed once the client has the answer: wait for the last one
                for _ in range(500):
                    if service.policy_errors.counts["observe"] == SESSIONS * TURNS:
                        break
                    await asyncio.sleep(0.01)
                metrics = (await client.get("/metrics")).text
        finally:
            await service.stop()
    # the first request of each session: 500, then served on the retry; the others at once
    assert statuses == [[500, 200] if t == 0 else [200] for _ in range(SESSIONS) for t in range(TURNS)]
    assert service.policy_errors.counts == EXPECTED
    assert f'router_policy_errors_total{{call="decide"}} {float(SESSIONS)}' in metrics
    assert f'router_policy_errors_total{{call="observe"}} {float(SESSIONS * TURNS)}' in metrics


def test_decide_failed_counts_and_returns_the_client_retry_hold_or_reraises() -> None:
    seen: list[str] = []
    errors = PolicyErrors("p", on_error=seen.append)
    try:
        raise ValueError("bug")
    except ValueError:
        hold = errors.decide_failed("req-1")
    assert hold.recheck_after_s == POLICY_ERROR_RETRY_S and errors.counts == {"decide": 1, "observe": 0}
    assert seen == ["decide"]
    strict = PolicyErrors("p", raise_errors=True)
    with pytest.raises(ValueError, match="bug"):
        try:
            raise ValueError("bug")
        except ValueError:
            strict.decide_failed("req-2")
    assert strict.counts["decide"] == 1
