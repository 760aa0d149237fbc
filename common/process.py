"""Child processes the job starts: started, health-checked, logged and stopped by the job.

Every server the job runs (vLLM engines, the router, the agent server) is a
``ManagedProcess``: it runs in its own process group, writes stdout and stderr to a log
file in the run folder, is sent SIGTERM by the kernel if its parent dies
(``PR_SET_PDEATHSIG``), and ``stop()`` ends the whole group (SIGTERM, then SIGKILL after a
grace period), so nothing is left behind (DESIGN.md, "Conventions").

The kernel's death signal reaches only the direct child; what that child starts itself
(vLLM's API server starts its engine core) would outlive a killed job. So each managed
process also gets a *group guard*: a tiny process in its own session that holds the read
end of a pipe whose write end only the job holds. When the job dies, however it dies
(SIGKILL included), the kernel closes the write end, the guard reads end-of-file and ends
the whole group, SIGTERM, then SIGKILL after the grace period.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx

_PR_SET_PDEATHSIG = 1

# Seconds the group guard waits after SIGTERM before SIGKILL, as ``stop()``'s default.
_GUARD_GRACE_S = 10.0

# The group guard (argv: pgid, grace seconds). stdin is the pipe from the job: one byte
# means "the job stopped the group itself, exit"; end-of-file means the job died. It also
# exits once the group is gone on its own, so it never signals a reused group id later.
_GROUP_GUARD = """
import os, select, signal, sys, time
pgid, grace_s = int(sys.argv[1]), float(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)
def group_alive():
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
while True:
    if select.select([0], [], [], 1.0)[0]:
        if os.read(0, 1):
            sys.exit(0)
        break
    if not group_alive():
        sys.exit(0)
for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        sys.exit(0)
    deadline = time.monotonic() + wait_s
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
"""


class ProcessStartError(RuntimeError):
    """A managed process exited or did not become healthy in time.

    The message names the process, the reason, its log file and the log's last lines.
    """


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def listening_socket(host: str, port: int, keys: tuple[str, str] = ("host", "port")) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 = any free port) and listening, for a server to
    serve on. Bound first, so an address in use is refused before anything else starts;
    connections that arrive before serving starts wait in its backlog.

    Args:
        keys: the config keys of the host and the port, named in the error.

    Raises:
        ConfigError: the address cannot be bound (in use, not an address of this machine).
    """
    from common.config import ConfigError

    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        return socket.create_server(address, family=family)  # SO_REUSEADDR on POSIX, as aiohttp's
    except OSError as exc:
        raise ConfigError(f"cannot serve on {host}:{port} ({exc}); choose another {keys[0]} (an address of "
                          f"this machine) or {keys[1]}") from None


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now.

    The port is taken below the kernel's ephemeral range: a server is often started tens
    of seconds after its port is chosen (vLLM binds its KV-event socket only after
    loading the model), and a port the kernel hands out for outgoing connections in the
    meantime would collide with it.
    """
    lo, _ = _ephemeral_range()
    start = max(1024, lo - 12000)
    for _ in range(200):
        port = random.randrange(start, lo)
        if port in _HANDED_OUT:  # chosen earlier by this process, maybe not bound yet
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, n_lines: int = 30) -> str:
    """The last ``n_lines`` of a text file ('' if it does not exist)."""
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(deque(f, maxlen=n_lines))
    except FileNotFoundError:
        return ""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGTERM this process when the parent dies.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ManagedProcess:
    """One long-running child process with a log file and an HTTP health check.

    Args:
        name: short name for messages and the log file (``engine-0``, ``router``).
        argv: the command line.
        log_path: file that receives the child's stdout and stderr (appended).
        health_url: URL that answers 2xx once the process is ready, or None for no check.
        env: extra environment variables (merged over ``os.environ``).
        cwd: working directory of the child.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        health_url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._guard: subprocess.Popen | None = None
        self._guard_pipe: int | None = None  # write end; closed when the job dies
        self.started_at_s: float | None = None
        self.ready_after_s: float | None = None

    def start(self) -> "ManagedProcess":
        """Start the child in a new process group; returns self."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"$ {' '.join(self.argv)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self.started_at_s = time.monotonic()
        self._start_guard()
        return self

    def _start_guard(self) -> None:
        # The child called setsid() before exec, so its pid is its group id.
        read_end, self._guard_pipe = os.pipe()  # both non-inheritable: no other child holds them
        try:
            self._guard = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _GROUP_GUARD, str(self.proc.pid),
                 str(_GUARD_GRACE_S)],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_end)

    def _release_guard(self) -> None:
        if self._guard_pipe is not None:
            try:
                os.write(self._guard_pipe, b"x")
            except OSError:  # the guard is gone already
                pass
            os.close(self._guard_pipe)
            self._guard_pipe = None
        if self._guard is not None:
            try:
                self._guard.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._guard.kill()
                self._guard.wait()
            self._guard = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _fail(self, reason: str) -> ProcessStartError:
        return ProcessStartError(
            f"{self.name} {reason}. Log: {self.log_path}\n--- last lines ---\n"
            f"{tail(self.log_path)}"
        )

    def wait_healthy(
        self, timeout_s: float, poll_s: float = 1.0, ready: Callable[[], bool] | None = None
    ) -> float:
        """Block until the health check passes (``ready``, else ``health_url``); returns
        seconds since start.

        Raises:
            ProcessStartError: the process exited, or ``timeout_s`` passed; the message
                holds the last lines of its log.
        """
        return wait_all_healthy([self], timeout_s, poll_s, [ready or self._http_ok])[0]

    def _http_ok(self) -> bool:
        if self.health_url is None:
            return True
        try:
            return httpx.get(self.health_url, timeout=2.0).is_success
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        """End the whole process group: SIGTERM, then SIGKILL after ``grace_s``."""
        if self.proc is None:
            return
        # The child called setsid() before exec, so its pid is its group id, also once the
        # leader itself is gone and reaped (os.getpgid would fail then and leave the group).
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # Children of the leader (e.g. vLLM's engine core) may outlive it: always finish the group.
        _signal_group(pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._release_guard()

    def __enter__(self) -> "ManagedProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_all_healthy(processes: Sequence[ManagedProcess], timeout_s: float, poll_s: float = 1.0,
                     checks: Sequence[Callable[[], bool]] | None = None) -> list[float]:
    """Block until every started process's health check passes; returns, per process, the
    seconds from its start to ready. The wait runs in the calling thread, polling each
    process in turn, so Ctrl-C and SIGTERM (``rollout.serve.stop_on_sigterm``) end it at
    the next poll; a wait in worker threads would hold the job until each one returns.

    Args:
        processes: the processes, started (``start()``).
        timeout_s: the longest wait for all of them, seconds.
        poll_s: seconds between two rounds of checks.
        checks: one readiness test per process; None = each one's ``health_url``.

    Raises:
        ProcessStartError: a process exited, or ``timeout_s`` passed (the processes not
            ready are stopped); the message holds the last lines of that one's log.
    """
    assert all(p.proc is not None for p in processes), "start() first"
    tests = list(checks) if checks is not None else [p._http_ok for p in processes]
    pending = dict(zip(processes, tests))
    deadline = time.monotonic() + timeout_s
    while True:
        for p, check in list(pending.items()):
            if p.proc.poll() is not None:
                raise p._fail(f"exited with code {p.proc.returncode} while starting")
            if check():
                p.ready_after_s = time.monotonic() - (p.started_at_s or 0.0)
                del pending[p]
        if not pending:
            return [p.ready_after_s for p in processes]
        if time.monotonic() > deadline:
            for p in pending:
                p.stop()
            raise next(iter(pending))._fail(f"was not healthy after {timeout_s:.0f} s")
        time.sleep(poll_s)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
