"""Isolation with bubblewrap: the command line that runs one command in one workspace.

What a sandboxed command sees:
- the system folders (``/usr`` and the ``/bin``, ``/lib`` links) and the Python runtime
  (``runtime_paths``) read-only; nothing else of the host's files;
- its workspace, read-write, at ``/workspace`` (the working directory);
- its own ``/tmp`` (tmpfs of ``tmp_size_bytes``), ``/proc`` and a minimal ``/dev``;
- no network (its own network namespace holds only a downed loopback), its own PID, IPC
  and UTS namespaces; the process tree dies with the sandbox's PID 1, which dies with
  the caller (``--die-with-parent``).

Two modes, chosen from the caller's user:
- *root host* (containers, this machine): bubblewrap runs privileged and ``setpriv``
  drops the command to a workspace-private user id (``uid_base + slot``) with no
  capabilities and ``no_new_privs``. RLIMIT_NPROC is counted per user, so the process
  limit is exact per workspace.
- *unprivileged host* (CI runners): bubblewrap makes a user namespace. Linux >= 5.14
  counts RLIMIT_NPROC per user namespace, so the process limit is exact per sandbox there
  too (it also counts bubblewrap's PID 1 and the watcher, which run inside). An older
  kernel counts all of the caller's processes: the limit is then set to their number
  plus ``max_processes``, a weaker bound (``nproc_counted_per_user_namespace``).

``unsafe_no_isolation=True`` runs commands directly in the workspace folder with only
the rlimits: for machines without bubblewrap, never for untrusted model output.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.errors import SandboxError
from sandbox.limits import Limits

SANDBOX_WORKDIR = "/workspace"
"""Where the workspace is mounted inside the sandbox."""

BWRAP_INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; install it with `sudo apt-get install "
    "bubblewrap` (Debian/Ubuntu) or `sudo dnf install bubblewrap`. To run WITHOUT "
    "isolation (unsafe: commands can read and write your files and reach the network) "
    "set sandbox.unsafe_no_isolation=true."
)


_CHECKED: set["IsolationConfig"] = set()

NPROC_PER_USER_NAMESPACE_SINCE = (5, 14)
"""First Linux release that counts RLIMIT_NPROC per user namespace ("ucounts" rlimits):
a process in a new user namespace is limited by the tasks of its user in that namespace,
not by all the tasks its user runs on the host."""


def nproc_counted_per_user_namespace(release: str | None = None) -> bool:
    """True when the kernel (``release``, default this one's ``uname -r``) counts
    RLIMIT_NPROC per user namespace, so that an unprivileged sandbox's process limit holds
    for the sandbox alone; False for older kernels and a release it cannot read."""
    m = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return m is not None and (int(m[1]), int(m[2])) >= NPROC_PER_USER_NAMESPACE_SINCE


def _default_runtime_paths() -> list[str]:
    # The interpreter running us (a venv and the Python it was made from), so sandboxed
    # commands can run `python -m pytest` with the same packages.
    paths = {str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())}
    return sorted(p for p in paths if not p.startswith("/usr"))


# The first program of every sandbox: a parent-death signal (SIGKILL) armed before bwrap
# runs, then the parent checked: PR_SET_PDEATHSIG is a no-op when the parent died before
# it was set (bubblewrap #633 / #700), so a parent that is no longer the caller means it
# died in that window and the command must not start. $PPID is getppid() at shell start,
# after setpriv armed the signal; the signal survives the execs (none is set-uid).
_CHECK_CALLER = '[ "$PPID" = "$1" ] || exit 137; shift; exec "$@"'

# Inside the sandbox, before the command: a watcher blocked on the caller's pipe. EOF
# means the caller is gone (its write end closed with it). It closes the last window:
# bubblewrap's own PID-1 child arms --die-with-parent only after its fork, so a bwrap
# killed right then leaves that child running (bubblewrap #633). The watcher then kills
# every process in the sandbox's PID namespace (kill -9 -1 reaches no further). It runs
# before the uid drop (root-host mode: with CAP_KILL only, so the command's user cannot
# signal it, and because a dropped process may not reopen a root-owned pipe) and opens
# the pipe through /proc/self/fd (sh redirections cannot name fds above 9). The command
# inherits the read end too; all it can do with it is block on it or close its copy.
_WATCH_CALLER = '(read _ < "/proc/self/fd/$1"; kill -9 -1) & shift; exec "$@"'


def dies_with_caller(argv: list[str], *, pdeathsig: bool = True) -> list[str]:
    """``argv`` prefixed so that it does not start when the calling process is already gone
    (the parent check above) and, with ``pdeathsig``, is SIGKILLed when the caller dies,
    from the first instruction on (``setpriv --pdeathsig KILL``).

    Together with bwrap's ``--die-with-parent`` and ``--unshare-pid`` (the kernel kills
    a PID namespace with its PID 1) and the in-sandbox watcher, no process outlives its
    caller. Caveat: the signal follows the *thread* that started the child
    (``PR_SET_PDEATHSIG``); start sandboxes from a thread that outlives them (the event
    loop's).

    ``pdeathsig=False`` is for a bwrap whose sandbox runs the watcher: a bwrap SIGKILLed
    between cloning its PID-1 child and releasing it leaves that child blocked for ever on
    its setup eventfd, before ``--die-with-parent`` is armed and before the watcher exists
    (seen under load: a ``bwrap`` with PPid 1, NSpid 1, in read(2) on fd 5, no children).
    Left alive, the outer bwrap finishes its setup, the watcher sees the caller's pipe at
    EOF and kills the sandbox, and both bwraps exit with their children.
    """
    check = ["/bin/sh", "-c", _CHECK_CALLER, "sh", str(os.getpid()), *argv]
    return ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", *check] if pdeathsig else check


@dataclass(frozen=True)
class IsolationConfig:
    """How commands are isolated.

    Attributes:
        bwrap: path or name of the bubblewrap binary.
        runtime_paths: host folders bound read-only at the same path (the Python
            runtime the tests need); default: this interpreter's prefix and base prefix.
        python_bin: folder put first on PATH inside the sandbox (``python``, ``pytest``).
        tmp_size_bytes: size of the sandbox's private ``/tmp``.
        uid_base: first user id handed to workspaces in root-host mode.
        unsafe_no_isolation: run without bubblewrap (see the module docstring).
    """

    bwrap: str = "bwrap"
    runtime_paths: tuple[str, ...] = field(default_factory=lambda: tuple(_default_runtime_paths()))
    # resolved like the bound runtime paths: a venv reached through a symbolic link is bound
    # at its real path, and the link itself does not exist inside the sandbox
    python_bin: str = field(default_factory=lambda: str(Path(sys.prefix).resolve() / "bin"))
    tmp_size_bytes: int = 256 * 1024**2
    uid_base: int = 200_000
    unsafe_no_isolation: bool = False

    @property
    def as_root(self) -> bool:
        """True when the host side runs as root (per-workspace user ids are used)."""
        return os.geteuid() == 0 and not self.unsafe_no_isolation

    def bwrap_path(self) -> str:
        """The resolved bubblewrap binary.

        Raises:
            SandboxError: bubblewrap is not installed (message says how to install it).
        """
        found = shutil.which(self.bwrap)
        if found is None:
            raise SandboxError(BWRAP_INSTALL_HINT)
        return found

    def check(self) -> None:
        """Run ``true`` in a throw-away sandbox once per configuration (cached).

        Raises:
            SandboxError: bubblewrap is missing or cannot create its namespaces here
                (the message holds bubblewrap's own reason and what to do).
        """
        if self.unsafe_no_isolation or self in _CHECKED:
            return
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory(prefix="sandbox-check-") as tmp:
            uid = None
            if self.as_root:
                uid = self.uid_base - 1  # outside the workspace range, never locked
                os.chown(tmp, uid, uid)
                os.chmod(tmp, 0o755)
            argv = self.argv(Path(tmp), uid, Limits(), None, "true")
            r = subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=60)
        if r.returncode != 0:
            raise SandboxError(
                f"bubblewrap cannot create a sandbox on this machine: {r.stderr.strip()[:500]}. "
                "It needs user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu "
                ">= 23.10 the AppArmor profile shipped with the bubblewrap package) or root. "
                "Only if you trust every command, set sandbox.unsafe_no_isolation=true.")
        _CHECKED.add(self)

    def env(self) -> dict[str, str]:
        """The environment of a sandboxed command (the host's is not passed on)."""
        return {
            "PATH": f"{self.python_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
        }

    def argv(self, workspace: Path, uid: int | None, limits: Limits,
             nproc: int | None, command: str, alive_fd: int | None = None) -> list[str]:
        """The full command line that runs shell ``command`` in ``workspace``.

        The line must be started by the process that calls this (its pid is checked, see
        ``dies_with_caller``), from the thread that will outlive the command.

        Args:
            workspace: host folder mounted read-write at ``/workspace``.
            uid: workspace user id (root-host mode), or None.
            limits: the rlimits to apply (``Limits.prlimit_argv``).
            nproc: RLIMIT_NPROC override (unprivileged mode on an old kernel, or
                without isolation), or None for ``limits.max_processes``.
            command: a ``/bin/sh -c`` command string.
            alive_fd: read end of a pipe whose write end only the caller holds, passed
                to the command (``pass_fds``); EOF on it means the caller is gone and the
                sandbox kills everything in it (see ``dies_with_caller``). None: no watch.
        """
        inner = limits.prlimit_argv(nproc) + ["/bin/sh", "-c", command]
        if self.unsafe_no_isolation:
            return dies_with_caller(inner)
        argv = dies_with_caller([self.bwrap_path()], pdeathsig=alive_fd is None)
        argv += ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = Path("/") / link
            if target.is_symlink():
                argv += ["--symlink", os.readlink(target), f"/{link}"]
            elif target.is_dir():
                argv += ["--ro-bind", str(target), f"/{link}"]
        argv += ["--perms", "0755", "--dir", "/etc"]
        for etc in ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime"):
            if Path(etc).exists():
                argv += ["--ro-bind", etc, etc]
        # The private /tmp comes before the runtime binds: a runtime that lives under /tmp
        # (a virtual environment in a checkout there, as CI makes) is bound on top of it
        # instead of being hidden by it.
        argv += ["--size", str(self.tmp_size_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
        made: set[str] = set()
        for path in self.runtime_paths:
            # bubblewrap copies the mode of a missing parent (e.g. /root is 0700), which
            # would hide the runtime from the workspace user: make parents 0755 first.
            for parent in reversed(Path(path).parents):
                p = str(parent)
                if p != "/" and p not in made and not p.startswith("/usr"):
                    argv += ["--perms", "0755", "--dir", p]
                    made.add(p)
            argv += ["--ro-bind", path, path]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--bind", str(workspace), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR]
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                 "--hostname", "sandbox"]
        if uid is not None:
            argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            if alive_fd is not None:
                argv += ["--cap-add", "CAP_KILL"]  # the watcher's kill of the uid's processes
            inner = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--", *inner]
        else:
            argv += ["--unshare-user", "--cap-drop", "ALL"]
        if alive_fd is not None:
            inner = ["/bin/sh", "-c", _WATCH_CALLER, "sh", str(alive_fd), *inner]
        return argv + inner
