"""Pooled aiohttp connections to vLLM engines and routers that never meet a closed socket.

vLLM's API server (uvicorn) closes a keep-alive connection after 5 s idle
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``). aiohttp keeps released connections for 15 s by default,
so a request sent on a connection idle for about 5 s can go out as the server closes it and
fail with ``ServerDisconnectedError`` although the engine is well (seen once in
``bench.router_real``'s calibration, which then aborted). Closing idle connections on the
client side first removes the race; the router's own upstream client retries it instead
(``router/upstream.py``).
"""

from __future__ import annotations

import aiohttp

CLIENT_KEEPALIVE_S = 2.0
"""Seconds a released connection stays pooled: well under the servers' 5 s idle timeout."""


def tcp_connector(limit: int = 100) -> aiohttp.TCPConnector:
    """A connector whose pooled connections close after :data:`CLIENT_KEEPALIVE_S` idle.

    Args:
        limit: most connections open at once (0: no limit, as aiohttp takes it).
    """
    return aiohttp.TCPConnector(limit=limit, keepalive_timeout=CLIENT_KEEPALIVE_S)
