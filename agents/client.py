"""Calling the agent server from the trainer or a rollout worker, and launching it.

    with launch_agent_server(run_dir, ["router_url=http://..."]) as (proc, url):
        client = AgentServerClient(url)
        result = await client.run_episode(instance_id="toolz__mut-0001", group_id="g1",
                                          unit_id="u7", policy_version=3)
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import httpx

from common.process import ManagedProcess, free_port


class AgentClientError(RuntimeError):
    """The agent server refused a request (400) or failed; the message is the server's."""


class AgentServerClient:
    """Async client of ``agents.server``.

    Args:
        base_url: the agent server's URL.
        timeout_s: HTTP timeout of a blocking ``run_episode`` call (a whole episode);
            the training job sets it from ``trainer.agent_timeout_s``.

    ``run_episode`` and ``submit`` raise ``AgentClientError`` when the server refused or
    failed, did not answer within ``timeout_s``, or could not be reached (httpx errors are
    turned into this type, so a caller catches one type).
    """

    def __init__(self, base_url: str, timeout_s: float = 3600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.http = httpx.AsyncClient(timeout=timeout_s,
                                      limits=httpx.Limits(max_connections=None))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self.http.post(self.base_url + path, json=body)
        except httpx.TimeoutException as e:
            raise AgentClientError(
                f"agent server {path}: no answer within {self.timeout_s:g} s "
                "(trainer.agent_timeout_s)") from e
        except httpx.HTTPError as e:
            raise AgentClientError(f"agent server {path}: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise AgentClientError(f"agent server {path}: HTTP {resp.status_code}: {resp.text[:1000]}")
        return resp.json()

    async def run_episode(self, **request: Any) -> dict[str, Any]:
        """Run one episode and return its ``EpisodeResult`` dict (see agents/server.py
        for the request fields: instance_id or task, session_id, group_id, unit_id,
        policy_version, router_url, model, sampling, limits)."""
        return await self._post("/v1/episodes/run", request)

    async def submit(self, **request: Any) -> str:
        """Start an episode; returns its id for ``result``."""
        return (await self._post("/v1/episodes", request))["episode_id"]

    async def result(self, episode_id: str, poll_s: float = 30.0) -> dict[str, Any]:
        """Wait for a submitted episode's result (long-polls the server).

        Raises:
            AgentClientError: the episode failed validation or is unknown.
        """
        while True:
            resp = await self.http.get(f"{self.base_url}/v1/episodes/{episode_id}",
                                       params={"wait_s": poll_s})
            if resp.status_code >= 400:
                raise AgentClientError(f"episode {episode_id}: {resp.text[:1000]}")
            body = resp.json()
            if body["state"] == "done":
                if body["error"]:
                    raise AgentClientError(f"episode {episode_id}: {body['error']}")
                return body["result"]
            await asyncio.sleep(0)

    async def tasks(self) -> list[str]:
        """Instance ids the server can run."""
        resp = await self.http.get(self.base_url + "/v1/tasks")
        return resp.json()["instance_ids"]


@contextlib.contextmanager
def launch_agent_server(run_dir: str | Path, overrides: Sequence[str] = (),
                        port: int | None = None, start_timeout_s: float = 120.0
                        ) -> Iterator[tuple[ManagedProcess, str]]:
    """Start ``python -m agents.server`` as a managed child, wait for /health, stop on exit.

    Its start includes one test run per task set in the sandbox (``check_tasks_run``, a
    second or two; more on a loaded machine), hence the generous ``start_timeout_s``.

    Args:
        run_dir: the run folder; the log goes to ``<run_dir>/agent_server.log``.
        overrides: Hydra overrides (``router_url=...``, ``tasks_path=...``).
        port: TCP port, default a free one.

    Yields:
        (the process, its base URL).

    Raises:
        common.process.ProcessStartError: it exited or was not healthy in time.
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ManagedProcess("agent-server", [sys.executable, "-m", "agents.server",
                                           f"port={port}", *overrides],
                          log_path=Path(run_dir) / "agent_server.log", health_url=url + "/health",
                          cwd=Path(__file__).resolve().parent.parent)
    proc.start()
    try:
        proc.wait_healthy(start_timeout_s, poll_s=0.2)
        yield proc, url
    finally:
        proc.stop(grace_s=5.0)
