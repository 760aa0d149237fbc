"""Per-command resource limits and the capped output buffer.

Limits are applied with ``prlimit`` (util-linux) as the last wrapper before the command,
so they hold for the command and everything it starts. RLIMIT values are per process
(CPU seconds, address space, file size); the process count is per sandbox user (see
``sandbox/isolation.py``); the wall-clock timeout and the output cap are enforced by the
caller (``Workspace.run``), which kills the whole process tree.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sandbox.errors import SandboxError


@dataclass(frozen=True)
class Limits:
    """Limits for one command run in a workspace.

    Attributes:
        timeout_s: wall-clock limit; the whole process tree is killed when it passes.
        cpu_s: CPU seconds per process (RLIMIT_CPU; SIGXCPU then SIGKILL).
        memory_bytes: address space per process (RLIMIT_AS).
        max_processes: processes and threads the sandbox user may have at once
            (RLIMIT_NPROC; exact per workspace when the host runs as root, and in the
            unprivileged mode on Linux >= 5.14; see ``sandbox/isolation.py``).
        file_size_bytes: largest file a process may write (RLIMIT_FSIZE).
        output_bytes: stdout and stderr are each kept up to this many bytes: the head and
            the tail, with a marker saying how much was cut in between.
        open_files: file descriptors per process (RLIMIT_NOFILE).
    """

    timeout_s: float = 30.0
    cpu_s: int = 60
    memory_bytes: int = 2 * 1024**3
    max_processes: int = 64
    file_size_bytes: int = 64 * 1024**2
    output_bytes: int = 16 * 1024
    open_files: int = 256

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_bytes", "max_processes",
                     "file_size_bytes", "output_bytes", "open_files"):
            if getattr(self, name) <= 0:
                raise SandboxError(
                    f"sandbox limit {name}={getattr(self, name)!r} must be > 0; "
                    "set a positive value (see sandbox/limits.py for the meaning of each)."
                )

    def prlimit_argv(self, nproc: int | None = None) -> list[str]:
        """The ``prlimit`` prefix that applies these limits to the command after it.

        Args:
            nproc: RLIMIT_NPROC to set instead of ``max_processes`` (the caller adds the
                user's processes outside the sandbox when they share the user).
        """
        return [
            "prlimit",
            f"--cpu={self.cpu_s}",
            f"--as={self.memory_bytes}",
            f"--nproc={nproc if nproc is not None else self.max_processes}",
            f"--fsize={self.file_size_bytes}",
            f"--nofile={self.open_files}",
            "--core=0",
            "--",
        ]


class CappedBuffer:
    """Keeps the first and last ``cap_bytes // 2`` bytes of a stream, counting the rest.

    Memory stays bounded by ``cap_bytes`` however much the command writes; ``text()``
    puts a marker where bytes were dropped.
    """

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.total_bytes = 0

    def write(self, chunk: bytes) -> None:
        """Append ``chunk`` (any size)."""
        self.total_bytes += len(chunk)
        head_room = self.cap_bytes // 2 - len(self._head)
        if head_room > 0:
            self._head += chunk[:head_room]
            chunk = chunk[head_room:]
        if not chunk:
            return
        tail_cap = self.cap_bytes - self.cap_bytes // 2
        self._tail.append(chunk[-tail_cap:])
        self._tail_len += len(self._tail[-1])
        while self._tail_len - len(self._tail[0]) >= tail_cap:
            self._tail_len -= len(self._tail.popleft())

    @property
    def truncated(self) -> bool:
        """True when bytes were dropped."""
        return self.total_bytes > self.cap_bytes

    def text(self) -> str:
        """The kept output decoded as UTF-8 (invalid bytes replaced), with a marker."""
        tail = b"".join(self._tail)
        if not self.truncated:
            return (bytes(self._head) + tail).decode("utf-8", errors="replace")
        tail_cap = self.cap_bytes - self.cap_bytes // 2
        tail = tail[-tail_cap:]
        dropped = self.total_bytes - len(self._head) - len(tail)
        marker = f"\n[... {dropped} bytes of output truncated ...]\n"
        return (bytes(self._head).decode("utf-8", errors="replace") + marker
                + tail.decode("utf-8", errors="replace"))
