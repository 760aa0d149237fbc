"""A byte-for-byte TCP relay: the floor of one extra proxy process on this machine.

``bench.router_proxy`` runs it as a target beside the routers: it forwards every byte
between the client and the engine without parsing HTTP or deciding anything, on the same
event loop (uvloop) as our router. Its added latency is what one more process hop costs
here (two more socket round trips and process wake-ups per request), which no HTTP router,
Rust or Python, can go below.

    python -m bench.tcp_relay --port 9100 --target 127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio


class _Pipe(asyncio.Protocol):
    """One direction's receiving end: writes what it receives to ``peer``'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.pending: list[bytes] = []  # bytes received before the peer connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def relay(port: int, host: str, target_port: int) -> None:
    """Accept on 127.0.0.1:``port`` and pipe each connection to ``host:target_port`` until cancelled."""
    loop = asyncio.get_running_loop()

    def accept() -> _Pipe:
        client = _Pipe()

        async def connect() -> None:
            try:
                _, upstream = await loop.create_connection(_Pipe, host, target_port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            upstream.peer, client.peer = client, upstream
            for data in client.pending:
                upstream.transport.write(data)
            client.pending.clear()

        loop.create_task(connect())
        return client

    server = await loop.create_server(accept, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tcp_relay", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--target", required=True, help="host:port to forward to")
    args = parser.parse_args()
    host, _, target_port = args.target.rpartition(":")
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(relay(args.port, host, int(target_port)))


if __name__ == "__main__":
    main()
