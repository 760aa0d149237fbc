"""Processes a test starts, found again by a marker of their own.

A test that checks "nothing is left running" must look only at its own processes: other
tests and other users of the machine run ``sleep 300`` too. A test gives each process it
starts a unique marker, in its command line or in its environment (``MARKER_ENV``), and
looks them up with ``marked_processes``. Dying is asynchronous (a killed PID namespace, a
process group that gets SIGTERM), so a test waits with ``wait_until_gone`` and a deadline
instead of asserting at once, and kills whatever is left with ``kill_marked`` in a
``finally``.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable

import psutil

MARKER_ENV = "MISA_RL_TEST_MARKER"


def new_marker() -> str:
    """A token no other process on the machine carries (``misa-rl-test-<32 hex digits>``)."""
    return f"misa-rl-test-{uuid.uuid4().hex}"


def _carries(proc: psutil.Process, marker: str) -> bool:
    try:
        if any(marker in arg for arg in proc.cmdline()):
            return True
        return proc.environ().get(MARKER_ENV) == marker
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live (not zombie) processes whose argv contains ``marker`` or whose environment
    sets ``MARKER_ENV=marker``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if _carries(proc, marker):
            found.append(proc)
    return found


def wait_until_gone(find: Callable[[], list], timeout_s: float = 30.0,
                    poll_s: float = 0.1) -> list:
    """Call ``find`` until it returns an empty list or ``timeout_s`` seconds pass.

    Returns the last (possibly non-empty) result, so a test asserts ``== []`` and sees
    what was left. The deadline is generous because the machine is loaded; a process
    that is gone ends the wait at the next poll.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = find()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


def kill_marked(marker: str) -> None:
    """SIGKILL every process that carries ``marker`` (for a test's ``finally``)."""
    for proc in marked_processes(marker):
        try:
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
