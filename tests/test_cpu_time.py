"""common.cpu_time: CPU seconds of a process tree, by role."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from common.cpu_time import CpuMeter, cpu_seconds, engine_job_role

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
    def __init__(self, name: str, argv: list[str], pid: int = 1) -> None:
        self._name, self._argv, self.pid = name, argv, pid

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
