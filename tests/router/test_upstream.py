"""The router's HTTP/1.1 client to its engines, against small raw-socket test servers.

Each test server is an ``asyncio`` server whose answer bytes the test writes by hand, so
framing (Content-Length, chunked, close-delimited), keep-alive, broken connections and
silence are exactly what the test says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from router.upstream import HIGH_WATER_BYTES, UpstreamClient, UpstreamError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """(head, body) of one request with a Content-Length body; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class RawServer:
    """A TCP server that runs ``handler(reader, writer, connection_number)`` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self._server: asyncio.base_events.Server | None = None
        self.url = ""

    async def __aenter__(self) -> RawServer:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer, self.connections)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._server is not None
        self._server.close()


def serve_forever(answer: Callable[[bytes, bytes], bytes], server_box: list) -> Handler:
    """A keep-alive handler: answers every request on the connection with ``answer(head, body)``."""

    async def handler(reader, writer, n):
        while (req := await _read_request(reader)) is not None:
            server_box[0].requests.append(req)
            writer.write(answer(*req))
            await writer.drain()

    return handler


def answer_once(raw: bytes, close: bool = False) -> Handler:
    """A handler that reads one request and writes ``raw`` as the answer, then closes the
    connection (``close``) or waits for the client to."""

    async def handler(reader, writer, n):
        await _read_request(reader)
        writer.write(raw)
        await writer.drain()
        if not close:
            await reader.read()

    return handler


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra + \
        b"Content-Length: %d\r\n\r\n" % len(body) + body


async def _server(answer: Callable[[bytes, bytes], bytes]) -> RawServer:
    box: list = []
    server = RawServer(serve_forever(answer, box))
    box.append(server)
    return server


async def test_keep_alive_connection_is_reused_and_headers_are_sent_as_given():
    async with await _server(lambda head, body: ok(b'{"echo": %d}' % len(body))) as server:
        client = UpstreamClient(connect_timeout_s=2, read_timeout_s=2)
        for i in range(3):
            r = await client.request(server.url, "POST", "/v1/completions",
                                     [(b"X-Session-Id", b"s1"), (b"Host", b"ignored"), (b"Content-Length", b"999")],
                                     b'{"n": %d}' % i)
            assert (r.status, await r.read()) == (200, b'{"echo": 8}')
            assert ("Content-Type", "application/json") in r.headers
            r.release()
        assert server.connections == 1
        assert client.idle_connections(server.url) == 1
        head, body = server.requests[0]
        assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"X-Session-Id: s1\r\n" in head and b"Content-Length: 8\r\n" in head
        # the caller's Host and Content-Length are replaced (not "999": the port may contain it)
        assert b"ignored" not in head and b"Content-Length: 999" not in head and b"Host: 127.0.0.1:" in head
        assert body == b'{"n": 0}'
        client.close()


async def test_chunked_answer_is_decoded_and_streamed_chunk_by_chunk():
    second = asyncio.Event()

    async def handler(reader, writer, n):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await second.wait()  # the client must see the first chunk before the second exists
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 2)
        r = await client.request(server.url, "POST", "/v1/completions", [], b"{}")
        assert await r.readany() == b"first"
        second.set()
        assert await r.readany() == b"second"
        assert await r.readany() == b""
        r.release()
        assert client.idle_connections(server.url) == 1  # complete and keep-alive: pooled


async def test_answer_delimited_by_the_connection_end_is_complete_and_not_pooled():
    async with RawServer(answer_once(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
                                     close=True)) as server:
        client = UpstreamClient(2, 2)
        r = await client.request(server.url, "GET", "/health", [])
        assert await r.read() == b"all of it"
        r.release()
        assert client.idle_connections(server.url) == 0


async def test_connection_close_answer_is_not_pooled():
    async with await _server(lambda head, body: ok(b"{}", b"Connection: close\r\n")) as server:
        client = UpstreamClient(2, 2)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        await r.read()
        r.release()
        assert client.idle_connections(server.url) == 0


async def test_idle_connection_closed_by_the_engine_is_retried_on_a_new_one():
    async def handler(reader, writer, n):
        if n == 1:  # answers once, then closes as the next request arrives (keep-alive timeout race)
            await _read_request(reader)
            writer.write(ok(b'{"conn": 1}'))
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
            return
        while await _read_request(reader) is not None:
            writer.write(ok(b'{"conn": %d}' % n))
            await writer.drain()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 2)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        assert await r.read() == b'{"conn": 1}'
        r.release()
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        assert await r.read() == b'{"conn": 2}'
        r.release()
        assert server.connections == 2


async def test_fresh_connection_closed_before_an_answer_is_an_error_not_a_retry():
    async def handler(reader, writer, n):
        await reader.readuntil(b"\r\n\r\n")

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 2)
        with pytest.raises(UpstreamError, match="closed the connection"):
            await client.request(server.url, "POST", "/x", [], b"{}")
        assert server.connections == 1


async def test_connection_refused_is_an_upstream_error():
    client = UpstreamClient(2, 2)
    with pytest.raises(UpstreamError, match="cannot connect to 127.0.0.1:9"):
        await client.request("http://127.0.0.1:9", "GET", "/health", [])


async def test_silent_engine_times_out_with_the_option_named():
    async def handler(reader, writer, n):
        await reader.read()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, read_timeout_s=0.2)
        with pytest.raises(UpstreamError, match="request_timeout_s"):
            await client.request(server.url, "POST", "/x", [], b"{}")


async def test_get_reads_the_whole_answer_and_its_bound_covers_the_whole_exchange():
    async with await _server(lambda head, body: ok(b'{"status": "ok"}')) as server:
        client = UpstreamClient(2, 2)
        status, headers, body = await client.get(server.url, "/health")
        assert (status, body, dict(headers)["Content-Type"]) == (200, b'{"status": "ok"}', "application/json")
        assert client.idle_connections(server.url) == 1
    async with RawServer(answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")) as server:
        with pytest.raises(asyncio.TimeoutError):
            await UpstreamClient(2, read_timeout_s=5).get(server.url, "/health", timeout_s=0.2)


async def test_silence_in_the_middle_of_a_body_times_out():
    async with RawServer(answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")) as server:
        client = UpstreamClient(2, read_timeout_s=0.2)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        with pytest.raises(UpstreamError, match="sent nothing for 0.2 s"):
            await r.read()
        r.release()
        assert client.idle_connections(server.url) == 0


async def test_malformed_answer_and_broken_body_are_upstream_errors():
    async with RawServer(answer_once(b"NOT HTTP AT ALL\r\n\r\n")) as server:
        with pytest.raises(UpstreamError, match="malformed"):
            await UpstreamClient(2, 2).request(server.url, "POST", "/x", [], b"{}")

    cut = answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", close=True)
    async with RawServer(cut) as server:
        r = await UpstreamClient(2, 2).request(server.url, "POST", "/x", [], b"{}")
        with pytest.raises(UpstreamError, match="before the answer was complete"):
            await r.read()


async def test_slow_reader_pauses_the_engine_and_gets_every_byte():
    payload = bytes(range(256)) * (16 * HIGH_WATER_BYTES // 256)  # 16x the high-water mark

    async def handler(reader, writer, n):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
        for i in range(0, len(payload), 65536):
            writer.write(payload[i:i + 65536])
            await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 5)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        got = []
        while chunk := await r.readany():
            got.append(chunk)
            await asyncio.sleep(0.02)  # a slow client
        assert b"".join(got) == payload
        # Reading paused above the mark: what waited for the client stayed near it (a
        # socket read or two past it), not the megabytes the engine had ready.
        assert max(map(len, got)) <= 3 * HIGH_WATER_BYTES
        r.release()
        assert client.idle_connections(server.url) == 1


async def test_cancelled_wait_and_unread_answer_close_the_connection():
    async def handler(reader, writer, n):
        await _read_request(reader)
        if n == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
            await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 5)
        task = asyncio.create_task(client.request(server.url, "POST", "/x", [], b"{}"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        r.release()  # the body was not read to its end
        assert client.idle_connections(server.url) == 0
        assert server.connections == 2


def test_engine_url_must_be_http():
    with pytest.raises(ValueError, match="http"):
        asyncio.run(UpstreamClient(1, 1).request("ftp://x", "GET", "/", []))


async def test_whole_body_far_over_the_high_water_mark_is_read_and_the_connection_reused():
    big = b"x" * (8 * HIGH_WATER_BYTES)  # a long agent turn with logprobs, non-streamed
    async with await _server(lambda head, body: ok(big)) as server:
        client = UpstreamClient(2, read_timeout_s=1)
        for _ in range(2):  # the second request runs on the pooled connection
            r = await client.request(server.url, "POST", "/x", [], b"{}")
            await asyncio.sleep(0.05)  # the whole answer arrives before anyone reads it
            assert await r.read() == big
            r.release()
        assert server.connections == 1 and client.idle_connections(server.url) == 1


@pytest.mark.parametrize("when", ["same_packet", "later", "while_idle"])
async def test_bytes_no_request_asked_for_are_never_served(when):
    smuggled = ok(b'{"smuggled": 1}')

    async def handler(reader, writer, n):
        while await _read_request(reader) is not None:
            answer = ok(b'{"conn": %d}' % n)
            if n == 1 and when == "same_packet":
                answer += smuggled
            writer.write(answer)
            await writer.drain()
            if n == 1 and when in ("later", "while_idle"):
                await asyncio.sleep(0.05 if when == "later" else 0.2)
                writer.write(smuggled)
                await writer.drain()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 2)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        assert dict(r.headers)["Content-Length"] == "11"
        if when == "later":
            await asyncio.sleep(0.15)
        assert await r.read() == b'{"conn": 1}'
        r.release()
        await asyncio.sleep(0.4)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        assert await r.read() == b'{"conn": 2}'
        r.release()
        assert server.connections == 2


async def test_url_prefix_and_credentials_reach_the_engine():
    async with await _server(lambda head, body: ok(b"{}")) as server:
        base = server.url.replace("http://", "http://ops:s%40cret@") + "/engine-a/"
        client = UpstreamClient(2, 2)
        r = await client.request(base, "POST", "/v1/completions", [(b"Authorization", b"Bearer client-token")], b"{}")
        await r.read()
        r.release()
        head = server.requests[0][0]
        assert head.startswith(b"POST /engine-a/v1/completions HTTP/1.1\r\n")
        assert b"Authorization: Basic b3BzOnNAY3JldA==\r\n" in head  # ops:s@cret
        assert b"client-token" not in head and b"ops" not in head.split(b"\r\n")[1]


async def test_oversized_engine_headers_are_refused_and_trailers_are_not_headers():
    async def huge(reader, writer, n):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
        for _ in range(64):
            writer.write(b"a" * 65536)
            await writer.drain()
        await reader.read()

    async with RawServer(huge) as server:
        with pytest.raises(UpstreamError, match="bytes of status line and headers"):
            await UpstreamClient(2, 2).request(server.url, "POST", "/x", [], b"{}")

    trailers = answer_once(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
                           b"2\r\nhi\r\n0\r\nX-Checksum: 42\r\n\r\n")
    async with RawServer(trailers) as server:
        client = UpstreamClient(2, 2)
        r = await client.request(server.url, "POST", "/x", [], b"{}")
        assert await r.read() == b"hi"
        assert "X-Checksum" not in dict(r.headers)
        r.release()
        assert client.idle_connections(server.url) == 1


async def test_408_on_a_reused_connection_is_retried_on_a_new_one():
    async def handler(reader, writer, n):
        await _read_request(reader)
        writer.write(ok(b'{"conn": %d}' % n))
        await writer.drain()
        if n == 1:  # the idle timer fires as the next request arrives
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async with RawServer(handler) as server:
        client = UpstreamClient(2, 2)
        for expected in (b'{"conn": 1}', b'{"conn": 2}'):
            r = await client.request(server.url, "POST", "/x", [], b"{}")
            assert (r.status, await r.read()) == (200, expected)
            r.release()
