"""``python -m router``: run the live router (config ``recipes/router_service.yaml``).

Examples::

    python -m router engines.urls=[http://127.0.0.1:8001,http://127.0.0.1:8002]
    python -m router router=round-robin server.port=9000 engines.urls=[...]
    python -m router --cfg job          # the resolved config
    python -m router --help

The command line goes through ``common.config.hydra_entry`` like every entry point: a
mistake ends with one ``error:`` line saying what was wrong and what is valid, no
traceback, exit code 2: an unknown key, ``router=`` choice or policy option, a bad value
(a malformed engine URL, a port out of range, an option the policy rejects), an address
that cannot be served on (a port in use: refused before any engine is contacted).
Ctrl-C exits 130, SIGTERM 143.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from omegaconf import DictConfig

from common.config import hydra_entry
from router.policies.base import RouterConfigError
from router.service_config import SERVICE_OPTIONS  # noqa: F401 - registers the renamed keys before compose

CONFIG_NAME = "router_service"

log = logging.getLogger("router")


async def serve(cfg: DictConfig) -> int:
    """Run the router until SIGINT/SIGTERM; returns that signal's number once the service
    has stopped.

    Raises:
        RouterConfigError: a bad option (see ``router.server.build_service``).
        ConfigError: an address that cannot be served on (``common.process.listening_socket``).
    """
    from router.server import build_service

    port = cfg.server.port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise RouterConfigError(f"server.port must be a TCP port number (0 = any free one), got {port!r}")
    service = build_service(cfg)
    url = await service.start(cfg.server.host, port)  # an address in use: ConfigError, exit 2
    log.info("router (policy %s) serving on %s for %s", service.policy.name, url, ", ".join(service.instances))
    stop = asyncio.Event()
    got: list[int] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda sig=sig: (got.append(sig), stop.set()))
    await stop.wait()
    log.info("router stopping")
    await service.stop()
    return got[0]


@hydra_entry(CONFIG_NAME)
def main(cfg: DictConfig) -> None:
    """Run the router with the composed config ``cfg`` until SIGINT/SIGTERM; then exit as
    every command does (``common.config``): 130 for Ctrl-C, 143 for SIGTERM."""
    logging.getLogger().setLevel(str(cfg.server.log_level).upper())
    try:
        import uvloop  # libuv event loop: lower per-request latency than asyncio's default loop

        run = uvloop.run
    except ImportError:
        log.info("uvloop not installed: using the default asyncio event loop")
        run = asyncio.run
    if run(serve(cfg)) == signal.SIGINT:
        raise KeyboardInterrupt  # hydra_entry: one "stopped (Ctrl-C)" line, exit 130
    raise SystemExit(143)  # SIGTERM (hydra_entry prints the line for 143)


if __name__ == "__main__":
    main()
