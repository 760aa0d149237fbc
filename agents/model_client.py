"""Model calls of an episode: OpenAI ``/v1/completions`` through the router, token ids in
and out, with the session headers of DESIGN.md ("Request metadata").

Why completions and not chat completions: the prompt is sent as token ids we rendered
ourselves (``agents/chat.py``), and vLLM returns the completion's token ids
(``return_token_ids``) and each sampled token's log-prob (``logprobs: 0``), so the
trajectory is exact. Chat completions would re-render and re-tokenize the whole history
server-side on every turn; the ids the trainer sees could differ from what was sampled.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx


class ModelCallError(RuntimeError):
    """The model endpoint failed after retries; the episode ends with status model_error."""


@dataclass(frozen=True)
class SessionHeaders:
    """Identity of one episode for the router (DESIGN.md "Request metadata").

    Attributes:
        session_id: X-Session-Id, one per episode.
        workload_class: X-Workload-Class (``agent``).
        group_id: X-Group-Id (GRPO group of the rollout unit), or None.
        unit_id: X-Rollout-Unit (trainer-counted unit id), or None.
    """

    session_id: str
    workload_class: str = "agent"
    group_id: str | None = None
    unit_id: str | None = None

    def headers(self, session_end: bool) -> dict[str, str]:
        """HTTP headers of one call; ``session_end`` marks the episode's last call."""
        h = {"X-Session-Id": self.session_id, "X-Workload-Class": self.workload_class}
        if self.group_id is not None:
            h["X-Group-Id"] = self.group_id
        if self.unit_id is not None:
            h["X-Rollout-Unit"] = self.unit_id
        if session_end:
            h["X-Session-End"] = "1"
        return h


@dataclass(frozen=True)
class Completion:
    """One model turn as the engine returned it.

    Attributes:
        token_ids: generated token ids (end token included when the model produced it).
        logprobs: log-prob of each generated token; None entries where the engine gave none.
        finish_reason: ``stop`` or ``length``.
        model_s: wall-clock seconds of the HTTP call (router hold time included).
    """

    token_ids: list[int]
    logprobs: list[float | None]
    finish_reason: str
    model_s: float


def _token_ids_of(choice: dict[str, Any]) -> list[int] | None:
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    return None


class ModelClient:
    """Sends completion calls for episodes (one client shared by all episodes).

    Args:
        http: the shared async HTTP client (connection pool).
        base_url: the router's (or an engine's) URL, without ``/v1``.
        model: the ``model`` field of each request.
        sampling: extra request fields (temperature, top_p, seed, ...).
        timeout_s: per-call timeout (the router may hold a request for a while).
        retries: further attempts after a connection error or a 5xx answer.
    """

    def __init__(self, http: httpx.AsyncClient, base_url: str, model: str,
                 sampling: dict[str, Any] | None = None, timeout_s: float = 600.0,
                 retries: int = 2) -> None:
        self.http = http
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.sampling = dict(sampling or {})
        self.timeout_s = timeout_s
        self.retries = retries

    async def complete(self, prompt_ids: list[int], max_tokens: int, stop_token_id: int,
                       session: SessionHeaders, session_end: bool) -> Completion:
        """One model turn on ``prompt_ids``.

        Raises:
            ModelCallError: the endpoint failed ``retries + 1`` times, answered 4xx, or
                returned no token ids.
        """
        body = {**self.sampling, "model": self.model, "prompt": prompt_ids,
                "max_tokens": max_tokens, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "stop_token_ids": [stop_token_id],
                "skip_special_tokens": False}
        headers = session.headers(session_end)
        last_error = ""
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                resp = await self.http.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.HTTPError as e:
                last_error = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 400:
                    return self._parse(resp.json(), time.monotonic() - started)
                last_error = f"HTTP {resp.status_code}: {resp.text[:500]}"
                if resp.status_code < 500:
                    break
            await asyncio.sleep(min(2.0**attempt * 0.5, 5.0))
        raise ModelCallError(f"model call to {self.url} failed: {last_error}")

    def _parse(self, data: dict[str, Any], model_s: float) -> Completion:
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ModelCallError(f"completion response has no choices: {str(data)[:300]}") from None
        ids = _token_ids_of(choice)
        if ids is None:
            raise ModelCallError("the engine returned no token ids; it must support vLLM's "
                                 "return_token_ids (vLLM >= 0.10) or return_tokens_as_token_ids.")
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        logprobs = [float(x) if x is not None else None for x in lps[:len(ids)]]
        logprobs += [None] * (len(ids) - len(logprobs))
        return Completion(ids, logprobs, choice.get("finish_reason") or "stop", model_s)
