"""The router's view of a real vLLM engine: its prompt hashes match the engine's KV events.

The prefix index is built from the engine's BlockStored events (token ids, re-hashed with
the project's chain); placement looks prompts up by the hashes the router computes from
its own tokenization. Both must agree token for token, or placement never sees a hit.
"""

from __future__ import annotations

import time

import httpx
import pytest
import zmq

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
