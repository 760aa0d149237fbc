"""The router's HTTP/1.1 client to its engines: pooled keep-alive connections, lean.

Every generation request the router forwards costs one upstream exchange. With aiohttp's
client that exchange added about 0.4 ms to each request at concurrency 1 on this
project's 2-core CI machine (request and response objects, timers, cookie and redirect
logic a proxy does not use), a third of what the router added in ``bench.router_proxy``.
This client does only what a proxy needs:

- one ``asyncio.Protocol`` per connection; answers parsed by ``httptools`` (llhttp, the
  parser of Node.js and uvicorn): status, headers (at most ``MAX_HEAD_BYTES``),
  ``Content-Length`` or chunked bodies (trailers dropped), or a body delimited by the
  connection's end;
- requests written in one ``transport.write`` from the client's raw header pairs
  (``Host`` and ``Content-Length`` set here), the body as given; an engine URL's path is
  a prefix of every request path and its ``user:password@`` becomes HTTP Basic
  ``Authorization``;
- idle keep-alive connections kept per engine and reused. A reused connection that the
  engine closed (or answered 408) before answering, because its keep-alive timer ran out
  while the request was on its way, is retried once on a fresh connection, so an
  idle-timeout race never counts as an engine failure. Bytes the engine sends that no
  request asked for (on an idle connection, or after a complete answer) close the
  connection and are never passed to a client;
- a connect timeout, and a read timeout that bounds each silence while waiting for the
  answer (the same meaning as aiohttp's ``sock_read``);
- flow control while relaying a stream: reading from the engine pauses while more than
  ``HIGH_WATER_BYTES`` wait for a slow client (``readany``); ``read`` takes whole bodies.

Everything that goes wrong raises :class:`UpstreamError` (a ``ConnectionError``), which
the router treats as an engine failure.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl as ssl_module
from typing import Iterable
from urllib.parse import unquote, urlsplit

import httptools

HIGH_WATER_BYTES = 256 * 1024
"""Buffered answer bytes above which reading from the engine pauses (streams only)."""

MAX_HEAD_BYTES = 64 * 1024
"""Status line and headers an engine may send before their end must have arrived (bytes,
checked per socket read; vLLM sends about 200)."""

_CLIENT_SET_HEADERS = frozenset({b"host", b"content-length"})
_CLIENT_SET_HEADERS_AUTH = _CLIENT_SET_HEADERS | {b"authorization"}


class UpstreamError(ConnectionError):
    """The engine could not be reached, broke the connection or answered garbage."""


class _Engine:
    """Where one engine listens and its idle connections."""

    __slots__ = ("host", "port", "ssl", "server_hostname", "host_header", "prefix", "authorization", "idle",
                 "max_idle")

    def __init__(self, base_url: str, max_idle: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl_module.create_default_context() if parts.scheme == "https" else None
        self.server_hostname = self.host if self.ssl else None
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
        self.prefix = parts.path.rstrip("/").encode()  # http://gateway/engine-a: paths go under /engine-a
        self.authorization: bytes | None = None  # http://user:password@host: HTTP Basic credentials
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.authorization = b"Basic " + base64.b64encode(credentials)
        self.idle: list[_Connection] = []
        self.max_idle = max_idle


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine; parses one answer at a time."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.in_use = False  # a request was written and its answer not released yet
        self.paused = False
        self._waiter: asyncio.Future | None = None
        self._reset()

    def _reset(self) -> None:
        self.resume()
        self.buffer_all = False  # read(): the caller takes the whole body, no pausing
        self.unsolicited = False  # the engine sent more than one answer: stop parsing, close
        self.head_bytes = 0
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.error: UpstreamError | None = None
        self.framed = False  # Content-Length or chunked: the end is in the bytes, not the close

    def resume(self) -> None:
        """Read from the engine again if reading was paused for a slow client."""
        if self.paused and not self.lost:
            self.transport.resume_reading()  # type: ignore[union-attr]
        self.paused = False

    def take_body(self) -> bytes:
        """The body bytes buffered so far (emptied)."""
        data = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks.clear()
        self.buffered = 0
        return data

    def send(self, data: bytes) -> None:
        """Write one whole request; its answer is this connection's until released."""
        self.in_use = True
        self.transport.write(data)  # type: ignore[union-attr]

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.in_use or self.unsolicited:  # bytes nobody asked for: the connection is not to be trusted
            self.unsolicited = True
            self.transport.close()  # type: ignore[union-attr]
            return
        self.got_bytes = True
        if not self.headers_done:
            if self.head_bytes > MAX_HEAD_BYTES:  # earlier reads held no end of the headers
                self._fail(UpstreamError(f"engine sent more than {MAX_HEAD_BYTES} bytes of status line and headers"))
                self.unsolicited = True
                self.transport.close()  # type: ignore[union-attr]
                return
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(UpstreamError(f"engine sent a malformed HTTP answer: {exc}"))
            self.transport.close()  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self in self.engine.idle:
            self.engine.idle.remove(self)
        if self.headers_done and not self.complete and not self.framed:
            self.on_message_complete()  # a body delimited by the connection's end
        elif not self.complete:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamError(f"engine closed the connection before the answer was complete{why}"))

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request (or bytes after the first): drop the connection
            self.unsolicited = True
            self.transport.close()  # type: ignore[union-attr]

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers_done or self.unsolicited:  # trailers of a chunked body are not headers
            return
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.unsolicited:
            return
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (we never send Expect): skip it
            self.headers = []
            return
        self.framed = any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in self.headers)
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.unsolicited:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER_BYTES and not self.paused and not self.buffer_all and not self.lost:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.unsolicited or (100 <= self.status < 200 and not self.headers_done):
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only valid until the parser moves on
        self._wake()

    # -- waiting
    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    async def wait(self, timeout_s: float) -> None:
        """Wait until the parser made progress (or failed), at most ``timeout_s`` seconds.

        Raises:
            UpstreamError: the wait timed out (the engine was silent too long).
        """
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _time_out, waiter, timeout_s)
        try:
            await waiter
        finally:
            timer.cancel()
            if self._waiter is waiter:
                self._waiter = None


def _time_out(waiter: asyncio.Future, timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamError(f"engine sent nothing for {timeout_s:g} s (engines.request_timeout_s)"))


class UpstreamResponse:
    """An engine's answer: status and headers now, the body as it arrives.

    Attributes:
        status: HTTP status code.
        headers: ``(name, value)`` pairs as sent, decoded as UTF-8 (surrogateescape).

    Read the body with :meth:`read` (all of it) or :meth:`readany` (next bytes, ``b""`` at
    the end), then call :meth:`release` (also when reading failed): a complete answer
    on a keep-alive connection returns the connection to the pool, anything else closes it.
    """

    def __init__(self, conn: _Connection, read_timeout_s: float) -> None:
        self._conn = conn
        self._read_timeout_s = read_timeout_s
        self._released = False
        self.status = conn.status
        self.headers = [(n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                        for n, v in conn.headers]

    async def readany(self) -> bytes:
        """The body bytes received since the last call; ``b""`` once the body is complete.

        Raises:
            UpstreamError: the connection broke, the answer was malformed or the engine was
                silent for longer than the read timeout.
        """
        conn = self._conn
        while not conn.chunks:
            if conn.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._read_timeout_s)
        data = conn.take_body()
        conn.resume()
        return data

    async def read(self) -> bytes:
        """The whole body (waits for its end). Raises UpstreamError like :meth:`readany`."""
        conn = self._conn
        conn.buffer_all = True
        conn.resume()
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._read_timeout_s)
        return conn.take_body()

    def release(self) -> None:
        """Give the connection back to the pool if the answer is complete, else close it."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        idle = conn.engine.idle
        conn.in_use = False
        if (conn.complete and not conn.chunks and not conn.lost and not conn.unsolicited and conn.keep_alive
                and len(idle) < conn.engine.max_idle):
            conn._reset()
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()


class PendingRequest:
    """A request written to an engine whose answer has not been read yet."""

    def __init__(self, client: UpstreamClient, conn: _Connection, *, data: bytes, reused: bool) -> None:
        self._client = client
        self._conn = conn
        self._data = data
        self._reused = reused

    async def response(self) -> UpstreamResponse:
        """Wait for the answer's status and headers.

        A reused keep-alive connection that the engine closed before answering, or answered
        with 408 (its idle timer ran out as the request went out), gets the request again
        on a new connection, once.

        Returns:
            The answer; the caller reads its body and calls ``release()``.

        Raises:
            UpstreamError: the connection broke, or the engine was silent past the read
                timeout, before the headers arrived.
        """
        conn = self._conn
        timeout_s = self._client.read_timeout_s
        try:
            while True:
                if conn.headers_done:
                    if not (self._reused and conn.status == 408):
                        break
                elif conn.error is None:
                    await conn.wait(timeout_s)
                    continue
                elif not (self._reused and not conn.got_bytes):
                    raise conn.error
                # The engine closed (or timed out with a 408) the idle connection this
                # request was reusing: send it again, once, on a new connection.
                conn.transport.close()  # type: ignore[union-attr]
                self._reused = False
                conn = self._conn = await self._client._connect(conn.engine)
                conn.send(self._data)
        except BaseException:  # failed, or cancelled (the client went away): the engine's request is dropped
            conn.transport.close()  # type: ignore[union-attr]
            raise
        return UpstreamResponse(conn, timeout_s)

    def abandon(self) -> None:
        """Close the connection without reading the answer (the engine drops the request)."""
        if self._conn.transport is not None:
            self._conn.transport.close()


class UpstreamClient:
    """A pool of keep-alive HTTP/1.1 connections to the engines.

    Args:
        connect_timeout_s: TCP (and TLS) connect timeout, seconds.
        read_timeout_s: longest silence while waiting for an answer's next bytes, seconds.
        max_idle_per_engine: idle connections kept per engine; more are closed.
    """

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, max_idle_per_engine: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_engine = max_idle_per_engine
        self._engines: dict[str, _Engine] = {}

    async def send(
        self, base_url: str, method: str, path: str, raw_headers: Iterable[tuple[bytes, bytes]], body: bytes = b""
    ) -> PendingRequest:
        """Write one request to the engine (on an idle connection, or a new one) and return.

        The engine starts working while the caller does its bookkeeping; the answer comes
        from ``await pending.response()``.

        Args:
            base_url: the engine, ``http(s)://host[:port]``.
            method: ``GET``, ``POST``, ...
            path: request target, e.g. ``/v1/completions``.
            raw_headers: header pairs to send as they are; ``Host`` and ``Content-Length``
                among them are replaced, hop-by-hop headers are the caller's to drop.
            body: the request body.

        Raises:
            UpstreamError: connecting failed or timed out.
        """
        engine = self._engines.get(base_url)
        if engine is None:
            engine = self._engines[base_url] = _Engine(base_url, self.max_idle_per_engine)
        head = [b"%s %s%s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), engine.prefix, path.encode(),
                                                         engine.host_header)]
        replaced = _CLIENT_SET_HEADERS if engine.authorization is None else _CLIENT_SET_HEADERS_AUTH
        for name, value in raw_headers:
            if name.lower() not in replaced:
                head.append(b"%s: %s\r\n" % (name, value))
        if engine.authorization is not None:
            head.append(b"Authorization: %s\r\n" % engine.authorization)
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        data = b"".join(head) + body
        reused = bool(engine.idle)
        conn = engine.idle.pop() if reused else await self._connect(engine)
        conn.send(data)
        return PendingRequest(self, conn, data=data, reused=reused)

    async def request(
        self, base_url: str, method: str, path: str, raw_headers: Iterable[tuple[bytes, bytes]], body: bytes = b""
    ) -> UpstreamResponse:
        """:meth:`send` and wait for the answer's status and headers (see ``PendingRequest.response``)."""
        return await (await self.send(base_url, method, path, raw_headers, body)).response()

    async def get(
        self, base_url: str, path: str, timeout_s: float | None = None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """GET ``path`` from the engine and read the whole answer: (status, headers, body).

        Args:
            timeout_s: bound on the whole exchange (None: the client's timeouts only).

        Raises:
            UpstreamError: as :meth:`request` and :meth:`UpstreamResponse.read`.
            asyncio.TimeoutError: ``timeout_s`` passed.
        """

        async def exchange() -> tuple[int, list[tuple[str, str]], bytes]:
            response = await self.request(base_url, "GET", path, [])
            try:
                return response.status, response.headers, await response.read()
            finally:
                response.release()

        if timeout_s is None:
            return await exchange()
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # lands in the step where the exchange completes (a probe then outlives its cancel).
        async with asyncio.timeout(timeout_s):
            return await exchange()

    async def _connect(self, engine: _Engine) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            # asyncio.timeout, not wait_for, which on Python 3.11 can swallow the cancellation of a
            # client that left as the connection came up, and the request would be sent anyway.
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(engine), engine.host, engine.port, ssl=engine.ssl,
                    server_hostname=engine.server_hostname,
                )
        except asyncio.TimeoutError:
            raise UpstreamError(f"connecting to {engine.host}:{engine.port} timed out after "
                                f"{self.connect_timeout_s:g} s (engines.connect_timeout_s)") from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {engine.host}:{engine.port}: {exc}") from None
        return conn

    def idle_connections(self, base_url: str) -> int:
        """Idle keep-alive connections held for ``base_url`` (for tests and ``/state``)."""
        engine = self._engines.get(base_url)
        return 0 if engine is None else len(engine.idle)

    def close(self) -> None:
        """Close every idle connection (answers in progress close on their release)."""
        for engine in self._engines.values():
            for conn in list(engine.idle):
                if conn.transport is not None:
                    conn.transport.close()
            engine.idle.clear()
