"""common.http_client: pooled connections close before the servers' idle timeout."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from common.http_client import CLIENT_KEEPALIVE_S, tcp_connector
from tests.http_app import serving


def test_pooled_connections_close_before_the_engines_idle_timeout():
    from vllm import envs  # the API server's own idle timeout

    assert CLIENT_KEEPALIVE_S < envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE


async def test_the_client_drops_a_connection_idle_past_its_keepalive(monkeypatch):
    """A server that would keep an idle connection for a minute: the client closes its own
    after its keep-alive (0.3 s here), so the request after 1.5 s idle comes on a new one."""
    monkeypatch.setattr("common.http_client.CLIENT_KEEPALIVE_S", 0.3)
    peers = []

    async def ok(request):
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    async with serving(app, keepalive_timeout=60.0) as url:
        async with aiohttp.ClientSession(connector=tcp_connector()) as http:
            for pause in (0.0, 1.5):
                await asyncio.sleep(pause)
                async with http.get(f"{url}/") as r:
                    assert r.status == 200 and await r.text() == "ok"
    assert len(peers) == 2 and peers[0] != peers[1]  # a fresh connection (another client port)
