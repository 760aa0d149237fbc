"""The live router: an async OpenAI-compatible HTTP proxy driven by a routing policy.

Every request to ``/v1/completions`` or ``/v1/chat/completions`` goes through one loop
(DESIGN.md, "The router's inside"):

1. read the body (bytes, forwarded unchanged) and the metadata headers
   (``X-Session-Id``, ``X-Workload-Class``, ``X-Group-Id``, ``X-Rollout-Unit``,
   ``X-Session-End``) into a policy :class:`Request`, with the prompt's length and KV
   block hashes from :mod:`router.tokenize`;
2. ``policy.decide(request, view, now)``: ``Admit(w)`` -> forward to engine ``w``;
   ``Hold(dt)`` -> wait ``dt`` (or until a request finishes or an engine recovers) and
   decide again; held requests wait in :class:`router.held_queue.HeldWaiters`, woken
   oldest first (the contract it shares with the simulator). A policy exception is
   treated as :mod:`router.policy_errors` says (counted; a failed decide answers 500).
   HOLD never drops a request; a client that goes away is dropped and
   reported as ``RequestFinished(ok=False)`` with ``instance=""`` if it was never admitted;
3. report ``RequestStarted`` / ``RequestFinished`` (with the engine's ``usage``) to the
   policy; after the last request of a session marked ``X-Session-End: 1``,
   ``SessionEnded``. ``RequestStarted`` is reported once the request is on its way to the
   engine and the others once the client has the answer, so that the bookkeeping adds
   nothing to the request's latency.

Requests go to the engines through :mod:`router.upstream` (pooled keep-alive HTTP/1.1);
the server is aiohttp's low-level ``web.Server`` with a fixed route table.

An engine that fails a request before any byte reached the client (connection error,
or HTTP 502/503/504) is marked unhealthy, probed on ``/health`` until it answers, and
the request is decided again (retried elsewhere, up to ``max_retries``). Once streaming
has begun, the client gets the error as a final SSE ``data: {"error": ...}`` event.

Bad input gets an OpenAI-format JSON error ``{"error": {"message", "type", "param", "code"}}``:
400 for a body that is not a UTF-8 JSON object or nests too deeply (``invalid_json``),
missing fields (``missing_field``), a field the router reads with the wrong type
(``invalid_type``) or a ``messages``/``prompt`` of the wrong shape (``invalid_prompt``);
messages the model's chat template cannot render are not refused but placed without a
prefix and forwarded (the engine judges them); wrong method 405,
unknown path 404, body over ``max_body_bytes`` 413; HTTP that aiohttp's parser refuses (a
request line or header over 8190 bytes, a bad method, malformed headers) 400
``malformed_http``; a router bug answers 500 with the message, the traceback goes to the
log only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import msgspec
from aiohttp import web

from router.bad_request import (BadRequestError, JsonErrorServer, check_field_types, decode_json_object,
                                error_body, error_response, json_type)
from router.held_queue import HeldWaiters
from router.metrics import RouterMetrics
from router.policy_errors import PolicyErrors
from router.policies.base import (
    DEFAULT_CLASS,
    Admit,
    AllBlocksCleared,
    ClusterView,
    Event,
    InstanceHealthChanged,
    InstanceMetrics,
    InstanceView,
    MetricsSampled,
    Policy,
    Request,
    RequestFinished,
    RequestStarted,
    RouterConfigError,
    SessionEnded,
)
from router.service_config import SERVICE_OPTIONS, ServiceConfig
from router.signals import KvEventSubscriber, KvHashTranslator, MetricsScraper
from router.tokenize import Endpoint, PromptError, PromptTokenizer
from router.upstream import UpstreamClient, UpstreamResponse
from common.process import listening_socket
from common.urls import engine_urls_problem, kv_event_endpoints_problem, normalize_engine_urls

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 section 7.6.1), those the client library recomputes, and Expect
# (the router answers 100-continue itself).
_HOP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Proxy-Connection",
        "TE", "Trailer", "Upgrade", "Accept-Encoding", "Expect",
    )
)
_HOP_HEADERS_RAW = frozenset(h.encode() for h in _HOP_HEADERS)
_RETRYABLE_STATUS = frozenset({502, 503, 504})
_FAILED_ENGINE_ERRORS = (asyncio.TimeoutError, ConnectionError)  # UpstreamError is a ConnectionError


@dataclass
class InstanceState:
    """The transport's knowledge of one engine (becomes an ``InstanceView``)."""

    url: str
    healthy: bool = True
    in_flight: int = 0
    metrics: InstanceMetrics | None = None
    metrics_at_s: float | None = None
    scrapes_failed: int = 0
    kv_event_gaps: int = 0

    def view(self, now: float) -> InstanceView:
        age = None if self.metrics_at_s is None else max(0.0, now - self.metrics_at_s)
        return InstanceView(self.url, self.healthy, self.in_flight, self.metrics, age)


class _NoHealthyEngine(Exception):
    """No engine was healthy for longer than ``no_engine_timeout_s`` while a request waited."""


@dataclass
class _Session:
    in_flight: int = 0
    ending: bool = False
    last_active_s: float = 0.0


class _EngineFailed(Exception):
    """The engine failed before the client saw a byte; the request may be retried."""


class RouterService:
    """The router's state and HTTP handlers (one per process, or per test).

    Args:
        policy: a routing policy (``router.policies.make_policy``).
        engine_urls: engine base URLs (``http(s)://host:port``), in the policy's instance
            order; anything else raises RouterConfigError naming ``engines.urls``.
        kv_event_endpoints: ZMQ endpoints, same order as ``engine_urls`` (may be empty).
        tokenizer: turns bodies into prompt length and block hashes.
        config: transport options.
        block_size: engine KV block size in tokens; None = take it from the first
            scrape's ``vllm:cache_config_info``.
        clock: seconds, monotonic; the policy's ``now``.

    Use ``await start(host, port)`` / ``await stop()``.
    """

    def __init__(
        self,
        policy: Policy,
        engine_urls: Sequence[str],
        *,
        kv_event_endpoints: Sequence[str] = (),
        tokenizer: PromptTokenizer | None = None,
        config: ServiceConfig | None = None,
        block_size: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        problem = engine_urls_problem(engine_urls, "engines.urls")
        if problem is not None:
            raise RouterConfigError(problem)
        urls = normalize_engine_urls(engine_urls)
        if not urls:
            raise RouterConfigError("no engines: set engines.urls=[http://host:port,...]")
        if len(set(urls)) != len(urls):
            raise RouterConfigError(f"engines.urls has duplicates: {urls}")
        problem = kv_event_endpoints_problem(kv_event_endpoints, "engines.kv_event_endpoints", len(urls))
        if problem is not None:
            raise RouterConfigError(problem)
        kv_event_endpoints = [str(e).strip() for e in kv_event_endpoints]
        self.policy = policy
        self.config = config or ServiceConfig()
        self.clock = clock
        self.instances = {u: InstanceState(u) for u in urls}
        self.tokenizer = tokenizer or PromptTokenizer(None)
        self.translator = KvHashTranslator()
        self.metrics = RouterMetrics(long_hold_s=self.config.long_hold_s)
        self.policy_errors = PolicyErrors(
            getattr(policy, "name", type(policy).__name__),
            on_error=lambda call: self.metrics.policy_errors.labels(call).inc())
        self.block_size: int | None = None
        if block_size:
            self._set_block_size(block_size)
        self.scraper = MetricsScraper(
            urls, self._on_metrics, interval_s=self.config.scrape_interval_s,
            timeout_s=self.config.scrape_timeout_s, clock=clock,
            on_unreachable=lambda instance: self._set_health(instance, False),
            on_failure=self._on_scrape_failed,
            idle=self._engines_idle, idle_interval_s=self.config.idle_scrape_interval_s,
        )
        self.kv_events = KvEventSubscriber(
            dict(zip(urls, kv_event_endpoints)), self.observe, self.translator, topic=self.config.kv_topic,
            on_event_batch=self._on_kv_batch, clock=clock,
        )
        self._known_classes = frozenset(self.config.workload_classes)
        self._ids = itertools.count()
        self._sessions: dict[str, _Session] = {}
        self._held_now = 0
        # Held requests waiting for a recheck, woken oldest first (router/held_queue.py).
        self._held = HeldWaiters()
        self._probes: dict[str, asyncio.Task] = {}
        self._tasks: list[asyncio.Task] = []
        self._pool = ThreadPoolExecutor(self.config.tokenizer_threads, thread_name_prefix="tokenize")
        self._upstream = UpstreamClient(self.config.connect_timeout_s, self.config.request_timeout_s)
        self._runner: web.ServerRunner | None = None
        self.url: str | None = None

    # ------------------------------------------------------------------ lifecycle

    # (method, path) -> handler name; GET routes also answer HEAD.
    ROUTES = {
        ("POST", "/v1/completions"): "_completions",
        ("POST", "/v1/chat/completions"): "_chat",
        ("GET", "/v1/models"): "_models",
        ("GET", "/health"): "_health",
        ("GET", "/metrics"): "_metrics",
        ("GET", "/state"): "_state",
        ("POST", "/admin/reset_prefix_index"): "_reset_prefix_index",
    }

    def make_server(self) -> web.Server:
        """aiohttp's low-level server with this service's routes and JSON errors.

        Not an ``aiohttp.web.Application``: its URL dispatcher, middleware chain and
        response signals cost about 20 us of CPU per request, 0.07 ms of added latency
        at concurrency 1 in ``bench.router_proxy``; seven fixed paths need a dict.
        Background tasks start in :meth:`start`, not here.
        """
        routes = {key: getattr(self, name) for key, name in self.ROUTES.items()}
        routes.update({("HEAD", path): handler for (method, path), handler in list(routes.items()) if method == "GET"})
        allowed: dict[str, list[str]] = {}
        for method, path in routes:
            allowed.setdefault(path, []).append(method)
        served = ", ".join(f"{'/'.join(sorted(m for m in methods if m != 'HEAD'))} {path}"
                           for path, methods in allowed.items())
        max_body = self.config.max_body_bytes
        loop = asyncio.get_running_loop()

        def make_request(message, payload, protocol, writer, task) -> web.BaseRequest:
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=max_body)

        async def handle(http: web.BaseRequest) -> web.StreamResponse:
            handler = routes.get((http.method, http.path))
            try:
                if handler is None:
                    methods = allowed.get(http.path)
                    if methods is None:
                        return error_response(404, f"no route {http.path}; this router serves {served}")
                    response = error_response(405, f"method {http.method} is not allowed on {http.path}")
                    response.headers["Allow"] = ",".join(sorted(methods))
                    return response
                expect = http.headers.get("Expect")
                if expect is not None:  # the client waits for a go-ahead before it sends the body
                    if expect.lower() != "100-continue":
                        return error_response(417, f"unsupported Expect: {expect!r}; only 100-continue is")
                    if http.version >= (1, 1):
                        await http.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                        http.writer.output_size = 0  # the answer proper starts now
                return await handler(http)
            except BadRequestError as exc:
                return error_response(exc.status, str(exc), exc.code)
            except web.HTTPRequestEntityTooLarge as exc:
                return error_response(413, f"request body too large ({exc.text}); the limit is server.max_body_bytes")
            except web.HTTPException as exc:
                if exc.status < 400:
                    raise
                return error_response(exc.status, exc.reason)
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:  # a router bug: the client gets a message, the log the traceback
                log.exception("internal error on %s %s", http.method, http.path)
                return error_response(500, f"internal router error: {type(exc).__name__}: {exc}")

        return JsonErrorServer(handle, request_factory=make_request, handler_cancellation=True, access_log=None)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind ``host:port`` (0 = any free port), start the background tasks, then serve;
        returns the base URL.

        The socket is bound first (``common.process.listening_socket``), so an address in
        use fails before any engine is scraped or logged about.

        Raises:
            ConfigError: the address cannot be bound (in use, not an address of this
                machine), naming server.host and server.port.
        """
        sock = listening_socket(host, port, ("server.host", "server.port"))
        try:
            await self._on_startup()
            self._runner = web.ServerRunner(self.make_server())
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            if self._runner is not None:
                await self.stop()
            else:  # the tasks and clients _on_startup may have started
                await self._on_cleanup()
            raise
        bound = sock.getsockname()[1]  # the port the OS picked
        self.url = f"http://{host}:{bound}"
        return self.url

    async def stop(self) -> None:
        """Stop serving and cancel the signal loops and probes."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            await self._on_cleanup()

    def _engines_idle(self) -> bool:
        """Nothing can change the engines' figures but a request not sent yet: none in flight
        or held, and every engine's last sample shows no request running or waiting (the
        scraper then slows to ``signals.idle_scrape_interval_s``)."""
        return self._held_now == 0 and all(
            s.in_flight == 0 and s.metrics is not None and s.metrics.num_requests_running == 0
            and s.metrics.num_requests_waiting == 0 for s in self.instances.values())

    async def _on_startup(self) -> None:
        # One scrape before serving: the block size (and a first sample) is known at once.
        await self.scraper.scrape_once()
        if self.block_size is None:
            log.warning("engine block size unknown (no cache_config_info yet): "
                        "block hashes stay empty until an engine reports it")
        self._tasks = [asyncio.create_task(self.scraper.run(scraped_just_now=True), name="scrape")]
        if self.kv_events.endpoints:
            self._tasks.append(asyncio.create_task(self.kv_events.run(), name="kv-events"))
        if self.config.session_forget_idle_s > 0:
            self._tasks.append(asyncio.create_task(self._sweep_idle_sessions(), name="idle-sessions"))

    async def _on_cleanup(self) -> None:
        for task in [*self._tasks, *self._probes.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._probes.values(), return_exceptions=True)
        self._tasks, self._probes = [], {}
        await self.scraper.close()
        self._upstream.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ signals -> policy

    def observe(self, event: Event) -> None:
        """Give ``event`` to the policy (a policy bug is counted and logged, not raised into a
        loop: :mod:`router.policy_errors`)."""
        self.policy_errors.observe(self.policy, event)

    def _set_block_size(self, block_size: int) -> None:
        self.block_size = block_size
        self.tokenizer.block_size = block_size
        self.translator.block_size = block_size

    def _on_metrics(self, instance: str, metrics: InstanceMetrics, now: float) -> None:
        state = self.instances[instance]
        state.metrics, state.metrics_at_s = metrics, now
        if self.block_size is None and metrics.block_size:
            self._set_block_size(metrics.block_size)
            log.info("engine block size %d tokens (from %s/metrics)", metrics.block_size, instance)
        self.observe(MetricsSampled(instance, metrics, now))

    def _on_scrape_failed(self, instance: str) -> None:
        self.instances[instance].scrapes_failed += 1
        self.metrics.scrape_failures.labels(instance).inc()

    def _on_kv_batch(self, instance: str, counts: dict[str, int], gap: bool) -> None:
        for kind, n in counts.items():
            self.metrics.kv_events.labels(instance, kind).inc(n)
        if gap:
            self.instances[instance].kv_event_gaps += 1
            self.metrics.kv_event_gaps.labels(instance).inc()

    def _set_health(self, instance: str, healthy: bool) -> None:
        state = self.instances[instance]
        if state.healthy == healthy:
            return
        state.healthy = healthy
        log.warning("engine %s is %s", instance, "healthy again" if healthy else "unhealthy; probing /health")
        self.observe(InstanceHealthChanged(instance, healthy, self.clock()))
        if healthy:
            self._held.wake_all()
        elif instance not in self._probes:
            self._probes[instance] = asyncio.create_task(self._probe(instance), name=f"probe {instance}")

    async def _probe(self, instance: str) -> None:
        try:
            while True:
                await asyncio.sleep(self.config.probe_interval_s)
                try:
                    status, _, _ = await self._upstream.get(instance, "/health", self.config.probe_interval_s * 2)
                except _FAILED_ENGINE_ERRORS:
                    continue
                if status == 200:
                    break
        finally:
            self._probes.pop(instance, None)
        self._set_health(instance, True)

    async def _sweep_idle_sessions(self) -> None:
        timeout_s = self.config.session_forget_idle_s
        while True:
            await asyncio.sleep(min(timeout_s / 4, 5.0))
            now = self.clock()
            idle = [sid for sid, s in self._sessions.items() if s.in_flight == 0 and now - s.last_active_s > timeout_s]
            for sid in idle:
                del self._sessions[sid]
                self.observe(SessionEnded(sid, now, reason="idle_timeout"))

    # ------------------------------------------------------------------ requests

    def _request_from(self, http: web.BaseRequest, body: dict, prompt) -> Request:
        h = http.headers
        request_id = f"req-{next(self._ids)}"
        given_session = (h.get("X-Session-Id") or "").strip()  # an empty header is no session id
        session_id = given_session or request_id
        if not given_session:
            self.metrics.without_session_id.labels(http.path).inc()  # a path of ROUTES: bounded labels
        cls = h.get("X-Workload-Class")
        if cls not in self._known_classes:
            self.metrics.unknown_class.inc()
            cls = DEFAULT_CLASS
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        return Request(
            request_id=request_id,
            session_id=session_id,
            workload_class=cls,
            group_id=h.get("X-Group-Id") or None,
            unit_id=h.get("X-Rollout-Unit") or session_id,
            # A request without a session id is its own one-turn session.
            session_end=h.get("X-Session-End", "").strip().lower() in ("1", "true", "yes") or not given_session,
            prompt_tokens=prompt.prompt_tokens,
            block_hashes=prompt.block_hashes,
            prompt_text=prompt.prompt_text,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            arrival_s=self.clock(),
        )

    async def _completions(self, http: web.BaseRequest) -> web.StreamResponse:
        return await self._generate(http, "completions", "/v1/completions")

    async def _chat(self, http: web.BaseRequest) -> web.StreamResponse:
        return await self._generate(http, "chat", "/v1/chat/completions")

    async def _read_body(self, http: web.BaseRequest, endpoint: Endpoint) -> tuple[bytes, dict]:
        """The raw body and its decoded JSON object, with the fields the router reads checked.

        Raises:
            BadRequestError: 400 for a body that is not a UTF-8 JSON object, nests too deeply,
                lacks ``model`` and ``messages``/``prompt``, or gives a field the router reads
                (``model``, ``stream``, ``max_tokens``, ``max_completion_tokens``) the wrong
                type. ``messages``/``prompt`` are checked by the tokenizer (``PromptError``).
        """
        raw = await http.read()
        body = decode_json_object(raw)
        required = ("model", "messages") if endpoint == "chat" else ("model", "prompt")
        missing = [k for k in required if k not in body]
        if missing:
            raise BadRequestError(400, f"missing required field(s) {', '.join(missing)} in the request body", "missing_field")
        check_field_types(body)
        return raw, body

    async def _generate(self, http: web.BaseRequest, endpoint: Endpoint, path: str) -> web.StreamResponse:
        raw, body = await self._read_body(http, endpoint)
        try:
            if self.tokenizer.needs_thread:
                prompt = await asyncio.get_running_loop().run_in_executor(
                    self._pool, self.tokenizer.prompt_info, body, endpoint
                )
            else:
                prompt = self.tokenizer.prompt_info(body, endpoint)
        except PromptError as exc:
            raise BadRequestError(400, str(exc), "invalid_prompt") from None
        request = self._request_from(http, body, prompt)
        session = self._sessions.setdefault(request.session_id, _Session())
        session.in_flight += 1
        session.last_active_s = request.arrival_s
        session.ending |= request.session_end
        headers = [(k, v) for k, v in http.raw_headers if k.lower() not in _HOP_HEADERS_RAW]
        streaming = body.get("stream") is True
        try:
            return await self._place_and_forward(http, request, path, raw, headers, streaming)
        finally:
            session.in_flight -= 1
            session.last_active_s = self.clock()
            if session.in_flight == 0 and session.ending and self._sessions.get(request.session_id) is session:
                del self._sessions[request.session_id]
                self.observe(SessionEnded(request.session_id, self.clock()))

    async def _admit(self, request: Request) -> str:
        """decide() until Admit; returns the instance. Held requests wait here."""
        held_since: float | None = None
        no_engine_since: float | None = None
        cls = request.workload_class
        try:
            while True:
                now = self.clock()
                view = ClusterView(tuple(s.view(now) for s in self.instances.values()))
                t0 = time.perf_counter()
                try:
                    decision = self.policy.decide(request, view, now)
                except Exception:  # a policy bug: counted, then answered 500 (router/policy_errors.py)
                    self.policy_errors.decide_failed(request.request_id, log_it=False)  # the 500 path logs it
                    raise
                self.metrics.decision_latency_s.observe(time.perf_counter() - t0)
                if isinstance(decision, Admit):
                    self.metrics.admit_decisions.inc()
                    if decision.instance not in self.instances:
                        raise RuntimeError(f"policy admitted on unknown instance {decision.instance!r}")
                    return decision.instance
                self.metrics.hold_decisions.inc()
                if not view.healthy():
                    # A hold waits for capacity, not for engines that may never come back:
                    # past the bound the client gets a 503 instead of an open connection.
                    no_engine_since = now if no_engine_since is None else no_engine_since
                    if now - no_engine_since > self.config.no_engine_timeout_s:
                        raise _NoHealthyEngine(
                            f"no engine has been healthy for {now - no_engine_since:.0f} s "
                            f"(engines.no_engine_timeout_s={self.config.no_engine_timeout_s:g}); "
                            "check the engines' logs and /health")
                else:
                    no_engine_since = None
                if held_since is None:
                    held_since = now
                    self._held_now += 1
                    self.scraper.wake()
                    self.metrics.holds.labels(cls).inc()
                    self.metrics.held_now.labels(cls).inc()
                await self._held.wait(request.arrival_s, decision.recheck_after_s)
        finally:
            if held_since is not None:
                self._held_now -= 1
                self.metrics.held_now.labels(cls).dec()
                self.metrics.observe_hold_end(cls, self.clock() - held_since)

    async def _place_and_forward(
        self, http: web.BaseRequest, request: Request, path: str, raw: bytes, headers: list[tuple[bytes, bytes]],
        streaming: bool,
    ) -> web.StreamResponse:
        failures = 0
        while True:
            try:
                instance = await self._admit(request)
            except asyncio.CancelledError:  # the client went away while held
                self.observe(RequestFinished(request, "", self.clock(), ok=False))
                raise
            except _NoHealthyEngine as exc:
                self.observe(RequestFinished(request, "", self.clock(), ok=False))
                return error_response(503, str(exc), "no_healthy_engine")
            try:
                return await self._forward(http, request, instance, path, raw, headers, streaming)
            except _EngineFailed as exc:
                failures += 1
                self._engine_failed(instance, request, str(exc))
                if failures > self.config.max_retries:
                    return error_response(
                        502, f"engines failed {failures} times for this request; last: {instance}: {exc}", "engine_failed"
                    )
                self.metrics.retries.inc()

    async def _forward(
        self, http: web.BaseRequest, request: Request, instance: str, path: str, raw: bytes,
        headers: list[tuple[bytes, bytes]], streaming: bool,
    ) -> web.StreamResponse:
        """Send ``raw`` to ``instance`` and relay the answer; reports the lifecycle events.

        Bookkeeping stays off the request's latency where it can: ``RequestStarted`` is
        observed once the request is on its way to the engine, and ``RequestFinished``
        (and the session's end, in ``_generate``) once the client has the whole answer.

        Raises:
            _EngineFailed: the engine failed before any byte reached the client.
        """
        state = self.instances[instance]
        state.in_flight += 1
        self.scraper.wake()
        usage: dict = {}
        outcome = "error"
        try:
            upstream: UpstreamResponse | None = None
            try:
                try:
                    pending = await self._upstream.send(instance, "POST", path, headers, raw)
                finally:  # the engine works while the policy takes the event
                    self.observe(RequestStarted(request, instance, self.clock()))
                upstream = await pending.response()
                if upstream.status in _RETRYABLE_STATUS:
                    raise _EngineFailed(f"HTTP {upstream.status}")
                if streaming and upstream.status == 200:
                    response, usage, outcome = await self._relay_stream(http, upstream)
                    if outcome == "engine_broke":
                        self._engine_failed(instance, request, "stream broke after streaming began")
                    return response
                payload = await upstream.read()
            except _FAILED_ENGINE_ERRORS as exc:
                raise _EngineFailed(f"{type(exc).__name__}: {exc}") from None
            finally:
                if upstream is not None:
                    upstream.release()
            if upstream.status == 200:
                usage = _usage_of_json(payload)
                outcome = "ok"
            response = web.Response(body=payload, status=upstream.status, headers=_reply_headers(upstream.headers))
            try:
                await response.prepare(http)
                await response.write_eof()
            except ConnectionError:  # the client went away as the answer was written
                outcome = "client_gone"
            return response
        except asyncio.CancelledError:
            outcome = "client_gone"
            raise
        finally:
            state.in_flight -= 1
            self.metrics.count_request(instance, outcome)
            self.observe(
                RequestFinished(
                    request, instance, self.clock(),
                    prompt_tokens=usage.get("prompt_tokens") or request.prompt_tokens,
                    completion_tokens=usage.get("completion_tokens") or 0,
                    cached_tokens=usage.get("cached_tokens"),
                    ok=outcome == "ok",
                )
            )
            self._held.wake(self.config.wake_per_finish)

    def _engine_failed(self, instance: str, request: Request, why: str) -> None:
        self.metrics.engine_failures.labels(instance).inc()
        log.warning("engine %s failed %s (%s)", instance, request.request_id, why)
        self._set_health(instance, False)

    async def _relay_stream(
        self, http: web.BaseRequest, upstream: UpstreamResponse
    ) -> tuple[web.StreamResponse, dict, str]:
        """Relay an SSE stream chunk by chunk; returns (response, usage, outcome).

        ``outcome`` is ``ok``, ``client_gone`` or ``engine_broke`` (after the first byte;
        the client then gets a final ``data: {"error": ...}`` event). Usage comes from the
        stream's usage chunk when the client asked for one
        (``stream_options.include_usage``), else completion tokens = data events counted.

        Raises:
            _EngineFailed: the engine failed before the first byte (retryable).
        """
        response = web.StreamResponse(status=upstream.status, headers=_reply_headers(upstream.headers))
        data_events = 0
        tail = b""
        outcome = "ok"
        try:
            while True:
                try:
                    chunk = await upstream.readany()
                except _FAILED_ENGINE_ERRORS as exc:
                    if not response.prepared:
                        raise _EngineFailed(f"{type(exc).__name__}: {exc}") from None
                    err = error_body(502, f"engine failed mid-stream: {exc}")
                    await response.write(b"data: " + msgspec.json.encode(err) + b"\n\n")
                    outcome = "engine_broke"
                    break
                if not chunk:
                    break
                if not response.prepared:
                    await response.prepare(http)
                await response.write(chunk)
                data_events += chunk.count(b"data: ")
                tail = (tail + chunk)[-16384:]
            if not response.prepared:
                await response.prepare(http)
            await response.write_eof()
        except ConnectionError:  # writing to a client that went away
            return response, {}, "client_gone"
        usage = _usage_of_sse_tail(tail)
        if not usage:
            usage = {"completion_tokens": max(0, data_events - (1 if b"[DONE]" in tail else 0))}
        return response, usage, outcome

    # ------------------------------------------------------------------ other routes

    async def _models(self, http: web.BaseRequest) -> web.Response:
        last = "no healthy engine"
        for state in self.instances.values():
            if not state.healthy:
                continue
            try:
                status, headers, body = await self._upstream.get(state.url, "/v1/models")
                return web.Response(body=body, status=status, headers=_reply_headers(headers))
            except _FAILED_ENGINE_ERRORS as exc:
                last = f"{state.url}: {type(exc).__name__}: {exc}"
        return error_response(502, f"could not list models: {last}", "engine_failed")

    async def _health(self, http: web.BaseRequest) -> web.Response:
        healthy = sum(s.healthy for s in self.instances.values())
        return web.json_response(
            {"status": "ok" if healthy else "no healthy engine", "healthy_instances": healthy,
             "instances": len(self.instances)}, status=200 if healthy else 503)

    async def _metrics(self, http: web.BaseRequest) -> web.Response:
        now = self.clock()
        for state in self.instances.values():
            self.metrics.instance_healthy.labels(state.url).set(1 if state.healthy else 0)
            self.metrics.in_flight.labels(state.url).set(state.in_flight)
            if state.metrics_at_s is not None:
                self.metrics.signal_age_s.labels(state.url).set(now - state.metrics_at_s)
        self.metrics.refresh_from_policy_state(self.policy.state())
        return web.Response(body=self.metrics.exposition(), content_type="text/plain", charset="utf-8")

    def state(self) -> dict:
        """JSON snapshot for ``/state``: the policy's state plus each instance's health and signal ages."""
        now = self.clock()
        instances = []
        for s in self.instances.values():
            kv_at = self.kv_events.last_event_s.get(s.url)
            instances.append({
                "instance": s.url,
                "healthy": s.healthy,
                "in_flight": s.in_flight,
                "metrics_age_s": None if s.metrics_at_s is None else now - s.metrics_at_s,
                "scrapes_failed": s.scrapes_failed,
                "kv_event_age_s": None if kv_at is None else now - kv_at,
                "kv_event_gaps": s.kv_event_gaps,
                "kv_mapped_blocks": self.translator.mapped_blocks(s.url),
                "metrics": None if s.metrics is None else asdict(s.metrics),
            })
        return {
            "policy": self.policy.state(),
            "instances": instances,
            "block_size": self.block_size,
            "held_requests": self._held_now,
            "open_sessions": len(self._sessions),
        }

    async def _state(self, http: web.BaseRequest) -> web.Response:
        return web.json_response(self.state())

    async def _reset_prefix_index(self, http: web.BaseRequest) -> web.Response:
        raw = await http.read()
        body = decode_json_object(raw) if raw.strip() else {}
        target = body.get("instance")
        if target is not None and not isinstance(target, str):
            raise BadRequestError(400, f"'instance' must be an engine URL string or null, got {json_type(target)}",
                              "invalid_type")
        if target is None:
            targets = list(self.instances)
        else:
            target = str(target).rstrip("/")
            if target not in self.instances:
                raise BadRequestError(404, f"unknown instance {target!r}; known: {', '.join(self.instances)}", "unknown_instance")
            targets = [target]
        now = self.clock()
        for instance in targets:
            self.translator.clear(instance)
            self.observe(AllBlocksCleared(instance, now))
        return web.json_response({"cleared": targets})


def _reply_headers(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """An engine's answer headers to pass on: hop-by-hop ones and the encoding dropped
    (the server sets its own framing; bodies pass through as received)."""
    return [(k, v) for k, v in pairs if k.lower() not in _HOP_HEADERS and k.lower() != "content-encoding"]


def _usage_fields(usage: Any) -> dict:
    if not isinstance(usage, dict):
        return {}
    out = {k: usage[k] for k in ("prompt_tokens", "completion_tokens") if isinstance(usage.get(k), int)}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out["cached_tokens"] = details["cached_tokens"]
    return out


class _Answer(msgspec.Struct):
    """The one field of an OpenAI answer the router reads; msgspec skips the rest without
    building it (an agent turn's answer carries token ids and logprobs, megabytes at 128K)."""

    usage: Any = None


_ANSWER_DECODER = msgspec.json.Decoder(_Answer)


def _usage_of_json(payload: bytes) -> dict:
    """``usage`` of a non-streamed OpenAI answer ({} when absent or unparsable)."""
    try:
        return _usage_fields(_ANSWER_DECODER.decode(payload).usage)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}


def _usage_of_sse_tail(tail: bytes) -> dict:
    """``usage`` of the last SSE data event that carries one ({} when none)."""
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                doc = msgspec.json.decode(line[6:])
            except msgspec.DecodeError:
                continue
            usage = _usage_fields(doc.get("usage")) if isinstance(doc, dict) else {}
            if usage:
                return usage
    return {}


def build_service(cfg: Any) -> RouterService:
    """Build a :class:`RouterService` from the composed ``router_service`` config.

    Reads ``cfg.router`` (``impl``, ``policy``, ``params``), ``cfg.engines``,
    ``cfg.model.path``, ``cfg.signals``, ``cfg.server``, ``cfg.sessions``.

    Raises:
        RouterConfigError: ``router.impl`` is not ``ours``, an unknown policy or option,
            no engines, or a bad transport option; the message says what to change.
    """
    from omegaconf import OmegaConf

    from router.policies import make_policy

    if cfg.router.impl != "ours":
        raise RouterConfigError(
            f"router.impl={cfg.router.impl!r} is run by router.launch.start_router (the vllm-router program), "
            "not by python -m router; choose a router with impl: ours (misa-t, misa, session-admission, "
            "cache-aware, round-robin)"
        )
    params = OmegaConf.to_container(cfg.router.params, resolve=True) if cfg.router.params is not None else {}
    config = ServiceConfig(
        workload_classes=tuple(cfg.sessions.workload_classes),
        **{name: OmegaConf.select(cfg, path, throw_on_missing=True) for name, path in SERVICE_OPTIONS.items()},
    )
    # server.long_hold_s is one knob: the policy's long holds (state) and router_long_holds_total
    policy = make_policy(cfg.router.policy, params, long_hold_s=config.long_hold_s)
    tokenizer = PromptTokenizer(cfg.model.path)
    return RouterService(
        policy,
        cfg.engines.urls,  # checked as a list there: a plain string is refused, not split into characters
        kv_event_endpoints=cfg.engines.kv_event_endpoints if cfg.engines.kv_event_endpoints is not None else [],
        tokenizer=tokenizer,
        config=config,
        block_size=cfg.engines.block_size,
    )
