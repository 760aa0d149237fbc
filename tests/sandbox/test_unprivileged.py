"""The sandbox's unprivileged mode (bubblewrap run by an ordinary user, in a user
namespace), which a root host never takes: the CI runners' mode.

When the tests run as root, the sandbox is driven by a separate process run as user
``nobody`` (``setpriv``). That user cannot reach a Python runtime, checkout or temp folder
that lives under a folder closed to others (``/root``, the session's private temp folder):
the process then runs in a private mount namespace where such a folder is covered by an
empty one holding only those paths (bound from the host, with their own permissions).
Nothing changes on the host. When the tests do not run as root, the process is started as the current user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.processes import marked_processes, wait_until_gone

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(__file__).with_name("unprivileged_entry.py")
NOBODY = 65534
ENTRY_TIMEOUT_S = 300  # generous: the machine is loaded; a hang still ends


def _closed_ancestors(paths: list[Path]) -> dict[Path, list[Path]]:
    """Outermost folder closed to others (no o+x) above each path -> the paths under it."""
    out: dict[Path, list[Path]] = {}
    for p in paths:
        for parent in reversed([p, *p.parents]):
            if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
                out.setdefault(parent, []).append(p)
                break
    return out


def _as_nobody(argv: list[str], needed: list[Path]) -> list[str]:
    """``argv`` run as ``nobody`` from a private mount namespace in which every folder
    closed to others above a ``needed`` path holds only the needed paths below it (bound
    from the original through a descriptor opened before the folder is covered)."""
    needed = sorted({p.resolve() for p in needed})
    needed = [p for p in needed if not any(q != p and q in p.parents for q in needed)]
    script, fd = ["set -e"], 3
    for closed, inside in _closed_ancestors(needed).items():
        assert fd <= 9, "too many closed folders for sh's descriptors 3-9"
        script += [f"exec {fd}< '{closed}'",
                   f"mount -t tmpfs -o mode=0755,size=1m tmpfs '{closed}'"]
        for p in inside:
            script += [f"mkdir -p '{p}'",
                       f"mount -c --rbind '/proc/self/fd/{fd}/{p.relative_to(closed)}' '{p}'"]
        script.append(f"exec {fd}<&-")
        fd += 1
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            "\n".join(script), "sh", *drop, *argv]


def _userns_probe(wrap) -> subprocess.CompletedProcess:
    """bubblewrap making a user namespace as this (or the dropped) user."""
    probe = ["bwrap", "--ro-bind", "/", "/", "--unshare-user", "--unshare-pid", "--unshare-net",
             "--cap-drop", "ALL", "true"]
    return subprocess.run(wrap(probe), capture_output=True, text=True, timeout=60)


def _workdir() -> Path:
    """A folder of the unprivileged user's in the temp folder."""
    work = Path(tempfile.mkdtemp(prefix="misa-unpriv-"))
    snap = work / "snapshot" / "pkg"
    snap.mkdir(parents=True)
    (snap / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    for name in ("workspaces", "outside"):
        (work / name).mkdir()
    (work / "outside" / "secret.txt").write_text("host-secret-7f3a\n")
    (work / "outside" / "writable.txt").write_text("host-original\n")
    os.chmod(work, 0o755)
    if os.geteuid() == 0:
        for dirpath, dirnames, filenames in os.walk(work):
            for n in [dirpath, *(os.path.join(dirpath, f) for f in dirnames + filenames)]:
                os.chown(n, NOBODY, NOBODY)
    return work


@pytest.fixture(scope="module")
def unprivileged():
    """The entry's findings: one run of tests/sandbox/unprivileged_entry.py as a
    non-root user."""
    for tool in ("bwrap", "setpriv", "unshare", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: cannot run the sandbox as an unprivileged user")
    work = _workdir()
    try:
        if os.geteuid() == 0:
            needed = [Path(sys.prefix), Path(sys.base_prefix), REPO, work]
            wrap = lambda argv: _as_nobody(argv, needed)  # noqa: E731
        else:
            wrap = lambda argv: argv  # noqa: E731
        probe = _userns_probe(wrap)
        if probe.returncode != 0:
            pytest.skip("the kernel forbids unprivileged user namespaces here, so bubblewrap "
                        f"cannot run unprivileged: {probe.stderr.strip()[:300]} (see "
                        "sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, "
                        "kernel.apparmor_restrict_unprivileged_userns)")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               "TMPDIR": str(work), "HOME": str(work), "LANG": "C.UTF-8"}
        r = subprocess.run(wrap([sys.executable, str(ENTRY), str(work)]), capture_output=True,
                           text=True, env=env, cwd=work, timeout=ENTRY_TIMEOUT_S)
        assert r.returncode == 0, f"entry exited {r.returncode}: {r.stderr[-4000:]}"
        found = json.loads(r.stdout.strip().splitlines()[-1])
        found["host_target"] = (work / "outside" / "writable.txt").read_text()
        found["host_planted"] = (work / "planted.txt").exists()
        found["leftover"] = sorted(p.name for p in (work / "workspaces").iterdir())
        return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_entry_really_runs_unprivileged(unprivileged):
    assert unprivileged["euid"] != 0
    assert unprivileged["as_root"] is False and unprivileged["uid"] is None


def test_unprivileged_sandbox_has_no_network(unprivileged):
    assert unprivileged["loopback_exit"] != 0
    assert unprivileged["internet_exit"] != 0
    assert "unreachable" in unprivileged["internet_err"] or "refused" in unprivileged["internet_err"]


def test_unprivileged_sandbox_writes_its_workspace(unprivileged):
    assert unprivileged["write_ok"]
    assert unprivileged["host_sees"] == "written-inside\n"
    assert "+    return a - b" in unprivileged["diff"] and "+++ b/new.txt" in unprivileged["diff"]


def test_unprivileged_sandbox_neither_reads_nor_writes_host_files(unprivileged):
    assert "host-secret-7f3a" not in unprivileged["read_out"]
    assert "root:" not in unprivileged["read_out"]  # /etc/passwd
    # / holds the system folders, the runtime's parents and the workspace only
    assert set(unprivileged["read_out"].split()).isdisjoint({"home", "srv", "var", "opt", "mnt"})
    assert unprivileged["write_outside_exit"] != 0
    assert unprivileged["target_after"] == unprivileged["host_target"] == "host-original\n"
    assert not unprivileged["planted"] and not unprivileged["host_planted"]


def test_unprivileged_timeout_kills_the_process_tree(unprivileged):
    assert unprivileged["timed_out"] and unprivileged["timeout_exit"] != 0
    assert unprivileged["left_after_timeout"] == 0
    assert wait_until_gone(lambda: marked_processes(unprivileged["marker"])) == []


def test_unprivileged_process_limit_ignores_the_users_processes_outside(unprivileged):
    # max_processes=10 with 20 of the user's processes running outside the sandbox: the
    # processes in the sandbox (its PID namespace: bubblewrap's PID 1, the watcher, the
    # shells, the sleeps) stop at 10, not at 10 + the user's others.
    out = unprivileged["bomb_out"].split()
    assert out[:1] == ["procs"], unprivileged["bomb_out"] + unprivileged["bomb_err"]
    assert 3 <= int(out[1]) <= 10


def test_unprivileged_workspace_folder_is_removed(unprivileged):
    assert unprivileged["removed"] and unprivileged["leftover"] == []


@pytest.mark.parametrize("release, per_namespace", [
    ("6.18.44-fc-v1098", True), ("5.14.0-rc1", True), ("5.15.0-91-generic", True),
    ("5.13.19", False), ("4.19.0", False), ("not-a-release", False)])
def test_kernels_from_5_14_count_the_process_limit_per_user_namespace(release, per_namespace):
    from sandbox.isolation import nproc_counted_per_user_namespace

    assert nproc_counted_per_user_namespace(release) is per_namespace
