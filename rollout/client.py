"""The rollout workers' client for model calls through the router (DESIGN.md step 3).

Every call carries the request metadata of DESIGN.md as HTTP headers (``X-Session-Id``,
``X-Workload-Class``, ``X-Group-Id``, ``X-Rollout-Unit``, ``X-Session-End``), so the
router can count sessions, classes and groups; the body is a plain OpenAI request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx


class ClientError(RuntimeError):
    """A model call failed (HTTP error or malformed answer); the message says which call."""


@dataclass(frozen=True)
class SessionTag:
    """Who a model call belongs to (DESIGN.md, "Request metadata").

    Attributes:
        session_id: one agent trajectory, or one single-turn sample.
        workload_class: ``agent``, ``rlvr``, ``rlhf`` (or a recipe's own class).
        group_id: GRPO group of sibling units from one prompt, or None.
        unit_id: trainer-counted rollout unit id, or None (= session id).
    """

    session_id: str
    workload_class: str
    group_id: str | None = None
    unit_id: str | None = None

    def headers(self, session_end: bool = False) -> dict[str, str]:
        """The metadata headers for one call; ``session_end`` marks the session's last call."""
        h = {"X-Session-Id": self.session_id, "X-Workload-Class": self.workload_class}
        if self.group_id is not None:
            h["X-Group-Id"] = self.group_id
        if self.unit_id is not None:
            h["X-Rollout-Unit"] = self.unit_id
        if session_end:
            h["X-Session-End"] = "1"
        return h


@dataclass
class Completion:
    """One model answer.

    Attributes:
        text: the generated text.
        finish_reason: ``stop``, ``length``, ...
        prompt_tokens / completion_tokens: token counts from the engine's usage.
        latency_s: wall time of the HTTP call, seconds.
        raw: the decoded JSON answer.
    """

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    raw: dict = field(repr=False, default_factory=dict)


class RolloutClient:
    """Async OpenAI-compatible client bound to one base URL (the router's, normally).

    Args:
        base_url: ``http://host:port`` of the router (or an engine).
        model: the served model name sent in each body.
        timeout_s: per-call timeout, seconds (held requests wait at the router, so this
            bounds hold time plus generation).
        max_connections: connection-pool size.
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0,
                 max_connections: int = 256):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))

    async def chat(self, messages: list[dict], tag: SessionTag, *, session_end: bool = False,
                   **params: Any) -> Completion:
        """POST /v1/chat/completions; ``params`` go into the body (max_tokens, temperature, ...).

        Raises:
            ClientError: non-2xx answer or a body without choices.
        """
        body = {"model": self.model, "messages": messages, **params}
        return await self._post("/v1/chat/completions", body, tag, session_end,
                                lambda c: (c.get("message") or {}).get("content") or "")

    async def complete(self, prompt: str | list[int], tag: SessionTag, *,
                       session_end: bool = False, **params: Any) -> Completion:
        """POST /v1/completions with a text or token-id prompt (see ``chat``)."""
        body = {"model": self.model, "prompt": prompt, **params}
        return await self._post("/v1/completions", body, tag, session_end,
                                lambda c: c.get("text") or "")

    async def _post(self, path: str, body: dict, tag: SessionTag, session_end: bool,
                    text_of) -> Completion:
        t0 = time.monotonic()
        try:
            r = await self._http.post(path, json=body, headers=tag.headers(session_end))
        except httpx.HTTPError as e:
            raise ClientError(f"{path} for session {tag.session_id} failed: {e!r}") from e
        dt = time.monotonic() - t0
        if r.status_code >= 400:
            raise ClientError(f"{path} for session {tag.session_id}: HTTP {r.status_code}: "
                              f"{r.text[:300]}")
        data = r.json()
        choices = data.get("choices") or []
        if not choices:
            raise ClientError(f"{path} for session {tag.session_id}: answer has no choices")
        usage = data.get("usage") or {}
        return Completion(text_of(choices[0]), choices[0].get("finish_reason"),
                          int(usage.get("prompt_tokens") or 0),
                          int(usage.get("completion_tokens") or 0), dt, data)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "RolloutClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
