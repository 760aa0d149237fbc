"""A scripted OpenAI-compatible completions server: a policy without a model.

Used by the agent tests and ``bench/agent_episodes.py`` in place of router + vLLM. It
speaks the subset of ``/v1/completions`` the agent loop uses (token-id prompts,
``return_token_ids``, ``logprobs``, ``stop_token_ids``, ``max_tokens``) over the
``ByteTokenizer``, and records every request's headers and body for assertions.

A policy maps (session id, turn index, prompt text) to the assistant's next text;
``gold_patch_policy`` solves a task from its gold patch with the agent's own tools.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from agents.chat import ByteTokenizer
from agents.toolcall import format_tool_call

Policy = Callable[[str, int, str], str]
"""(session_id, turn_index, prompt_text) -> assistant text (without the end token)."""

SCRIPTED_LOGPROB = -0.25
"""Log-prob the scripted server reports for every generated token."""


def tool_call(name: str, **arguments: str) -> str:
    """A Hermes-style tool call as a model would write it."""
    return format_tool_call(name, arguments)


def first_hunk_replacement(patch: str) -> tuple[str, str, str]:
    """(path, old_str, new_str) of the first hunk of a unified diff (context kept)."""
    path = re.search(r"^\+\+\+ b/(\S+)", patch, re.MULTILINE)
    if path is None:
        raise ValueError("patch has no '+++ b/<path>' line")
    body = patch[patch.index("@@", path.end()):].split("\n", 1)[1]
    old, new = [], []
    for line in body.split("\n"):
        if line.startswith("@@") or line.startswith("diff "):
            break
        if line.startswith("-"):
            old.append(line[1:])
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith(" ") or line == "":
            old.append(line[1:])
            new.append(line[1:])
    return path.group(1), "\n".join(old).rstrip("\n"), "\n".join(new).rstrip("\n")


def gold_patch_policy(patches_by_problem: dict[str, str]) -> Policy:
    """A policy that fixes each task with its gold patch: look, read, replace, test, submit.

    Args:
        patches_by_problem: problem statement -> gold patch (the policy finds the task by
            its statement in the prompt).
    """
    def policy(_session: str, turn: int, prompt: str) -> str:
        patch = next((p for s, p in patches_by_problem.items() if s in prompt), None)
        if patch is None:
            return tool_call("submit")
        path, old, new = first_hunk_replacement(patch)
        steps = [tool_call("bash", command="ls"),
                 tool_call("read_file", path=path),
                 "The bug is here; fixing it.\n" + tool_call("str_replace", path=path,
                                                              old_str=old, new_str=new),
                 tool_call("run_tests"),
                 tool_call("submit")]
        return steps[min(turn, len(steps) - 1)]
    return policy


@dataclass
class ScriptedServer:
    """The server's state: its policy, simulated latency and the requests it saw.

    Attributes:
        policy: decides each answer.
        latency_s: sleep per request (simulated model time).
        requests: (headers, body) of every request, in arrival order.
    """

    policy: Policy
    latency_s: float = 0.0
    model: str = "scripted"
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    tok: ByteTokenizer = field(default_factory=ByteTokenizer)

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-")}
        self.requests.append((headers, body))
        prompt = body["prompt"]
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": "scripted server takes token-id prompts"}, status=400)
        text = self.tok.decode(prompt)
        # The turn index: one observation message precedes each turn after the first
        # (assistant messages are no count: demonstrations shown before the task are some).
        turn = text.count("<|im_start|>user\n<tool_response>")
        answer = self.policy(headers.get("X-Session-Id", ""), turn, text)
        ids = self.tok.encode(answer) + [self.tok.token_id("<|im_end|>")]
        finish = "stop"
        if len(ids) > body.get("max_tokens", 16):
            ids, finish = ids[: body["max_tokens"]], "length"
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        choice = {"index": 0, "text": self.tok.decode(ids), "finish_reason": finish,
                  "token_ids": ids,
                  "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                               "token_logprobs": [SCRIPTED_LOGPROB] * len(ids)}}
        return web.json_response({"id": f"cmpl-{len(self.requests)}", "object": "text_completion",
                                  "model": self.model, "choices": [choice],
                                  "usage": {"prompt_tokens": len(prompt),
                                            "completion_tokens": len(ids)}})

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "root": "byte"}]})

    def app(self) -> web.Application:
        """The aiohttp application (``/v1/completions``, ``/v1/models``)."""
        app = web.Application(client_max_size=64 * 1024**2)
        app.add_routes([web.post("/v1/completions", self.completions),
                        web.get("/v1/models", self.models)])
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
        """Serve on the running event loop; returns (runner to clean up, base URL)."""
        runner = web.AppRunner(self.app())
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        real_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner, f"http://{host}:{real_port}"
