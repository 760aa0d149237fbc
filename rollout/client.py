"""Model calls through the router (DESIGN.md step 3), with the session headers.

Every call carries the request metadata of DESIGN.md as HTTP headers (``X-Session-Id``,
``X-Workload-Class``, ``X-Group-Id``, ``X-Rollout-Unit``, ``X-Session-End``), so the
router can count sessions, classes and groups; the body is a plain OpenAI request.

Two clients:

- ``ModelClient``: ``/v1/completions`` with the prompt as token ids and the completion's
  token ids and log-probs back. Rollouts use it (agent episodes and single-turn units):
  the prompt is rendered by us, and vLLM returns the completion's token ids
  (``return_token_ids``) and each sampled token's log-prob (``logprobs: 0``), so the
  trajectory the trainer sees is exactly what was sampled. Chat completions would
  re-render and re-tokenize the history server-side on every turn.
- ``RolloutClient``: chat or text completions for evaluation, where only the text counts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from router.headers import SessionHeaders


class ModelCallError(RuntimeError):
    """A model call failed (HTTP error, malformed or aborted answer, or the endpoint failed
    after retries); the message says which call. Raised by both clients here
    (``RolloutClient``, ``ModelClient``); an agent episode ends with status model_error.

    Attributes:
        reason: a short name for the metrics: ``aborted`` (the engine cancelled the
            request) or ``model_error`` (HTTP failure or malformed answer).
    """

    def __init__(self, message: str, reason: str = "model_error") -> None:
        super().__init__(message)
        self.reason = reason


# vLLM answers a request cancelled by ``/pause?mode=abort`` (a weight sync with
# ``trainer.weight_sync.pause_mode=abort``) with HTTP 200 and this finish reason; the
# completion is cut wherever the pause found it, so it is no sample of the policy.
ABORTED = "abort"
_ABORT_MESSAGE = ("completion aborted by the engine (finish_reason 'abort', as a weight sync "
                  "with pause_mode=abort does); a truncated answer is never scored")


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

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 600.0,
                 max_connections: int = 256):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))

    async def chat(self, messages: list[dict], tag: SessionHeaders, *, session_end: bool = False,
                   **params: Any) -> Completion:
        """POST /v1/chat/completions; ``params`` go into the body (max_tokens, temperature, ...).

        Raises:
            ModelCallError: non-2xx answer, a body without choices, or an aborted completion.
        """
        body = {"model": self.model, "messages": messages, **params}
        return await self._post("/v1/chat/completions", body, tag, session_end,
                                lambda c: (c.get("message") or {}).get("content") or "")

    async def complete(self, prompt: str | list[int], tag: SessionHeaders, *,
                       session_end: bool = False, **params: Any) -> Completion:
        """POST /v1/completions with a text or token-id prompt (see ``chat``)."""
        body = {"model": self.model, "prompt": prompt, **params}
        return await self._post("/v1/completions", body, tag, session_end,
                                lambda c: c.get("text") or "")

    async def _post(self, path: str, body: dict, tag: SessionHeaders, session_end: bool,
                    text_of) -> Completion:
        t0 = time.monotonic()
        try:
            r = await self._http.post(path, json=body, headers=tag.headers(session_end))
        except httpx.HTTPError as e:
            raise ModelCallError(f"{path} for session {tag.session_id} failed: {e!r}") from e
        dt = time.monotonic() - t0
        if r.status_code >= 400:
            raise ModelCallError(f"{path} for session {tag.session_id}: HTTP {r.status_code}: "
                              f"{r.text[:300]}")
        data = r.json()
        choices = data.get("choices") or []
        if not choices:
            raise ModelCallError(f"{path} for session {tag.session_id}: answer has no choices")
        if choices[0].get("finish_reason") == ABORTED:
            raise ModelCallError(f"{path} for session {tag.session_id}: {_ABORT_MESSAGE}", reason="aborted")
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


@dataclass(frozen=True)
class TokenCompletion:
    """One model turn as the engine returned it.

    Attributes:
        token_ids: generated token ids (end token included when the model produced it).
        logprobs: log-prob of each generated token; None entries where the engine gave none.
        finish_reason: ``stop`` or ``length`` (an aborted answer raises instead).
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
                 *, sampling: dict[str, Any] | None = None, timeout_s: float = 600.0,
                 retries: int = 2) -> None:
        self.http = http
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.sampling = dict(sampling or {})
        self.timeout_s = timeout_s
        self.retries = retries

    async def complete(self, prompt_ids: list[int], max_tokens: int, stop_token_id: int,
                       session: SessionHeaders, session_end: bool) -> TokenCompletion:
        """One model turn on ``prompt_ids``.

        Raises:
            ModelCallError: the endpoint failed ``retries + 1`` times, answered 4xx,
                returned no token ids, or aborted the request (``reason="aborted"``, not
                retried: the abort is the engine's answer).
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

    def _parse(self, data: dict[str, Any], model_s: float) -> TokenCompletion:
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ModelCallError(f"completion response has no choices: {str(data)[:300]}") from None
        if choice.get("finish_reason") == ABORTED:
            raise ModelCallError(f"model call to {self.url}: {_ABORT_MESSAGE}", reason="aborted")
        ids = _token_ids_of(choice)
        if ids is None:
            raise ModelCallError("the engine returned no token ids; it must support vLLM's "
                                 "return_token_ids (vLLM >= 0.10) or return_tokens_as_token_ids.")
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        logprobs = [float(x) if x is not None else None for x in lps[:len(ids)]]
        logprobs += [None] * (len(ids) - len(logprobs))
        return TokenCompletion(ids, logprobs, choice.get("finish_reason") or "stop", model_s)
