"""Managed child processes: health check errors, whole-group stop, death with the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from rollout.engines import EngineError, cpu_core_split, validate_engine_cfg
from common.process import ManagedProcess, ProcessStartError, free_port
from tests.processes import MARKER_ENV, kill_marked, marked_processes, new_marker, wait_until_gone

# A tiny HTTP server that also forks a grandchild (as vLLM's API server forks its engine core).
_SERVER = textwrap.dedent("""
    import http.server, subprocess, sys
    port = int(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("grandchild", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _grandchild_pid(log_path, timeout_s=10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if line.startswith("grandchild "):
                return int(line.split()[1])
        time.sleep(0.1)
    raise AssertionError("server did not report its grandchild")


def _guards_of(pid: int) -> list[psutil.Process]:
    """This test process's children that guard the group ``pid`` (argv ... pgid grace)."""
    return [c for c in psutil.Process().children()
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE and c.cmdline()[-2:-1] == [str(pid)]]


def test_stop_ends_the_whole_process_group_and_its_guard(tmp_path):
    marker = new_marker()
    port = free_port()
    p = ManagedProcess("srv", [sys.executable, "-c", _SERVER, str(port)], tmp_path / "srv.log",
                       health_url=f"http://127.0.0.1:{port}/", env={MARKER_ENV: marker}).start()
    try:
        p.wait_healthy(60, poll_s=0.2)
        grandchild = _grandchild_pid(tmp_path / "srv.log")
        assert _alive(p.pid) and _alive(grandchild)
        assert len(_guards_of(p.pid)) == 1
        p.stop(grace_s=2)
        assert not _alive(p.pid)
        assert wait_until_gone(lambda: [g for g in [grandchild] if _alive(g)]) == []
        assert _guards_of(p.pid) == []
    finally:
        kill_marked(marker)


def test_stop_ends_the_group_when_its_leader_died_and_was_reaped_first(tmp_path):
    # vLLM's engine core outlives its API server: a leader that exited, reaped by a health
    # check's poll(), must not leave its group running (os.getpgid fails on a reaped pid)
    marker = new_marker()
    script = ("import subprocess, sys\n"
              "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              "print('grandchild', w.pid, flush=True)\n")
    p = ManagedProcess("srv", [sys.executable, "-c", script], tmp_path / "srv.log",
                       env={MARKER_ENV: marker}).start()
    try:
        grandchild = _grandchild_pid(tmp_path / "srv.log", timeout_s=60)
        deadline = time.monotonic() + 60
        while p.alive() and time.monotonic() < deadline:  # poll() reaps the leader
            time.sleep(0.1)
        assert not p.alive() and _alive(grandchild)
        p.stop(grace_s=1)
        assert wait_until_gone(lambda: [g for g in [grandchild] if _alive(g)]) == []
    finally:
        kill_marked(marker)


def test_health_timeout_error_names_the_process_and_shows_its_log(tmp_path):
    p = ManagedProcess("sleepy", [sys.executable, "-c",
                                  "print('starting slowly', flush=True); import time; time.sleep(60)"],
                       tmp_path / "sleepy.log", health_url=f"http://127.0.0.1:{free_port()}/").start()
    with pytest.raises(ProcessStartError) as e:
        p.wait_healthy(1.5, poll_s=0.2)
    assert "sleepy" in str(e.value) and "starting slowly" in str(e.value)
    assert not p.alive()


def test_process_that_exits_at_start_reports_exit_code_and_log(tmp_path):
    p = ManagedProcess("crash", [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"],
                       tmp_path / "crash.log", health_url="http://127.0.0.1:9/").start()
    with pytest.raises(ProcessStartError, match="exited with code 3") as e:
        p.wait_healthy(30, poll_s=0.1)
    assert "bad flag" in str(e.value)


def test_children_and_grandchildren_die_when_the_parent_is_killed(tmp_path):
    # Every process of this test carries the marker (argv of the parent, environment of
    # the rest), so the finally finds and kills what a failure leaves behind.
    marker = new_marker()
    port = free_port()
    parent_code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from common.process import ManagedProcess
        p = ManagedProcess("srv", [sys.executable, "-c", {_SERVER!r}, "{port}"],
                           Path({str(tmp_path / 'srv.log')!r}),
                           health_url="http://127.0.0.1:{port}/",
                           env={{{MARKER_ENV!r}: {marker!r}}}).start()
        p.wait_healthy(60, poll_s=0.2)
        print(p.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code, marker],
                              stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        grandchild = _grandchild_pid(tmp_path / "srv.log")
        assert _alive(child_pid) and _alive(grandchild)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_until_gone(lambda: [p for p in (child_pid, grandchild) if _alive(p)]) == []
        assert wait_until_gone(lambda: marked_processes(marker)) == []
    finally:
        kill_marked(marker)
        parent.wait(timeout=30)


def test_cpu_cores_are_split_between_engines():
    assert cpu_core_split(1, [0, 1]) == ["0-1"]
    assert cpu_core_split(2, [0, 1]) == ["0", "1"]
    assert cpu_core_split(2, [0, 1, 2, 3]) == ["0-1", "2-3"]
    assert cpu_core_split(3, [0, 1]) == ["0", "1", "0"]
    with pytest.raises(EngineError):
        cpu_core_split(0, [0, 1])


@pytest.mark.parametrize("key,value,hint", [
    ("num_engines", 0, "whole number >= 1"),
    ("num_engines", "two", "whole number >= 1"),
    ("kv_cache_space_gib", -1, "GiB > 0"),
    ("kind", "tpu", "cpu or gpu"),
    ("enforce_eager", "yes", "true or false"),
    ("block_size", 0, ">= 1, or null"),
    ("request_timeout_s", 0, "seconds > 0, or null"),
    ("seed", -1, "whole number >= 0"),
    ("seed", "abc", "whole number >= 0"),
])
def test_bad_engine_values_are_refused_with_the_key_named(train_cfg, key, value, hint):
    from omegaconf import OmegaConf

    ecfg = OmegaConf.create(OmegaConf.to_container(train_cfg.engine))
    ecfg[key] = value
    with pytest.raises(EngineError, match=f"engine.{key}=.*{hint}"):
        validate_engine_cfg(ecfg)
