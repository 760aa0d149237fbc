"""Rollout workers and the model client on fake answers: an aborted completion and a
hung agent server become dropped units with their reason, never scored ones."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest
from aiohttp import web

from agents.client import AgentClientError, AgentServerClient
from rl.data import ArithmeticSource
from rl.data.agent_tasks import AgentTaskSource
from rl.sampler import MixtureSampler, WorkloadClassSpec
from rollout.client import ModelCallError, ModelClient, RolloutClient
from router.headers import SessionHeaders
from rl.workers import AgentWorker, SingleTurnWorker
from tests.http_app import serving

END = 99


def _answer(finish_reason: str, token_ids=(5, 6, 7)) -> dict:
    return {"choices": [{"index": 0, "text": "abc", "finish_reason": finish_reason,
                         "token_ids": list(token_ids),
                         "logprobs": {"token_logprobs": [-0.1] * len(token_ids)}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(token_ids)}}


class Engine:
    """httpx transport answering every completion with ``answer``; counts the calls."""

    def __init__(self, answer: dict):
        self.answer, self.calls = answer, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return httpx.Response(200, json=self.answer)


class FakeTokenizer:
    eos_token = "<end>"

    def convert_tokens_to_ids(self, token):
        return END

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return [1, 2, 3]

    def decode(self, ids):
        return " ".join(map(str, ids))


class Rewards:
    def __init__(self):
        self.scored = 0

    async def score(self, prompts, completions):
        self.scored += len(completions)
        return [1.0] * len(completions)


def _unit(workload_class="rlvr"):
    src = ArithmeticSource(levels=(1,)) if workload_class == "rlvr" else AgentTaskSource(["t1"])
    s = MixtureSampler({workload_class: 1.0},
                       {workload_class: WorkloadClassSpec({"d": (src, 1.0)}, group_size=1)},
                       seed=0, run_id="t")
    return s.next_group(0)[0]


def _model_client(engine: Engine) -> tuple[ModelClient, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(engine))
    return ModelClient(http, "http://router:9000", "m", retries=2), http


def test_aborted_completion_is_an_error_with_reason_aborted_and_not_retried():
    engine = Engine(_answer("abort"))

    async def go():
        client, http = _model_client(engine)
        try:
            await client.complete([1, 2], 8, END, SessionHeaders("s"), session_end=True)
        finally:
            await http.aclose()

    with pytest.raises(ModelCallError, match="aborted") as err:
        asyncio.run(go())
    assert err.value.reason == "aborted"
    assert engine.calls == 1  # the abort is the engine's answer, not a transient failure


def _run_single_turn(answer: dict, rewards: "Rewards"):
    async def go():
        client, http = _model_client(Engine(answer))
        try:
            return await SingleTurnWorker(client, FakeTokenizer(), rewards, max_tokens={"rlvr": 8},
                                          max_model_len=2048).run(_unit())
        finally:
            await http.aclose()

    return asyncio.run(go())


def test_aborted_single_turn_unit_is_dropped_with_its_reason_and_never_scored():
    rewards = Rewards()
    res = _run_single_turn(_answer("abort", token_ids=(5, 6)), rewards)
    assert not res.ok and res.drop_reason == "aborted" and "aborted" in res.error
    assert rewards.scored == 0 and res.completion_ids == []


def test_finished_single_turn_unit_is_scored():
    rewards = Rewards()
    res = _run_single_turn(_answer("stop", token_ids=(5, END)), rewards)
    assert res.ok and res.drop_reason == "" and rewards.scored == 1 and res.reward == 1.0


def test_evaluation_client_refuses_an_aborted_completion():
    async def go():
        c = RolloutClient("http://router:9000", "m")
        c._http = httpx.AsyncClient(base_url="http://router:9000",
                                    transport=httpx.MockTransport(Engine(_answer("abort"))))
        async with c:
            await c.complete([1, 2], SessionHeaders("s"), max_tokens=4)

    with pytest.raises(ModelCallError, match="aborted"):
        asyncio.run(go())


@contextlib.asynccontextmanager
async def hanging_agent_server():
    """An agent server that accepts episodes and never answers."""
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/episodes/run", hang)
    async with serving(app) as url:
        try:
            yield url
        finally:
            release.set()


def test_agent_server_timeout_is_the_clients_error_naming_the_timeout_key():
    async def go():
        async with hanging_agent_server() as url:
            client = AgentServerClient(url, timeout_s=0.2)
            try:
                await client.run_episode(instance_id="t1")
            finally:
                await client.aclose()

    with pytest.raises(AgentClientError, match=r"no answer within 0.2 s.*trainer.agent_timeout_s"):
        asyncio.run(go())


def test_hung_agent_unit_is_dropped_with_reason_agent_timeout():
    async def go():
        async with hanging_agent_server() as url:
            client = AgentServerClient(url, timeout_s=0.2)
            try:
                return await AgentWorker(client, "http://router:9000", "m").run(_unit("agent"))
            finally:
                await client.aclose()

    res = asyncio.run(go())
    assert not res.ok and res.drop_reason == "agent_timeout"
    assert "no answer within 0.2 s" in res.error
    json.dumps(res.info)  # the result stays loggable


def _agent_worker_on(body: dict):
    """The unit result of an AgentWorker whose agent server answers ``body``."""
    async def go():
        client = AgentServerClient("http://agents:8200")
        await client.http.aclose()
        client.http = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda request: httpx.Response(200, json=body)))
        try:
            return await AgentWorker(client, "http://router:9000", "m").run(_unit("agent"))
        finally:
            await client.aclose()

    return asyncio.run(go())


def _episode(**fields):
    from agents.loop import EpisodeResult, TurnRecord

    base = dict(session_id="s", instance_id="t1", status="submitted", reward=1.0,
                prompt_ids=[1, 2], completion_ids=[3, 4, 5], loss_mask=[1, 0, 1],
                logprobs=[-0.5, None, -0.25], turns=[TurnRecord(2, 1, 0.1), TurnRecord(4, 1, 0.1)],
                model_s=0.2, tool_s=0.3, eval_s=0.1, wall_s=0.7, patch="diff")
    return EpisodeResult(**{**base, **fields}).to_dict()


def test_agent_episode_becomes_a_scored_unit_with_its_trajectory():
    res = _agent_worker_on(_episode())
    assert res.ok and res.reward == 1.0 and res.drop_reason == ""
    assert (res.prompt_ids, res.completion_ids, res.loss_mask) == ([1, 2], [3, 4, 5], [1, 0, 1])
    assert res.logprobs == [-0.5, 0.0, -0.25]  # off the mask: no engine log-prob
    assert res.num_requests == 2 and (res.model_s, res.tool_s) == (0.2, 0.3)
    assert res.info == {"status": "submitted", "instance_id": "t1"}


def test_agent_episode_that_failed_in_the_sandbox_is_dropped_with_its_status():
    res = _agent_worker_on(_episode(status="sandbox_error", error="bwrap failed"))
    assert not res.ok and res.drop_reason == "agent_sandbox_error" and res.error == "bwrap failed"


def test_malformed_agent_server_answer_is_a_dropped_unit_not_a_crash():
    body = _episode()
    del body["completion_ids"]
    res = _agent_worker_on(body)
    assert not res.ok and res.drop_reason == "agent_server_error"
    assert "completion_ids" in res.error
