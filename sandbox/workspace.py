"""Workspaces: one writable copy of a task's repository snapshot per episode.

    ws = Workspace.create(snapshot_dir)                 # copy on create (milliseconds)
    result = await ws.run("python -m pytest -q")        # CommandResult
    await ws.apply_patch(diff_text)                     # git apply inside the sandbox
    text = ws.diff()                                    # unified diff against the snapshot
    await ws.destroy()                                  # kill everything, remove the copy

Every command runs through ``IsolationConfig.argv`` (bubblewrap) with ``Limits``; the
whole process tree is killed on timeout and on ``destroy``. Host-side file reads and
writes (``read_text``/``write_text``, used by the agent's file tools) resolve the path
first and refuse anything that leaves the workspace, symlinks included.
"""

from __future__ import annotations

import asyncio
import difflib
import fcntl
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from sandbox.errors import SandboxError
from sandbox.isolation import SANDBOX_WORKDIR, IsolationConfig
from sandbox.limits import CappedBuffer, Limits

IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".hypothesis"})
"""Names left out of copies and diffs (caches the tests write)."""


@dataclass(frozen=True)
class CommandResult:
    """What one command did.

    Attributes:
        exit_code: the shell's exit status; -9 (SIGKILL) when killed on timeout.
        stdout, stderr: decoded output, each capped at ``Limits.output_bytes``.
        duration_s: wall-clock seconds from start to exit (sandbox set-up included).
        timed_out: the wall-clock limit passed and the process tree was killed.
        output_truncated: stdout or stderr was cut (a marker says where).
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool
    output_truncated: bool

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out


class _UidPool:
    """Hands out user ids ``base .. base + size - 1``, each to one workspace at a time
    across all processes on the host.

    A uid is held by an exclusive ``flock`` on ``<lock_dir>/<uid>.lock``; the kernel
    drops the lock when the holder exits, so a crashed process leaks nothing. Without
    this, two processes could share a uid, and one's ``destroy`` (which kills the uid's
    processes) would kill the other's commands.
    """

    def __init__(self, size: int = 4096, lock_dir: str = "/tmp/misa-sandbox-uids") -> None:
        self.size = size
        self.lock_dir = Path(lock_dir)
        self._held: dict[int, int] = {}  # uid -> lock file descriptor
        self._lock = threading.Lock()

    def take(self, base: int) -> int:
        with self._lock:
            self.lock_dir.mkdir(mode=0o700, exist_ok=True)
            for slot in range(self.size):
                uid = base + slot
                if uid in self._held:
                    continue
                fd = os.open(self.lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise SandboxError(f"all {self.size} sandbox user ids from {base} are in use; destroy "
                           "finished workspaces before creating more.")

    def give_back(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


_UIDS = _UidPool()


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in IGNORED_NAMES or n.endswith(".pyc")}


def _chown_tree(root: Path, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def _tree_files(root: Path) -> dict[str, Path]:
    """Relative path -> file, for every regular file or symlink under ``root``."""
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_NAMES)
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            files[str(path.relative_to(root))] = path
    return files


def _read_lines(path: Path | None) -> list[str] | None:
    """The file's lines with endings, [] for an absent file, None for a binary file."""
    if path is None:
        return []
    try:
        return path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (UnicodeDecodeError, OSError):
        return None


def unified_diff(old_root: Path, new_root: Path) -> str:
    """A ``git apply``-compatible unified diff from ``old_root`` to ``new_root``.

    Paths are relative with ``a/`` and ``b/`` prefixes; added and removed files use
    ``/dev/null``; binary files are reported in a ``Binary files ... differ`` line.
    """
    old, new = _tree_files(old_root), _tree_files(new_root)
    out: list[str] = []
    for rel in sorted(old.keys() | new.keys()):
        a, b = old.get(rel), new.get(rel)
        if a is not None and b is not None and a.read_bytes() == b.read_bytes():
            continue
        a_lines, b_lines = _read_lines(a), _read_lines(b)
        if a_lines is None or b_lines is None:
            out.append(f"Binary files a/{rel} and b/{rel} differ\n")
            continue
        out.append(f"diff --git a/{rel} b/{rel}\n")
        if a is None:
            out.append("new file mode 100644\n")
        elif b is None:
            out.append("deleted file mode 100644\n")
        for line in difflib.unified_diff(
            a_lines, b_lines,
            fromfile=f"a/{rel}" if a is not None else "/dev/null",
            tofile=f"b/{rel}" if b is not None else "/dev/null",
        ):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


class Workspace:
    """One episode's writable copy of a snapshot, and the sandbox that runs commands in it.

    Create with ``Workspace.create``; not thread-safe (one episode, one event loop).

    Attributes:
        path: host folder of the copy.
        snapshot: the read-only source it was copied from (the diff base).
        uid: the workspace's own user id in root-host mode, else None.
    """

    def __init__(self, path: Path, snapshot: Path, isolation: IsolationConfig,
                 limits: Limits, uid: int | None, owns_root: Path | None) -> None:
        self.path = path
        self.snapshot = snapshot
        self.isolation = isolation
        self.limits = limits
        self.uid = uid
        self._owns_root = owns_root
        self._running: set[asyncio.subprocess.Process] = set()
        self.destroyed = False

    @classmethod
    def create(cls, snapshot: str | os.PathLike, root: str | os.PathLike | None = None,
               isolation: IsolationConfig | None = None,
               limits: Limits | None = None) -> "Workspace":
        """Copy ``snapshot`` into a fresh folder under ``root`` (default: system temp).

        Raises:
            SandboxError: the snapshot is not a folder, or bubblewrap is missing and
                isolation was not explicitly turned off.
        """
        isolation = isolation or IsolationConfig()
        isolation.check()  # fail early: bubblewrap missing or unusable here
        snapshot = Path(snapshot).resolve()
        if not snapshot.is_dir():
            raise SandboxError(f"task snapshot {snapshot} is not a folder; build the tasks "
                               "first (python -m agents.envs.build) or fix the task's snapshot path.")
        parent = Path(tempfile.mkdtemp(prefix="ws-", dir=root))
        path = parent / "workspace"
        shutil.copytree(snapshot, path, symlinks=True, ignore=_ignore)
        uid = None
        if isolation.as_root:
            uid = _UIDS.take(isolation.uid_base)
            _chown_tree(path, uid)
        return cls(path, snapshot, isolation, limits or Limits(), uid, parent)

    # ------------------------------------------------------------------ commands

    def _nproc(self, limits: Limits) -> int | None:
        if self.uid is not None or self.isolation.unsafe_no_isolation and os.geteuid() == 0:
            return None
        # Unprivileged host: RLIMIT_NPROC counts all of this user's processes.
        me = os.getuid()
        mine = sum(1 for p in psutil.process_iter(["uids"])
                   if p.info["uids"] is not None and p.info["uids"].real == me)
        return mine + limits.max_processes

    async def run(self, command: str, limits: Limits | None = None,
                  stdin: bytes | None = None) -> CommandResult:
        """Run shell ``command`` in the sandbox with cwd = the workspace.

        Args:
            command: passed to ``/bin/sh -c``.
            limits: overrides the workspace's default limits for this command.
            stdin: bytes fed to the command's standard input (closed after).

        Returns:
            CommandResult; a timeout or a limit hit is reported there, not raised.

        Raises:
            SandboxError: the workspace was destroyed.
        """
        self._check_alive()
        limits = limits or self.limits
        argv = self.isolation.argv(self.path, self.uid, limits, self._nproc(limits), command)
        out, err = CappedBuffer(limits.output_bytes), CappedBuffer(limits.output_bytes)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=self.path, env=self.isolation.env(), start_new_session=True,
        )
        self._running.add(proc)
        timed_out = False
        try:
            io = [self._drain(proc.stdout, out), self._drain(proc.stderr, err)]
            if stdin is not None:
                io.append(self._feed(proc, stdin))
            await asyncio.wait_for(asyncio.gather(*io, proc.wait()), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            # Always end the group: a command may leave children behind even on success.
            _kill_group(proc)
            await proc.wait()
            self._running.discard(proc)
        return CommandResult(
            exit_code=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
            stdout=out.text(), stderr=err.text(),
            duration_s=time.monotonic() - started, timed_out=timed_out,
            output_truncated=out.truncated or err.truncated,
        )

    @staticmethod
    async def _drain(stream: asyncio.StreamReader | None, buf: CappedBuffer) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            buf.write(chunk)

    @staticmethod
    async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            proc.stdin.close()

    async def apply_patch(self, patch: str) -> None:
        """Apply a unified diff (paths ``a/...``, ``b/...``) with ``git apply`` in the sandbox.

        Raises:
            SandboxError: the patch does not apply; the message holds git's reason.
        """
        if not patch.strip():
            return
        result = await self.run("git apply --whitespace=nowarn -",
                                stdin=patch.encode())
        if not result.ok:
            raise SandboxError(f"patch does not apply to workspace {self.path}: "
                               f"{(result.stderr or result.stdout).strip()[:2000]}")

    # ------------------------------------------------------------------ files

    def resolve(self, rel_path: str) -> Path:
        """Host path of workspace path ``rel_path`` (relative, or under ``/workspace``).

        Raises:
            SandboxError: the path (after following symlinks) leaves the workspace.
        """
        self._check_alive()
        rel = rel_path.strip()
        inside_abs = rel == SANDBOX_WORKDIR or rel.startswith(SANDBOX_WORKDIR + "/")
        if inside_abs:
            rel = rel[len(SANDBOX_WORKDIR):].lstrip("/")
        full = (self.path / rel).resolve()
        root = self.path.resolve()
        if (rel.startswith("/") and not inside_abs) or (full != root and root not in full.parents):
            raise SandboxError(f"path {rel_path!r} is outside the workspace; use a path "
                               "relative to the repository root.")
        return full

    def read_text(self, rel_path: str) -> str:
        """Read a workspace file as text (``SandboxError`` if missing or outside)."""
        path = self.resolve(rel_path)
        if not path.is_file():
            raise SandboxError(f"no file {rel_path!r} in the workspace.")
        return path.read_text(encoding="utf-8", errors="replace")

    def write_text(self, rel_path: str, text: str) -> None:
        """Write a workspace file (parents created), owned by the workspace user."""
        path = self.resolve(rel_path)
        if path.is_dir():
            raise SandboxError(f"{rel_path!r} is a folder, not a file.")
        new_dirs = [p for p in reversed(path.parents) if self.path in p.parents and not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if self.uid is not None:
            for p in [*new_dirs, path]:
                os.chown(p, self.uid, self.uid)

    def diff(self) -> str:
        """Unified diff from the snapshot to the workspace now (caches left out)."""
        self._check_alive()
        return unified_diff(self.snapshot, self.path)

    # ------------------------------------------------------------------ end

    async def destroy(self) -> None:
        """Kill every process of this workspace and remove its folder (idempotent)."""
        if self.destroyed:
            return
        self.destroyed = True
        for proc in list(self._running):
            _kill_group(proc)
            await proc.wait()
        self._running.clear()
        if self.uid is not None:
            _kill_uid(self.uid)
            _UIDS.give_back(self.uid)
        if self._owns_root is not None:
            shutil.rmtree(self._owns_root, ignore_errors=True)

    def _check_alive(self) -> None:
        if self.destroyed:
            raise SandboxError("this workspace was destroyed; create a new one.")

    async def __aenter__(self) -> "Workspace":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.destroy()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # bubblewrap leads its own session; its PID-1 child dies with it and takes the whole
    # PID namespace along (the kernel kills every process in it).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """SIGKILL any process left with real user id ``uid`` (root-host mode)."""
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] is not None and p.info["uids"].real == uid:
                p.kill()
        except psutil.Error:
            pass
