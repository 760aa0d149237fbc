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
            used[role] = used.get(role, 0.0) + max(0.0, cpu - (before[1] if before and before[0] == role else 0.0))
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
