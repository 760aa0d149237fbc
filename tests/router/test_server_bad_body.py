"""Malformed request bodies get a 400 with an OpenAI-format JSON error, never a 500.

The router serves on a free local port in front of engine URLs that nobody serves: a
refused body never reaches an engine, and no engine is needed to show it.
"""

from __future__ import annotations

import aiohttp
import pytest

from router.policies import RoundRobinPolicy
from router.policies.base import RequestStarted
from router.server import RouterService
from router.service_config import ServiceConfig
from router.tokenize import PromptTokenizer

NO_ENGINES = ["http://127.0.0.1:9", "http://127.0.0.1:10"]  # discard ports: nothing answers


class CountingPolicy(RoundRobinPolicy):
    """round_robin that counts decisions (a refused body must not reach the policy)."""

    def __init__(self) -> None:
        super().__init__()
        self.decisions = 0
        self.started: list = []

    def decide(self, request, view, now):
        self.decisions += 1
        return super().decide(request, view, now)

    def observe(self, event) -> None:
        if isinstance(event, RequestStarted):
            self.started.append(event)


async def _post(path: str, content: bytes, model_dir: str | None = None) -> tuple[int, dict, CountingPolicy]:
    policy = CountingPolicy()
    service = RouterService(policy, NO_ENGINES, tokenizer=PromptTokenizer(model_dir, block_size=4),
                            config=ServiceConfig(scrape_interval_s=60, max_body_bytes=1 << 20, probe_interval_s=0.05,
                                                 no_engine_timeout_s=0.2, max_retries=1))
    url = await service.start()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.post(url + path, data=content, headers={"Content-Type": "application/json"}) as r:
                return r.status, await r.json(), policy
    finally:
        await service.stop()


def _nested(depth: int) -> bytes:
    return b'{"model": "m", "prompt": "p", "extra": ' + b"[" * depth + b"]" * depth + b"}"


BAD_BODIES = [
    # (path, body, code, words the message must contain)
    ("/v1/completions", _nested(100_000), "invalid_json", "too deeply"),
    ("/v1/chat/completions", b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
     "invalid_json", "too deeply"),
    ("/v1/completions", b'{"model": "m", "prompt": "caf\xe9"}', "invalid_json", "not valid UTF-8"),
    ("/v1/completions", b"\xff\xfe{}", "invalid_json", "not valid UTF-8"),
    ("/v1/completions", b"", "invalid_json", "not valid JSON"),
    ("/v1/completions", b'"a string"', "invalid_json", 'must be a JSON object, got "a string"'),
    ("/v1/completions", b"42", "invalid_json", "must be a JSON object, got 42"),
    ("/v1/completions", b"null", "invalid_json", "must be a JSON object, got null"),
    ("/v1/chat/completions", b"[]", "invalid_json", "must be a JSON object, got an array"),
    ("/v1/completions", b'{"model": 7, "prompt": "p"}', "invalid_type", "'model' must be a string"),
    ("/v1/completions", b'{"model": "m", "prompt": "p", "stream": "yes"}', "invalid_type", "'stream'"),
    ("/v1/completions", b'{"model": "m", "prompt": "p", "max_tokens": "8"}', "invalid_type", "'max_tokens'"),
    ("/v1/completions", b'{"model": "m", "prompt": "p", "max_tokens": -1}', "invalid_type", "'max_tokens' must be a non-negative integer or null, got -1"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [], "max_completion_tokens": 1.5}',
     "invalid_type", "'max_completion_tokens'"),
    ("/v1/completions", b'{"model": "m", "prompt": [1, 99999999999999999999]}', "invalid_prompt", "out of range"),
    ("/v1/completions", b'{"model": "m", "prompt": [-3]}', "invalid_prompt", "out of range"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": "hi"}]}', "invalid_prompt",
     "'messages[0].role'"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "invalid_prompt",
     "'messages[0].content'"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": ["x"]}]}',
     "invalid_prompt", "content-part"),
    ("/admin/reset_prefix_index", b"[1, 2]", "invalid_json", "must be a JSON object"),
    ("/admin/reset_prefix_index", b'{"instance": 3}', "invalid_type", "'instance'"),
    ("/admin/reset_prefix_index", b'{"instance": ' + b"[" * 3000 + b"]" * 3000 + b"}", "invalid_json",
     "too deeply"),
]


@pytest.mark.parametrize(("path", "content", "code", "words"), BAD_BODIES,
                         ids=[f"{p}:{c}:{w}" for p, _, c, w in BAD_BODIES])
async def test_malformed_body_gets_400_with_a_message_saying_what_is_wrong(path, content, code, words):
    status, body, policy = await _post(path, content)
    assert status == 400, body
    err = body["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code
    assert words in err["message"], err["message"]
    assert policy.decisions == 0 and not policy.started


def test_any_template_exception_leaves_the_prefix_unknown_not_a_refusal(model_dir):
    """The engine, not the router, judges messages its template cannot render: the router
    places such a request without a prefix (the openai-client test shows it forwarded)."""
    tokenizer = PromptTokenizer(model_dir, block_size=4)
    hf, template = tokenizer._tokenizer, tokenizer._tokenizer.chat_template  # cached: restored below
    hf.chat_template = "{{ messages[0]['content'] + '!' }}"  # str + list: TypeError
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}]}
    try:
        info = tokenizer.prompt_info(body, "chat")
    finally:
        hf.chat_template = template
    assert info.block_hashes == () and info.prompt_text == "hello world" and info.prompt_tokens == 3  # 11 chars / 4


async def test_token_id_beyond_the_vocabulary_is_a_400_with_a_tokenizer(model_dir):
    status, body, _ = await _post("/v1/completions", b'{"model": "m", "prompt": [1, 2, 10]}', model_dir)
    assert status == 400 and "[0, 10)" in body["error"]["message"]


async def test_deep_but_legal_nesting_is_forwarded_like_any_body():
    """Depth below the decoder's limit is the engine's business: the router decides and forwards."""
    status, _, policy = await _post("/v1/completions", _nested(200))
    assert policy.decisions >= 1 and status in (502, 503)  # no engine answers at the discard ports


@pytest.mark.parametrize(("payload", "usage"), [
    (b'{"choices": [{"text": "hi", "logprobs": {"tokens": ["hi"]}}], "usage": {"prompt_tokens": 5, '
     b'"completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}}',
     {"prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 4}),
    (b'{"choices": []}', {}),
    (b'{"usage": null}', {}),
    (b'{"usage": {"prompt_tokens": "5"}}', {}),
    (b'[1, 2]', {}),
    (b'{"usage": ', {}),
    (b'\xff', {}),
])
def test_answer_usage_is_read_without_building_the_rest(payload, usage):
    """The router reads only ``usage`` of an engine's answer; an answer without a usable one
    (or no JSON object at all) gives no usage, never an error."""
    from router.server import _usage_of_json

    assert _usage_of_json(payload) == usage


async def _raw_exchange(data: bytes) -> tuple[int, dict]:
    """Send ``data`` on a raw connection to a router; (status, JSON body) of its answer."""
    import asyncio
    import json

    service = RouterService(CountingPolicy(), NO_ENGINES, config=ServiceConfig(scrape_interval_s=60))
    url = await service.start()
    try:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=30)  # the router closes after an error
        writer.close()
    finally:
        await service.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/json" in head
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(("data", "words"), [
    (b"POST /v1/" + b"a" * 100 * 1024 + b" HTTP/1.1\r\nHost: r\r\n\r\n", "longer than"),  # 100 KiB request line
    (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nX-Big: " + b"a" * 100 * 1024 + b"\r\n\r\n", "longer than"),
    (b"P@ST /v1/completions HTTP/1.1\r\nHost: r\r\n\r\n", "method"),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n", "Content-Length"),
])
async def test_malformed_http_is_answered_with_an_openai_json_error(data, words):
    status, body = await _raw_exchange(data)
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "malformed_http"
    assert words in body["error"]["message"] and len(body["error"]["message"]) < 400
