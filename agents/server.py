"""The agent server: runs agentic rollout units (episodes) for the trainer over HTTP.

    python -m agents.server router_url=http://127.0.0.1:8000 tasks_path=PATH [port=8100]

Endpoints (JSON):
- ``POST /v1/episodes/run``: run one episode, answer when it is done (one call per unit).
- ``POST /v1/episodes``: submit an episode, answer ``202 {"episode_id"}`` at once;
  ``GET /v1/episodes/{id}?wait_s=30`` long-polls: ``{"state": "queued"|"running"|"done",
  "result": EpisodeResult | null}``; a done result is dropped after it was fetched.
- ``GET /v1/tasks``: the task ids the server can run. ``GET /health``, ``GET /metrics``.

Episode request body: ``instance_id`` (or ``task``: a full SWE-bench task with a
``snapshot`` path), and optional ``session_id`` (default: a new id), ``group_id``,
``unit_id``, ``policy_version``, ``router_url``, ``model`` (the served model name; the
server's default is its ``served_model_name`` key), ``sampling`` (request fields such as
temperature), ``limits`` (``EpisodeLimits`` fields). Up to
``max_concurrent_episodes`` run at once; the rest wait in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from omegaconf import DictConfig, ListConfig, OmegaConf
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agents.chat import ByteTokenizer, ChatFormat, ChatRenderer, HFTokenizer, Tokenizer
from agents.envs.constant_fix import LEVELS as CONSTANT_FIX_LEVELS
from agents.envs.task import Task, TaskError, load_tasks, task_problem
from agents.loop import (DEFAULT_DEMONSTRATIONS, DEFAULT_SYSTEM_PROMPT, TOOL_LISTINGS, Demonstration,
                         EpisodeConfig, EpisodeLimits, EpisodeResult, run_episode)
from rollout.client import ModelClient
from router.headers import SessionHeaders
from agents.toolcall import ToolCallFormat
from common.config import Rule, check_values, compose, hydra_entry, is_text, number, or_null, register_user_error
from common.options import build_options
from common.process import listening_socket
from common.urls import url_problem
from sandbox import IsolationConfig, Limits, SandboxError

log = logging.getLogger("agents.server")

HANDMADE_TASKS = Path(__file__).parent / "envs" / "handmade" / "tasks.jsonl"

BUILTIN_TASK_SETS: dict[str, Path] = {
    "handmade": HANDMADE_TASKS,
    **{f"constant_fix_l{level}": HANDMADE_TASKS.parent / f"constant_fix_l{level}.jsonl"
       for level in CONSTANT_FIX_LEVELS},
}
"""Committed task sets by name (``tasks_path`` / ``extra_tasks_paths`` take a name or a
file): ``handmade`` (two small bugs), ``constant_fix_l1..3`` (``agents.envs.constant_fix``:
one wrong digit, the problem statement giving away less at each level)."""


class AgentServerError(ValueError):
    """Bad agent-server configuration or episode request; the message says what to fix."""


class UnknownAgentServerOption(AgentServerError):
    """An option name the agent server does not know (added with ``+``); ``python -m
    agents.server`` exits 2 for it, as for an unknown config key."""


def task_set_path(spec: str) -> Path:
    """The JSONL file a ``tasks_path`` entry names: a ``BUILTIN_TASK_SETS`` name or a path.

    Raises:
        AgentServerError: neither a known name nor an existing file.
    """
    if spec in BUILTIN_TASK_SETS:
        return BUILTIN_TASK_SETS[spec]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise AgentServerError(f"task set {spec!r} is neither a task file nor a built-in set "
                               f"({', '.join(BUILTIN_TASK_SETS)}); build tasks with "
                               "`python -m agents.envs.build` or give one of those names.")
    return path


def _options(cls, node, where: str):
    """``cls`` built from the config group ``node`` (at key ``where``), keys and types checked.

    Raises:
        UnknownAgentServerOption: a key ``cls`` does not have.
        AgentServerError: a value of the wrong type, or one ``cls`` refuses.
    """
    data = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return build_options(cls, data, where, error=AgentServerError, unknown_error=UnknownAgentServerOption)


TOOL_LISTING_RULE: Rule = (lambda v: v in TOOL_LISTINGS, " or ".join(TOOL_LISTINGS))
"""``episode.tool_listing`` (and ``rl.train``'s ``agents.tool_listing``): one of ``TOOL_LISTINGS``."""

DEMONSTRATIONS_RULE: Rule = (or_null(lambda v: isinstance(v, list)),
                             "a list of {problem_statement, tool, arguments}, [] for none, or null for the default")


def episode_config(cfg: DictConfig) -> EpisodeConfig:
    """Build the fixed per-episode settings from the server's Hydra config.

    Raises:
        UnknownAgentServerOption: an unknown key in a limits or tool-format group.
        AgentServerError: a value of the wrong type there, a tool listing not in
            ``TOOL_LISTINGS``, or a demonstration that ``demonstrations`` refuses.
    """
    sb = cfg.sandbox
    isolation = IsolationConfig(bwrap=sb.bwrap, unsafe_no_isolation=sb.unsafe_no_isolation,
                                tmp_size_bytes=sb.tmp_size_bytes, uid_base=sb.uid_base)
    tool_format = _options(ToolCallFormat, cfg.tool_format, "tool_format")
    listing = cfg.episode.tool_listing
    if not TOOL_LISTING_RULE[0](listing):
        raise AgentServerError(f"episode.tool_listing={listing!r} is invalid: give {TOOL_LISTING_RULE[1]}")
    return EpisodeConfig(
        limits=_options(EpisodeLimits, cfg.episode.limits, "episode.limits"),
        command_limits=_options(Limits, cfg.episode.command_limits, "episode.command_limits"),
        test_limits=_options(Limits, cfg.episode.test_limits, "episode.test_limits"),
        isolation=isolation, tool_format=tool_format,
        system_prompt=cfg.episode.system_prompt or DEFAULT_SYSTEM_PROMPT,
        demonstrations=demonstrations(cfg.episode.get("demonstrations"), tool_format),
        tool_listing=listing,
        max_observation_chars=cfg.episode.max_observation_chars,
        workspace_root=sb.workspace_root,
        close_session_with_request=cfg.episode.close_session_with_request,
    )


def demonstrations(node: Any, fmt: ToolCallFormat) -> tuple[Demonstration, ...]:
    """``episode.demonstrations``: null gives ``agents.loop.DEFAULT_DEMONSTRATIONS``, ``[]``
    none, else a list of ``{problem_statement, tool, arguments}`` (each an
    ``agents.loop.Demonstration``).

    Raises:
        AgentServerError: no list, an entry that is no such mapping, or one whose call is
            not a valid tool call (unknown tool, missing or unexpected argument); names the entry.
    """
    if node is None:
        return DEFAULT_DEMONSTRATIONS
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
    if not isinstance(data, list):
        raise AgentServerError(f"episode.demonstrations={data!r} is invalid: give {DEMONSTRATIONS_RULE[1]}")
    shown = []
    keys = {"problem_statement", "tool", "arguments"}
    for i, entry in enumerate(data):
        where = f"episode.demonstrations[{i}]"
        if (not isinstance(entry, dict) or set(entry) != keys or not isinstance(entry["problem_statement"], str)
                or not isinstance(entry["arguments"], dict)):
            raise AgentServerError(f"{where}: give {{problem_statement: <text>, tool: <name>, "
                                   f"arguments: {{...}}}} (got {entry!r})")
        demo = Demonstration(entry["problem_statement"], str(entry["tool"]), entry["arguments"])
        try:
            demo.check(fmt)
        except ValueError as e:
            raise AgentServerError(f"{where}: {e}") from None
        shown.append(demo)
    return tuple(shown)


def check_tasks_run(cfg: DictConfig, task_sets: list[tuple[str, dict[str, Task]]]) -> None:
    """Refuse to serve where the sandbox cannot reward a task: the first task of each task set
    (``task_sets``, as :func:`load_task_set_files` read them) has its tests run on its
    unchanged snapshot in the episodes' sandbox (:func:`agents.envs.task.task_problem`; a
    second or two per set).

    Without this a sandbox that cannot start the tests (measured: a virtual environment
    reached through a symbolic link left ``python`` off the sandbox's PATH) scores every
    episode 0, and training goes on with agent rewards that say nothing.

    Raises:
        AgentServerError: a checked task's tests do not run (the message names the task, the
            tests, the command's exit status and output) or the sandbox cannot start.
    """
    ep = episode_config(cfg)

    async def problems() -> tuple[str, str] | None:
        for spec, tasks in task_sets:
            first = next(iter(tasks.values()), None)
            if first is None:
                continue
            try:
                problem = await task_problem(first, isolation=ep.isolation, limits=ep.test_limits,
                                             root=ep.workspace_root)
            except SandboxError as e:
                problem = f"task {first.instance_id}: the sandbox cannot start: {e}"
            if problem:
                return spec, problem
        return None

    found = asyncio.run(problems())
    if found:
        raise AgentServerError(f"task set {found[0]}: {found[1]}. No agent episode could earn a reward; "
                               "fix this before serving (the sandbox options under sandbox.*, or the task set).")


def load_task_set_files(cfg: DictConfig) -> list[tuple[str, dict[str, Task]]]:
    """Each task set of ``cfg.tasks_path`` and ``cfg.extra_tasks_paths``, in order, as
    (its name or path, its tasks by id).

    Raises:
        AgentServerError: an unknown set name or a missing file (``task_set_path``).
        TaskError: a file that is not valid task JSONL.
    """
    return [(str(path), load_tasks(task_set_path(str(path))))
            for path in [cfg.tasks_path, *(cfg.extra_tasks_paths or [])] if path is not None]


def load_task_sets(cfg: DictConfig) -> dict[str, Task]:
    """The tasks of ``cfg.tasks_path`` and ``cfg.extra_tasks_paths`` by id (a later set's task
    replaces an earlier one of the same id).

    Raises:
        AgentServerError: an unknown set name or a missing file (``task_set_path``).
        TaskError: a file that is not valid task JSONL.
    """
    return merged_task_sets(load_task_set_files(cfg))


def merged_task_sets(task_sets: list[tuple[str, dict[str, Task]]]) -> dict[str, Task]:
    """The tasks of ``task_sets`` by id, a later set's replacing an earlier one's of the same id."""
    tasks: dict[str, Task] = {}
    for _, one in task_sets:
        tasks.update(one)
    return tasks


class AgentService:
    """Episode bookkeeping behind the HTTP handlers (one per server process).

    Args:
        cfg: the ``agent_server`` Hydra config.
        tasks: the task sets, already loaded (``load_task_sets``); None: loaded here.
    """

    def __init__(self, cfg: DictConfig, tasks: dict[str, Task] | None = None) -> None:
        self.cfg = cfg
        self.episode_cfg = episode_config(cfg)
        self.tasks: dict[str, Task] = load_task_sets(cfg) if tasks is None else tasks
        self.chat_format = _options(ChatFormat, cfg.chat_format, "chat_format")
        self._renderers: dict[str, ChatRenderer] = {}
        self._renderer_lock = asyncio.Lock()
        self._models: dict[str, str] = {}
        self._sem = asyncio.Semaphore(cfg.max_concurrent_episodes)
        self.http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None,
                                                          max_keepalive_connections=256))
        self.episodes: dict[str, dict[str, Any]] = {}
        reg = self.registry = CollectorRegistry()
        self.m_running = Gauge("agent_episodes_running", "episodes in their loop", registry=reg)
        self.m_queued = Gauge("agent_episodes_queued", "episodes waiting for a slot", registry=reg)
        self.m_done = Counter("agent_episodes_total", "finished episodes", ["status"], registry=reg)
        self.m_reward = Counter("agent_episode_reward_total", "sum of rewards", registry=reg)
        self.m_wall = Histogram("agent_episode_seconds", "episode wall time", registry=reg,
                                buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800))

    async def close(self) -> None:
        await self.http.aclose()

    # ------------------------------------------------------------------ requests

    def task_of(self, body: dict[str, Any]) -> Task:
        """The task an episode request names (``instance_id``) or carries (``task``)."""
        if "task" in body:
            try:
                return Task.from_dict(body["task"])
            except TaskError as e:
                raise AgentServerError(str(e)) from None
        iid = body.get("instance_id")
        if iid not in self.tasks:
            raise AgentServerError(f"unknown instance_id {iid!r}: give one of GET /v1/tasks "
                                   "or a full task object in 'task'.")
        return self.tasks[iid]

    async def _renderer(self, router_url: str) -> tuple[ChatRenderer, str]:
        """Renderer and model name for a router (tokenizer from config or /v1/models).

        Built once per router under a lock: concurrent first episodes would otherwise load
        the tokenizer in several threads at once, and transformers' lazy imports are not
        thread-safe.
        """
        async with self._renderer_lock:
            return await self._renderer_unlocked(router_url)

    async def _renderer_unlocked(self, router_url: str) -> tuple[ChatRenderer, str]:
        if router_url not in self._renderers:
            model = self.cfg.served_model_name
            root = None
            if model is None or self.cfg.tokenizer is None:
                try:
                    resp = await self.http.get(router_url.rstrip("/") + "/v1/models", timeout=30)
                    entry = resp.json()["data"][0]
                except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                    raise AgentServerError(
                        f"cannot ask {router_url}/v1/models for the served model ({e}); set "
                        "agent_server served_model_name= and tokenizer= explicitly.") from None
                model = model or entry["id"]
                root = entry.get("root") or entry["id"]
            spec = self.cfg.tokenizer or root
            tok: Tokenizer = ByteTokenizer() if spec == "byte" else await asyncio.to_thread(HFTokenizer, spec)
            self._renderers[router_url] = ChatRenderer(tok, self.chat_format)
            self._models[router_url] = model
        return self._renderers[router_url], self._models[router_url]

    async def run(self, body: dict[str, Any]) -> EpisodeResult:
        """Run one episode request to the end (waits for a free slot first).

        Raises:
            AgentServerError: the request is malformed (unknown task, bad limits, no router).
        """
        task = self.task_of(body)
        router_url = body.get("router_url") or self.cfg.router_url
        if not router_url:
            raise AgentServerError("no router_url: give it in the request or start the server "
                                   "with router_url=URL.")
        try:
            limits = replace(self.episode_cfg.limits, **(body.get("limits") or {}))
        except TypeError as e:
            raise AgentServerError(f"bad 'limits' in request: {e}") from None
        ep_cfg = replace(self.episode_cfg, limits=limits)
        renderer, model = await self._renderer(router_url)
        session = SessionHeaders(session_id=str(body.get("session_id") or f"agent-{uuid.uuid4().hex[:12]}"),
                                 workload_class=self.cfg.workload_class,
                                 group_id=body.get("group_id"), unit_id=body.get("unit_id"))
        client = ModelClient(self.http, router_url, body.get("model") or model,
                             sampling={**OmegaConf.to_container(self.cfg.sampling), **(body.get("sampling") or {})},
                             timeout_s=self.cfg.model_timeout_s, retries=self.cfg.model_retries)
        self.m_queued.inc()
        async with self._sem:
            self.m_queued.dec()
            self.m_running.inc()
            try:
                result = await run_episode(task, session, client, renderer, ep_cfg,
                                           policy_version=body.get("policy_version"))
            finally:
                self.m_running.dec()
        self.m_done.labels(result.status).inc()
        self.m_reward.inc(result.reward)
        self.m_wall.observe(result.wall_s)
        return result

    def submit(self, body: dict[str, Any]) -> str:
        """Start an episode in the background; returns its id (validation happens first)."""
        self.task_of(body)
        self._drop_unfetched()
        eid = str(body.get("session_id") or f"agent-{uuid.uuid4().hex[:12]}")
        if eid in self.episodes:
            raise AgentServerError(f"episode {eid!r} already exists; use a new session_id.")
        body = {**body, "session_id": eid}
        entry: dict[str, Any] = {"state": "queued", "done": asyncio.Event(), "result": None,
                                 "error": None, "done_at": None}

        async def work() -> None:
            entry["state"] = "running"
            try:
                entry["result"] = (await self.run(body)).to_dict()
            except AgentServerError as e:
                entry["error"] = str(e)
            entry["state"], entry["done_at"] = "done", time.monotonic()
            entry["done"].set()

        entry["task"] = asyncio.ensure_future(work())
        self.episodes[eid] = entry
        return eid


    def _drop_unfetched(self) -> None:
        """Forget done results nobody fetched within ``keep_results_s`` (bounded memory)."""
        now = time.monotonic()
        stale = [eid for eid, e in self.episodes.items()
                 if e["done_at"] is not None and now - e["done_at"] > self.cfg.keep_results_s]
        for eid in stale:
            log.warning("dropping result of episode %s: not fetched in %s s", eid,
                        self.cfg.keep_results_s)
            del self.episodes[eid]


# ---------------------------------------------------------------------- HTTP


def make_app(service: AgentService) -> web.Application:
    """The aiohttp application serving ``service``."""

    async def json_body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="body must be a JSON object") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="body must be a JSON object")
        return body

    async def run(request: web.Request) -> web.Response:
        try:
            result = await service.run(await json_body(request))
        except AgentServerError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(result.to_dict())

    async def submit(request: web.Request) -> web.Response:
        try:
            eid = service.submit(await json_body(request))
        except AgentServerError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"episode_id": eid}, status=202)

    async def poll(request: web.Request) -> web.Response:
        eid = request.match_info["eid"]
        entry = service.episodes.get(eid)
        if entry is None:
            return web.json_response({"error": f"no episode {eid!r} (unknown or already fetched)"},
                                     status=404)
        wait_s = float(request.query.get("wait_s", "0"))
        if wait_s > 0 and entry["state"] != "done":
            try:
                await asyncio.wait_for(entry["done"].wait(), timeout=min(wait_s, 300))
            except asyncio.TimeoutError:
                pass
        body = {"episode_id": eid, "state": entry["state"], "result": entry["result"],
                "error": entry["error"]}
        if entry["state"] == "done":
            service.episodes.pop(eid, None)
        return web.json_response(body)

    async def tasks(_request: web.Request) -> web.Response:
        return web.json_response({"instance_ids": sorted(service.tasks)})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "tasks": len(service.tasks)})

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(service.registry), content_type="text/plain")

    app = web.Application(client_max_size=64 * 1024**2)
    app.add_routes([web.post("/v1/episodes/run", run), web.post("/v1/episodes", submit),
                    web.get("/v1/episodes/{eid}", poll), web.get("/v1/tasks", tasks),
                    web.get("/health", health), web.get("/metrics", metrics)])

    async def on_cleanup(_app: web.Application) -> None:
        await service.close()

    app.on_cleanup.append(on_cleanup)
    return app


def _is_base_url(v: Any) -> bool:
    return url_problem(v) is None


_WHOLE = number(whole=True, at_least=1)

# The server's own values (agent_server.yaml), checked before it starts (a bad one: exit 2).
VALUE_RULES: dict[str, Rule] = {
    "host": (is_text, "a host name or address, e.g. 127.0.0.1"),
    "port": (number(whole=True, at_least=0, at_most=65535), "a TCP port number (0-65535)"),
    "router_url": (or_null(_is_base_url), "the router's base URL, e.g. router_url=http://127.0.0.1:8100, or null"),
    "served_model_name": (or_null(is_text), "a served model name, or null"),
    "tokenizer": (or_null(is_text), "a model folder, byte, or null"),
    "workload_class": (is_text, "a workload class name such as agent"),
    "tasks_path": (or_null(is_text), "a tasks.jsonl path or a built-in set name, or null"),
    "extra_tasks_paths": (or_null(lambda v: isinstance(v, list) and all(is_text(p) for p in v)),
                          f"a list of task files or built-in sets ({', '.join(BUILTIN_TASK_SETS)}), or null"),
    "max_concurrent_episodes": (_WHOLE, "a whole number >= 1"),
    "keep_results_s": (number(above=0), "seconds > 0"),
    "model_timeout_s": (number(above=0), "seconds > 0"),
    "model_retries": (number(whole=True, at_least=0), "a whole number >= 0"),
    "sampling": (lambda v: isinstance(v, dict), "a mapping of request fields, e.g. {temperature: 1.0}"),
    "episode.limits.max_turns": (_WHOLE, "a whole number >= 1"),
    "episode.limits.max_context_tokens": (_WHOLE, "a whole number of tokens >= 1"),
    "episode.limits.max_tokens_per_turn": (_WHOLE, "a whole number of tokens >= 1"),
    "episode.limits.min_turn_tokens": (_WHOLE, "a whole number of tokens >= 1"),
    "episode.limits.max_episode_s": (number(above=0), "seconds > 0"),
    "episode.system_prompt": (or_null(lambda v: isinstance(v, str)), "a prompt text, or null"),
    "episode.tool_listing": TOOL_LISTING_RULE,
    "episode.demonstrations": DEMONSTRATIONS_RULE,
    "episode.max_observation_chars": (_WHOLE, "a whole number >= 1"),
    "episode.close_session_with_request": (lambda v: isinstance(v, bool), "true or false"),
    "sandbox.bwrap": (is_text, "the bubblewrap program, e.g. bwrap"),
    "sandbox.unsafe_no_isolation": (lambda v: isinstance(v, bool), "true or false"),
    "sandbox.tmp_size_bytes": (_WHOLE, "a whole number of bytes >= 1"),
    "sandbox.uid_base": (number(whole=True, at_least=0), "a whole number >= 0"),
    "sandbox.workspace_root": (or_null(is_text), "a folder, or null"),
}


def serve(cfg: DictConfig) -> None:
    """Check the config, then serve until interrupted.

    Raises:
        ConfigError: a value of the wrong type or range (``VALUE_RULES``), or an address
            that cannot be served on (a port in use).
        UnknownAgentServerOption: an option name added with ``+`` that does not exist.
        AgentServerError: a top-level key added with ``+`` that the recipe does not have.
        AgentServerError, TaskError, SandboxError: other bad configuration.
    """
    base = compose("agent_server")  # its recipe's keys; `+name=value` must not add one it would ignore
    added = sorted(str(k) for k in cfg if k not in base)
    if added:
        raise AgentServerError(f"unknown config key '{added[0]}': the agent server has no such option. "
                               f"Valid keys: {', '.join(sorted(str(k) for k in base))}.")
    check_values(cfg, VALUE_RULES)
    episode_config(cfg).isolation.check()
    _options(ChatFormat, cfg.chat_format, "chat_format")
    task_sets = load_task_set_files(cfg)  # a bad task file is refused before the server says where it listens
    check_tasks_run(cfg, task_sets)
    tasks = merged_task_sets(task_sets)

    sock = listening_socket(cfg.host, cfg.port)  # an address in use: one error line, before anything starts

    async def build() -> web.Application:
        return make_app(AgentService(cfg, tasks))

    log.info("agent server on http://%s:%s", cfg.host, sock.getsockname()[1])
    web.run_app(build(), sock=sock, print=None)


def main() -> None:
    """Entry point of ``python -m agents.server``: a mistake on the command line is one line
    (``common.config.hydra_entry``): exit 2 for an unknown key or option, 1 for a bad value."""
    import sys

    for error in (AgentServerError, TaskError, SandboxError):
        register_user_error(error)  # a bad value or an unknown name: exit 2

    @hydra_entry("agent_server")
    def _main(cfg: DictConfig) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        serve(cfg)

    # Log to stdout (the job captures it into the run folder's agent_server.log) rather than
    # to a server.log in the working directory. Set here, not in agent_server.yaml, because
    # that file is also composed into other configs (eval) where a hydra override is illegal.
    # Put first: after a flag such as `--cfg job`, argparse takes no more overrides.
    if not any(a.startswith(("hydra/job_logging", "hydra.job_logging")) for a in sys.argv[1:]):
        sys.argv.insert(1, "hydra/job_logging=stdout")
    _main()


if __name__ == "__main__":
    main()
