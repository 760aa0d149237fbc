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
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from sandbox.errors import SandboxError
from sandbox.isolation import SANDBOX_WORKDIR, IsolationConfig, nproc_counted_per_user_namespace
from sandbox.limits import CappedBuffer, Limits

DRAIN_AFTER_KILL_S = 5.0
"""How long output is still read after a command's tree was killed (its pipes reach EOF
when the last writer is dead; the kernel tears a PID namespace down in milliseconds, this
is headroom for a loaded machine) before the pipes are closed regardless."""

DIFF_TIMEOUT_S = 120.0
"""Bound of ``Workspace.diff_async``: a diff of any real repository takes well under a
second; a workspace stuffed with large changed files must not hold an episode forever."""

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


@dataclass(frozen=True)
class _Entry:
    """One diffable thing in a tree: a regular file or a symbolic link (never followed).

    Attributes:
        path: host path (for a link: the link itself).
        mode: git's mode, ``100644`` for a file, ``120000`` for a link.
    """

    path: Path
    mode: str

    def content(self) -> bytes:
        """A file's bytes, or a link's target text (the link is never dereferenced).

        Opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked to be a regular file after the
        open: a path swapped for a link or a FIFO after the walk is read as empty, never
        followed or waited on.
        """
        if self.mode == _LINK_MODE:
            return os.fsencode(os.readlink(self.path))
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return b""
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return b""
            return f.read()


_FILE_MODE, _LINK_MODE = "100644", "120000"


def _tree_entries(root: Path) -> dict[str, _Entry]:
    """Relative path -> entry, for every regular file and symlink under ``root``.

    Symlinks (to files or folders, inside or outside ``root``) are entries of their own
    and never followed; FIFOs, sockets and device files are skipped (never opened: a
    FIFO would block the reader forever).
    """
    entries: dict[str, _Entry] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # followlinks=False
        dirnames.sort()
        names = list(filenames)
        keep = []
        for d in dirnames:
            if d in IGNORED_NAMES:
                continue
            (names if os.path.islink(os.path.join(dirpath, d)) else keep).append(d)
        dirnames[:] = keep
        for name in names:
            if name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                entries[str(path.relative_to(root))] = _Entry(path, _LINK_MODE)
            elif stat.S_ISREG(mode):
                entries[str(path.relative_to(root))] = _Entry(path, _FILE_MODE)
    return entries


def _lines(data: bytes) -> list[str] | None:
    """``data``'s lines with endings, None when it is not UTF-8 (a binary file)."""
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _file_diff(rel: str, a: _Entry | None, a_data: bytes, b: _Entry | None,
               b_data: bytes) -> list[str]:
    """The ``diff --git`` section of one path (``a`` or ``b`` None: added or removed)."""
    a_lines, b_lines = _lines(a_data), _lines(b_data)
    if a_lines is None or b_lines is None:
        return [f"Binary files a/{rel} and b/{rel} differ\n"]
    out = [f"diff --git a/{rel} b/{rel}\n"]
    if a is None:
        out.append(f"new file mode {b.mode}\n")
    elif b is None:
        out.append(f"deleted file mode {a.mode}\n")
    for line in difflib.unified_diff(
        a_lines, b_lines,
        fromfile=f"a/{rel}" if a is not None else "/dev/null",
        tofile=f"b/{rel}" if b is not None else "/dev/null",
    ):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return out


def unified_diff(old_root: Path, new_root: Path) -> str:
    """A ``git apply``-compatible unified diff from ``old_root`` to ``new_root``.

    Paths are relative with ``a/`` and ``b/`` prefixes; added and removed files use
    ``/dev/null``; binary files are reported in a ``Binary files ... differ`` line. A
    symlink is shown as git shows one (mode ``120000``, its target as the content) and is
    never followed, so nothing outside the trees is read; special files are left out.
    """
    old, new = _tree_entries(old_root), _tree_entries(new_root)
    out: list[str] = []
    for rel in sorted(old.keys() | new.keys()):
        a, b = old.get(rel), new.get(rel)
        a_data = a.content() if a is not None else b""
        b_data = b.content() if b is not None else b""
        if a is not None and b is not None and a.mode == b.mode and a_data == b_data:
            continue
        if a is not None and b is not None and a.mode != b.mode:
            # A file became a link or back: git writes a deletion and an addition.
            out += _file_diff(rel, a, a_data, None, b"") + _file_diff(rel, None, b"", b, b_data)
        else:
            out += _file_diff(rel, a, a_data, b, b_data)
    return "".join(out)


class Workspace:
    """One episode's writable copy of a snapshot, and the sandbox that runs commands in it.

    Create with ``Workspace.create``; not thread-safe (one episode, one event loop).

    Attributes:
        path: host folder of the copy.
        snapshot: the read-only source it was copied from (the diff base).
        uid: the workspace's own user id in root-host mode, else None.
    """

    def __init__(self, path: Path, snapshot: Path, *, isolation: IsolationConfig,
                 limits: Limits, uid: int | None, owns_root: Path | None) -> None:
        self.path = path
        self.snapshot = snapshot
        self.isolation = isolation
        self.limits = limits
        self.uid = uid
        self._owns_root = owns_root
        self._running: set[asyncio.subprocess.Process] = set()
        self._owner_lock_fd: int | None = None
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
        sweep_dead_owners(root)
        parent = Path(tempfile.mkdtemp(prefix=WORKSPACE_PREFIX, dir=root))
        lock_fd = _own(parent)
        path = parent / "workspace"
        shutil.copytree(snapshot, path, symlinks=True, ignore=_ignore)
        uid = None
        if isolation.as_root:
            uid = _UIDS.take(isolation.uid_base)
            _kill_uid(uid)  # anything a dead former holder of the uid left behind
            _chown_tree(path, uid)
        ws = cls(path, snapshot, isolation=isolation, limits=limits or Limits(), uid=uid, owns_root=parent)
        ws._owner_lock_fd = lock_fd
        return ws

    # ------------------------------------------------------------------ commands

    def _nproc(self, limits: Limits) -> int | None:
        """RLIMIT_NPROC for a command: None for ``limits.max_processes`` where the count
        holds the sandbox's processes only (its own uid on a root host; its own user
        namespace on Linux >= 5.14), else this user's other processes plus the limit."""
        if self.uid is not None or self.isolation.unsafe_no_isolation and os.geteuid() == 0:
            return None
        if not self.isolation.unsafe_no_isolation and nproc_counted_per_user_namespace():
            return None
        # Unprivileged host on an old kernel (or no isolation): RLIMIT_NPROC counts all of
        # this user's processes.
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
        # The caller's liveness pipe: only this process holds the write end (closed on
        # exec in every child), so the sandbox sees EOF when the process dies.
        alive_r, alive_w = os.pipe()
        try:
            argv = self.isolation.argv(self.path, self.uid, limits, self._nproc(limits),
                                       command, alive_fd=alive_r)
            out, err = CappedBuffer(limits.output_bytes), CappedBuffer(limits.output_bytes)
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=self.path, env=self.isolation.env(), start_new_session=True,
                pass_fds=(alive_r,),
            )
        except BaseException:
            os.close(alive_w)
            raise
        finally:
            os.close(alive_r)
        self._running.add(proc)
        io = [asyncio.ensure_future(self._drain(proc.stdout, out)),
              asyncio.ensure_future(self._drain(proc.stderr, err))]
        if stdin is not None:
            io.append(asyncio.ensure_future(self._feed(proc, stdin)))
        exited = asyncio.ensure_future(proc.wait())
        timed_out = False
        try:
            _done, pending = await asyncio.wait([*io, exited], timeout=limits.timeout_s)
            timed_out = bool(pending)
        finally:
            # Always end the group: a command may leave children behind even on success.
            _kill_group(proc)
            await _finish(proc, io, exited)
            os.close(alive_w)
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
        if not path.is_file():  # FIFOs, sockets and devices included: never opened
            raise SandboxError(f"no file {rel_path!r} in the workspace.")
        return _Entry(path, _FILE_MODE).content().decode("utf-8", errors="replace")

    def write_text(self, rel_path: str, text: str) -> None:
        """Write a workspace file (parents created), owned by the workspace user."""
        path = self.resolve(rel_path)
        if path.is_dir():
            raise SandboxError(f"{rel_path!r} is a folder, not a file.")
        if path.exists() and not path.is_file():  # a FIFO would block the write forever
            raise SandboxError(f"{rel_path!r} is a special file (FIFO, socket or device), "
                               "not a regular file; write to another path.")
        new_dirs = [p for p in reversed(path.parents) if self.path in p.parents and not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if self.uid is not None:
            for p in [*new_dirs, path]:
                os.chown(p, self.uid, self.uid)

    def diff(self) -> str:
        """Unified diff from the snapshot to the workspace now (caches left out).

        Links are shown as links and special files skipped (``unified_diff``). Blocking
        file I/O: from a coroutine use ``diff_async``.
        """
        self._check_alive()
        return unified_diff(self.snapshot, self.path)

    async def diff_async(self, timeout_s: float = DIFF_TIMEOUT_S) -> str:
        """``diff()`` in a worker thread, so the event loop (the agent server's) keeps
        serving while a large workspace is read.

        Raises:
            SandboxError: the diff took longer than ``timeout_s`` seconds (the thread is
                left to finish; its result is dropped).
        """
        self._check_alive()
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.diff), timeout_s)
        except asyncio.TimeoutError:
            raise SandboxError(f"diffing workspace {self.path} took longer than {timeout_s:g} s; "
                               "the workspace holds too much changed data to diff.") from None

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
            await asyncio.to_thread(shutil.rmtree, self._owns_root, ignore_errors=True)
            self._release_owner_lock()

    def _release_owner_lock(self) -> None:
        if self._owner_lock_fd is not None:
            os.close(self._owner_lock_fd)
            self._owner_lock_fd = None

    def _check_alive(self) -> None:
        if self.destroyed:
            raise SandboxError("this workspace was destroyed; create a new one.")

    async def __aenter__(self) -> "Workspace":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.destroy()


async def _finish(proc: asyncio.subprocess.Process, io: list[asyncio.Future],
                  exited: asyncio.Future) -> None:
    """Reap a killed command within ``DRAIN_AFTER_KILL_S``, whatever it left writing.

    The drains keep reading after the kill (into the capped buffers), so a pipe that was
    paused full reaches EOF once its writers are dead; ``proc.wait()`` only returns when
    both pipes are closed. A writer the kill did not reach (one that left the process
    group, possible only without isolation) would hold a pipe open forever: after the
    bound the drains are cancelled and the pipes closed by closing the transport.
    """
    everything = [*io, exited]
    _done, pending = await asyncio.wait(everything, timeout=DRAIN_AFTER_KILL_S)
    if pending:
        for f in io:
            f.cancel()
        # asyncio has no public call that closes a child's pipes; the transport's close
        # does (and kills the child if it is still alive).
        proc._transport.close()  # noqa: SLF001
        await asyncio.wait(everything, timeout=DRAIN_AFTER_KILL_S)
    for f in everything:  # retrieve outcomes so none is logged as never retrieved
        if f.done() and not f.cancelled():
            f.exception()
        elif not f.done():
            f.cancel()


WORKSPACE_PREFIX = "misa-ws-"
"""Name prefix of a workspace's folder (``<root>/misa-ws-XXXX/workspace``)."""

OWNER_LOCK = "owner.lock"
"""File in a workspace's folder, ``flock``-ed by the owning process while it lives."""


def _own(parent: Path) -> int:
    """Mark ``parent`` as owned by this process: an exclusive ``flock`` on its
    ``OWNER_LOCK``, held until ``destroy`` or until the process dies (the kernel drops it).

    The lock is taken on a temporary name and then renamed, so a concurrent sweep never
    sees an ``OWNER_LOCK`` that nobody holds yet. The descriptor is not inherited by
    commands (Python opens it close-on-exec).
    """
    tmp = parent / f".{OWNER_LOCK}.{os.getpid()}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, parent / OWNER_LOCK)
    return fd


def sweep_dead_owners(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the workspace folders under ``root`` (default: system temp) whose owner
    process died without ``destroy`` (killed, crashed).

    Called by every ``Workspace.create`` on its root, so a dead owner's folders go at the
    next start there. A folder is removed only when it has this module's name prefix, an
    ``OWNER_LOCK`` file, and that lock can be taken (its holder is gone; a pid is never
    trusted, pids are reused). Processes of a dead owner's sandbox are gone already
    (``IsolationConfig.argv``: they die with their launcher).

    Returns:
        The folders removed.
    """
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed = []
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(WORKSPACE_PREFIX)]
    except OSError:
        return removed
    for parent in candidates:
        try:
            fd = os.open(parent / OWNER_LOCK, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue  # being created (lock not renamed in yet) or not ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its owner lives
        try:
            shutil.rmtree(parent, ignore_errors=True)
            removed.append(parent)
        finally:
            os.close(fd)
    return removed


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
