"""The official ``openai`` client through the router (fake engine behind it): sync and
async, streamed and not, with the tool-call history every OpenAI-style agent harness sends
(an assistant turn with ``content: null`` and ``tool_calls``, then a ``tool`` message)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from router.policies import RoundRobinPolicy
from router.policies.base import RequestStarted
from router.server import RouterService
from router.service_config import ServiceConfig
from router.tokenize import PromptTokenizer
from tests.router.conftest import save_word_tokenizer
from tests.router.fake_engine import running_engines

# SmolLM2's template (the project's model) joins strings with '+': a null content is a TypeError.
CONCAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
RAISING_TEMPLATE = "{{ raise_exception('this template renders no tool turns') }}"

TOOLS = [{"type": "function", "function": {"name": "run", "description": "run a shell command",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
TOOL_HISTORY = [
    {"role": "user", "content": "hello world hello world"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "hello again"},
]


class StartedPolicy(RoundRobinPolicy):
    """round_robin that keeps the requests it saw start."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list = []

    def observe(self, event) -> None:
        if isinstance(event, RequestStarted):
            self.started.append(event.request)


@pytest.fixture(scope="module", params=[CONCAT_TEMPLATE, RAISING_TEMPLATE], ids=["concat", "raising"])
def template_dir(request, tmp_path_factory):
    return request.param, save_word_tokenizer(tmp_path_factory.mktemp("model"), request.param)


async def _four_calls(base_url: str) -> list[str]:
    """Sync and async, streamed and not: the assistant texts the client got."""
    kwargs = {"model": "fake-model", "messages": TOOL_HISTORY, "tools": TOOLS, "max_tokens": 8}

    def sync_calls() -> list[str]:
        with openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0) as client:
            plain = client.chat.completions.create(**kwargs).choices[0].message.content
            stream = client.chat.completions.create(**kwargs, stream=True)
            return [plain, "".join(c.choices[0].delta.content or "" for c in stream if c.choices)]

    got = await asyncio.to_thread(sync_calls)  # the router serves on this loop
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0) as client:
        got.append((await client.chat.completions.create(**kwargs)).choices[0].message.content)
        stream = await client.chat.completions.create(**kwargs, stream=True)
        got.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))
    return got


async def test_openai_client_tool_call_history_is_forwarded_and_hashed_where_the_template_renders(template_dir):
    template, path = template_dir
    async with running_engines(1) as engines:
        policy = StartedPolicy()
        service = RouterService(policy, [engines[0].url], tokenizer=PromptTokenizer(path), block_size=4,
                                config=ServiceConfig(scrape_interval_s=0.05, probe_interval_s=0.05))
        await service.start()
        try:
            got = await _four_calls(service.url)
        finally:
            await service.stop()
    assert got == ["tok" * 4] * 4
    bodies = [json.loads(r.body) for r in engines[0].received]
    assert len(bodies) == 4 and all(b["messages"] == TOOL_HISTORY and b["tools"] == TOOLS for b in bodies)
    assert len(policy.started) == 4
    if template is CONCAT_TEMPLATE:  # null content renders as "": the prefix is hashed
        assert all(len(r.block_hashes) >= 3 for r in policy.started)
        assert len({r.block_hashes for r in policy.started}) == 1
    else:  # the template cannot render it: placed without a prefix, forwarded all the same
        assert all(r.block_hashes == () and r.prompt_tokens > 0 for r in policy.started)
