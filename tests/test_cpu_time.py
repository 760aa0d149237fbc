"""common.cpu_time: CPU seconds of a process tree, by role."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from common.cpu_time import (CpuMeter, cpu_seconds, engine_job_role, engine_job_role_by_engine,
                             split_engine_roles)

# A child that uses 0.3 s of CPU (its own CPU clock, so a loaded machine only makes it
# take longer), then waits for a line on stdin.
_BURN = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('burnt', flush=True)\nsys.stdin.readline()\n"


def test_a_child_s_cpu_is_counted_under_its_role():
    burner: list[int] = []  # the child's pid once started (the test process may have other children)

    def role(p: psutil.Process) -> str:
        return "me" if p.pid == os.getpid() else "child" if p.pid in burner else "other"

    meter = CpuMeter(os.getpid(), role)
    child = subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    burner.append(child.pid)
    try:
        assert child.stdout.readline().strip() == "burnt"
        seconds = cpu_seconds(os.getpid(), role)
        # (the kernel accounts in clock ticks: a few hundredths under the child's own clock)
        assert seconds[child.pid][0] == "child" and seconds[child.pid][1] >= 0.25
        cores = meter.cores()
        assert {"me", "child"} <= set(cores) and cores["child"] > 0
    finally:
        child.communicate("\n", timeout=30)
    # a process that ended before the reading counts nothing
    assert "child" not in meter.cores()


class _Fake:
    def __init__(self, name: str, argv: list[str], pid: int = 1, parents: list | None = None) -> None:
        self._name, self._argv, self.pid, self._parents = name, argv, pid, parents or []

    def parents(self) -> list:
        return self._parents

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return self._argv


class _Gone(_Fake):
    def name(self) -> str:
        raise psutil.NoSuchProcess(self.pid)


def test_roles_of_an_engine_job():
    py = "/venv/bin/python"
    cases = {
        "engine_worker": _Fake("VLLM::Worker", ["VLLM::Worker"]),
        "engine_core": _Fake("VLLM::EngineCor", ["VLLM::EngineCore"]),
        "api_server": _Fake("python", [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]),
        "router": _Fake("python", [py, "/venv/bin/vllm-router", "--host", "127.0.0.1"]),
        "other": _Fake("python", [py, "-m", "router_tools"]),
        "job": _Fake("python", [py, "-m", "bench.router_real"], pid=os.getpid()),
    }
    for role, proc in cases.items():
        assert engine_job_role(proc) == role, role
    assert engine_job_role(_Fake("python", [py, "-m", "router", "router=misa-t"])) == "router"
    assert engine_job_role(_Fake("vllm::router", ["vllm::router"])) == "router"  # how it renames itself
    assert engine_job_role(_Fake("vllm", ["/usr/bin/vllm", "serve", "m"])) == "api_server"
    assert engine_job_role(_Gone("x", [])) == "other"


def test_each_engine_s_processes_are_told_apart_by_its_server_port():
    py = "/venv/bin/python"
    launcher = _Fake("python", [py, "-m", "bench.router_real"])
    server_a = _Fake("python", [py, "-m", "vllm.entrypoints.openai.api_server", "--port", "8001"], parents=[launcher])
    server_b = _Fake("python", [py, "-m", "vllm.entrypoints.openai.api_server", "--port=8002"], parents=[launcher])
    core_a = _Fake("VLLM::EngineCor", ["VLLM::EngineCore"], parents=[server_a, launcher])
    worker_a = _Fake("VLLM::Worker", ["VLLM::Worker"], parents=[core_a, server_a, launcher])
    worker_b = _Fake("VLLM::Worker", ["VLLM::Worker"], parents=[server_b, launcher])
    orphan = _Fake("VLLM::Worker", ["VLLM::Worker"], parents=[launcher])  # no server above it: no port
    assert engine_job_role_by_engine(worker_a) == "engine_worker@8001"
    assert engine_job_role_by_engine(core_a) == "engine_core@8001"
    assert engine_job_role_by_engine(server_a) == "api_server@8001"
    assert engine_job_role_by_engine(worker_b) == "engine_worker@8002"
    assert engine_job_role_by_engine(orphan) == "engine_worker"
    assert engine_job_role_by_engine(_Fake("python", [py, "-m", "router"])) == "router"
    by_role, by_engine = split_engine_roles(
        {"engine_worker@8001": 0.6, "engine_worker@8002": 0.9, "engine_core@8001": 0.2, "engine_worker": 0.1,
         "router": 0.05})
    assert by_role == {"engine_worker": 1.6, "engine_core": 0.2, "router": 0.05}
    assert by_engine == {8001: {"engine_worker": 0.6, "engine_core": 0.2}, 8002: {"engine_worker": 0.9}}


def test_a_process_whose_engine_port_shows_up_later_counts_from_its_first_reading():
    """The start reading names this process ``me``, the end one ``me@8001`` (its engine's port
    found only then): its CPU before the start is still left out, not counted as used in the span."""
    readings: list[str] = []

    def role(p: psutil.Process) -> str:
        if p.pid != os.getpid():
            return "other"
        readings.append("me" if not readings else "me@8001")
        return readings[-1]

    start = time.process_time()
    while time.process_time() < start + 0.3:  # CPU used before the meter starts
        pass
    meter = CpuMeter(os.getpid(), role)
    t0 = time.monotonic()
    cores = meter.cores()
    used = cores["me@8001"] * (time.monotonic() - t0 + (t0 - meter.start_s))
    # had the start reading been ignored, the process's whole CPU so far (>= 0.3 s) would count
    assert readings == ["me", "me@8001"] and used < 0.2
