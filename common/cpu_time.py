"""CPU time a process tree used, by role: who shares the machine's cores during a run.

On a machine where the engines' model threads are bound to its cores (the CPU engines,
``rollout/engines.py``), every other process of the job (the engines' schedulers and API
servers, the router, the client) runs on the same cores and slows the engine steps. A
:class:`CpuMeter` reads the CPU seconds (user + system, ``psutil``) of a root process and
all its descendants at the start and end of a span and gives each role's share in cores.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import psutil


def cpu_seconds(root_pid: int, role: Callable[[psutil.Process], str]) -> dict[int, tuple[str, float]]:
    """{pid: (role, CPU seconds so far)} of ``root_pid`` and every live descendant.

    Processes that end while they are read are left out. Raises ``psutil.NoSuchProcess``
    when ``root_pid`` itself does not exist.
    """
    root = psutil.Process(root_pid)
    out: dict[int, tuple[str, float]] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[p.pid] = (role(p), t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


class CpuMeter:
    """CPU used by a process tree over a span, per role, in cores (CPU seconds / wall seconds).

    Args:
        root_pid: the tree's root (the job's own process).
        role: names a process's role (e.g. :func:`engine_job_role`).

    Use: ``m = CpuMeter(pid, role)`` at the start, ``m.cores()`` at the end. A process that
    started during the span counts from 0; one that ended during it is missing from the end
    reading and counts nothing, so read before stopping the processes that matter.
    """

    def __init__(self, root_pid: int, role: Callable[[psutil.Process], str]) -> None:
        self.root_pid, self.role = root_pid, role
        self.start_s = time.monotonic()
        self.start = cpu_seconds(root_pid, role)

    def cores(self) -> dict[str, float]:
        """{role: mean cores used since the meter was made}, roles in first-seen order."""
        end, wall = cpu_seconds(self.root_pid, self.role), max(time.monotonic() - self.start_s, 1e-9)
        used: dict[str, float] = {}
        for pid, (role, cpu) in end.items():
            before = self.start.get(pid)
            # the same process under the same role (an engine's port may be found at one reading
            # only: ``engine_worker`` then ``engine_worker@8001``) counts from its start reading
            same = before is not None and before[0].partition("@")[0] == role.partition("@")[0]
            used[role] = used.get(role, 0.0) + max(0.0, cpu - (before[1] if same else 0.0))
        return {r: round(v / wall, 4) for r, v in used.items()}


def engine_job_role(p: psutil.Process) -> str:
    """The role of one process of a job with vLLM engines and a router, by vLLM's own names.

    ``engine_worker``: ``VLLM::Worker``, the process that runs the model's forward passes;
    ``engine_core``: ``VLLM::EngineCore`` (the scheduler, KV cache manager and output
    handling; with the CPU engines' worker processes it runs no model); ``api_server``: the
    OpenAI server in front of an engine (tokenisation, HTTP); ``router``: the vLLM Router or
    this project's router (``python -m router``); ``job``: the calling process (e.g. the
    replay client); ``other``: anything else.
    """
    try:
        name, argv = p.name(), p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    if name.startswith("VLLM::Worker") or any(a.startswith("VLLM::Worker") for a in argv):
        return "engine_worker"
    if name.startswith("VLLM::EngineCor") or any(a.startswith("VLLM::EngineCore") for a in argv):
        return "engine_core"
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if module.startswith("vllm.entrypoints") or (len(argv) > 1 and argv[1:2] == ["serve"] and "vllm" in argv[0]):
        return "api_server"
    # vllm-router renames its process "vllm::router" once it runs (name and argv)
    if (module == "router" or name.startswith("vllm::router")
            or any(a.rsplit("/", 1)[-1] in ("vllm-router", "vllm::router") for a in argv[:2])):
        return "router"
    if p.pid == os.getpid():
        return "job"
    return "other"


ENGINE_ROLES = ("engine_worker", "engine_core", "api_server")
"""The roles of :func:`engine_job_role` that belong to one engine."""


def engine_port(p: psutil.Process) -> int | None:
    """The port of the engine a process belongs to: the ``--port`` of the nearest process, itself
    or an ancestor, that :func:`engine_job_role` calls ``api_server`` (vLLM's OpenAI server starts
    the engine core, which starts the worker); None for anything else or a process that is gone."""
    try:
        chain = [p, *p.parents()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    for q in chain:
        if engine_job_role(q) != "api_server":
            continue
        try:
            argv = q.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        for a, after in zip(argv, argv[1:] + [""]):
            value = after if a == "--port" else a.removeprefix("--port=") if a.startswith("--port=") else ""
            if value.isdigit():
                return int(value)
        return None
    return None


def engine_job_role_by_engine(p: psutil.Process) -> str:
    """:func:`engine_job_role`, with ``@<port>`` (:func:`engine_port`) after an engine's roles
    (``engine_worker@8001``): a :class:`CpuMeter` with it tells each engine's CPU apart
    (:func:`split_engine_roles`)."""
    role = engine_job_role(p)
    if role in ENGINE_ROLES:
        port = engine_port(p)
        if port is not None:
            return f"{role}@{port}"
    return role


def split_engine_roles(cores: dict[str, float]) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """``(by role, by engine)`` of a :class:`CpuMeter` reading made with
    :func:`engine_job_role_by_engine`: the cores per role summed over engines (what
    :func:`engine_job_role` would have given), and ``{port: {role: cores}}`` per engine."""
    by_role: dict[str, float] = {}
    by_engine: dict[int, dict[str, float]] = {}
    for key, v in cores.items():
        role, _, port = key.partition("@")
        by_role[role] = round(by_role.get(role, 0.0) + v, 4)
        if port.isdigit():
            by_engine.setdefault(int(port), {})[role] = v
    return by_role, by_engine
