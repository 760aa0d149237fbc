"""Serve an aiohttp app on a free localhost port for the length of a test."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(app: web.Application, **runner_options) -> AsyncIterator[str]:
    """Yield the base URL (``http://127.0.0.1:<port>``) of ``app``; stop it on exit.

    ``runner_options`` go to ``web.AppRunner`` (e.g. ``keepalive_timeout``).
    """
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()
