"""The router in front of a real vLLM engine.

- Its prompt hashes match the engine's KV events. The prefix index is built from the engine's BlockStored events (token ids, re-hashed with
the project's chain); placement looks prompts up by the hashes the router computes from
its own tokenization. Both must agree token for token, or placement never sees a hit.
- Answers pass through its HTTP client unchanged, streamed (uvicorn's chunked SSE) or not,
  and the engine's ``usage`` reaches the policy.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import zmq

from router.policies import RoundRobinPolicy
from router.policies.base import RequestFinished
from router.server import RouterService
from router.signals import KvHashTranslator, decode_kv_events
from router.tokenize import PromptTokenizer
from tests.conftest import SERVED_NAME

pytestmark = pytest.mark.engine


def _stored_hashes(sub, timeout_s: float) -> set[int]:
    translator, out = KvHashTranslator(), set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sub.poll(500):
            _topic, _seq, payload = sub.recv_multipart()
            for ev in translator.translate("engine", decode_kv_events(payload), 0.0):
                out.update(getattr(ev, "block_hashes", ()))
        elif out:
            break
    return out


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_router_prompt_hashes_match_the_engines_kv_events(real_engine, model_path, endpoint):
    text = f"Hash probe for {endpoint}. " + " ".join(f"item{i}" for i in range(350))
    body = ({"model": SERVED_NAME, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
            if endpoint == "chat" else {"model": SERVED_NAME, "prompt": text, "max_tokens": 2})
    info = PromptTokenizer(model_path, block_size=128).prompt_info(body, endpoint)
    assert len(info.block_hashes) >= 3

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(real_engine.kv_events_endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    time.sleep(0.5)  # let the subscription reach the publisher
    try:
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        r = httpx.post(real_engine.url + path, json=body, timeout=120)
        assert r.status_code == 200
        assert r.json()["usage"]["prompt_tokens"] == info.prompt_tokens
        stored = _stored_hashes(sub, 20)
    finally:
        sub.close(linger=0)
    assert set(info.block_hashes) <= stored


class _FinishedLog(RoundRobinPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.finished: list[RequestFinished] = []

    def observe(self, event) -> None:
        super().observe(event)
        if isinstance(event, RequestFinished):
            self.finished.append(event)


async def test_router_relays_real_answers_streamed_and_not_and_reads_their_usage(real_engine, model_path):
    policy = _FinishedLog()
    service = RouterService(policy, [real_engine.url], tokenizer=PromptTokenizer(model_path))
    url = await service.start()
    body = {"model": SERVED_NAME, "prompt": "Count: one, two, three,", "max_tokens": 6, "temperature": 0}
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            direct = (await client.post(real_engine.url + "/v1/completions", json=body)).json()
            routed = await client.post(url + "/v1/completions", json=body, headers={"X-Workload-Class": "rlvr"})
            assert routed.status_code == 200
            assert routed.json()["choices"][0]["text"] == direct["choices"][0]["text"]
            events = []
            stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with client.stream("POST", url + "/v1/completions", json=stream) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
    finally:
        await service.stop()
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
    assert text == direct["choices"][0]["text"]
    usage = direct["usage"]
    assert [(f.ok, f.prompt_tokens, f.completion_tokens) for f in policy.finished] == \
        [(True, usage["prompt_tokens"], usage["completion_tokens"])] * 2
