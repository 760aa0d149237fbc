"""Fixtures of the evaluation tests: a fake model server speaking both APIs the
evaluation uses, run on its own thread so that the synchronous ``evaluate`` (which runs
its own event loop) can call it.

- ``/v1/chat/completions`` (math and code samples): the answer is
  ``answers(user_text, session_id)``;
  a user text containing ``FAIL_500`` gets HTTP 500 while ``fail_500`` is set.
- ``/v1/completions`` with token-id prompts (agent episodes): ``agents.scripted`` with
  the gold-patch policy of the hand-made tasks (ByteTokenizer).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Callable

import pytest
from aiohttp import web

from agents.envs.task import load_tasks
from agents.scripted import ScriptedServer, gold_patch_policy
from agents.server import HANDMADE_TASKS


@dataclass
class FakeModel:
    """The fake server's state (change ``answers`` or ``fail_500`` between runs)."""

    answers: Callable[[str, str], str]
    fail_500: bool = True
    chat_requests: list[dict] = field(default_factory=list)
    url: str = ""

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = body["messages"][-1]["content"]
        self.chat_requests.append({"headers": dict(request.headers), "body": body})
        if self.fail_500 and "FAIL_500" in text:
            return web.json_response({"error": "engine crashed"}, status=500)
        answer = self.answers(text, request.headers.get("X-Session-Id", ""))
        return web.json_response({"choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": answer}}],
                                  "usage": {"prompt_tokens": 10, "completion_tokens": 5}})


@pytest.fixture
def fake_model():
    """A running fake model server; answers "\\boxed{0}" until ``answers`` is replaced."""
    tasks = load_tasks(HANDMADE_TASKS)
    scripted = ScriptedServer(gold_patch_policy({t.problem_statement: t.patch for t in tasks.values()}))
    model = FakeModel(answers=lambda _text, _session: "\\boxed{0}")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict = {}

    async def start() -> None:
        app = scripted.app()
        app.add_routes([web.post("/v1/chat/completions", model.chat)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        model.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    model.scripted = scripted
    yield model
    asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
