"""The reward server's HTTP contract and its client, with a stand-in scorer."""

import threading

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rl.data.base import Prompt, user_prompt
from rl.reward_server import make_app
from rl.rewards import HttpRewardScorer, RewardError


class LengthScorer:
    """Reward = completion length; records what it saw."""

    def __init__(self):
        self.seen = []

    def score_batch(self, prompts, completions):
        self.seen.append([(p.messages, c) for p, c in zip(prompts, completions)])
        return [float(len(c)) for c in completions]


async def test_score_returns_one_float_per_item_in_order():
    scorer = LengthScorer()
    async with TestClient(TestServer(make_app(scorer))) as client:
        r = await client.post("/score", json={"items": [
            {"messages": [{"role": "user", "content": "hi"}], "completion": "abc"},
            {"messages": [{"role": "user", "content": "yo"}], "completion": "a"}]})
        assert r.status == 200
        assert (await r.json()) == {"scores": [3.0, 1.0]}
        assert scorer.seen[0][1] == (({"role": "user", "content": "yo"},), "a")
        assert (await client.get("/health")).status == 200


async def test_malformed_body_gets_400_with_reason():
    async with TestClient(TestServer(make_app(LengthScorer()))) as client:
        r = await client.post("/score", json={"items": [{"completion": "x"}]})
        assert r.status == 400 and "items[0]" in (await r.json())["error"]
        r = await client.post("/score", json={"nope": 1})
        assert r.status == 400


def test_http_scorer_round_trip_against_a_running_server(unused_tcp_port):
    import asyncio

    scorer = LengthScorer()
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(scorer))

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ready.wait(10)
    try:
        client = HttpRewardScorer(f"http://127.0.0.1:{unused_tcp_port}")
        p = Prompt("i/0", "instructions", user_prompt("write"))
        assert client.score_batch([p, p], ["four", "sixsix"]) == [4.0, 6.0]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
    with pytest.raises(RewardError, match="unreachable"):
        HttpRewardScorer(f"http://127.0.0.1:{unused_tcp_port}").score_batch([p], ["x"])
