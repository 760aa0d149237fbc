"""The host side survives hostile commands: endless output, links out of the workspace,
special files, and a launcher killed at any moment."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from sandbox import IsolationConfig, Limits, Workspace

# Generous bounds: the machine is loaded; each is far below "forever" (a hang).
RETURN_BOUND_S = 60.0


@pytest.mark.parametrize("command", ["yes", "cat /dev/zero", "yes >&2"])
async def test_run_returns_after_timeout_while_command_still_writes(workspace, command):
    # Before the fix run() hung in proc.wait(): stdout was paused with unread data, so
    # the pipes never reached EOF after the kill.
    result = await asyncio.wait_for(
        workspace.run(command, limits=Limits(timeout_s=1, output_bytes=1000)), RETURN_BOUND_S)
    assert result.timed_out
    assert result.output_truncated
    assert "bytes of output truncated" in (result.stdout + result.stderr)


async def test_run_returns_when_a_process_outside_the_group_keeps_the_pipe(snapshot, tmp_path):
    # Without isolation a command can move to a new session (out of the killed process
    # group) and keep stdout open forever: run() still returns, the pipes closed.
    ws = Workspace.create(snapshot, root=tmp_path, isolation=IsolationConfig(unsafe_no_isolation=True))
    marker = f"pipe-keeper-{uuid.uuid4().hex}"
    try:
        result = await asyncio.wait_for(
            ws.run(f"setsid sh -c 'sleep 120; : {marker}' & yes", limits=Limits(timeout_s=1)),
            RETURN_BOUND_S)
        assert result.timed_out
    finally:
        await ws.destroy()
        _kill_marked(marker)


async def test_diff_shows_symlink_as_link_never_its_target(workspace, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-CONTENT\n")
    outside_dir = tmp_path / "host-dir"
    outside_dir.mkdir()
    (outside_dir / "inner.txt").write_text("HOST-DIR-CONTENT\n")
    # Made on the host side (the sandbox cannot see these host paths to link them, but a
    # link's target is just text: a sandboxed `ln -s` can name any host path).
    os.symlink(secret, workspace.path / "notes.txt")
    os.symlink(outside_dir, workspace.path / "linked_dir")
    os.symlink("pkg/__init__.py", workspace.path / "inside_link.py")
    diff = workspace.diff()
    assert "HOST-SECRET-CONTENT" not in diff and "HOST-DIR-CONTENT" not in diff
    assert "new file mode 120000" in diff
    assert f"+{secret}\n\\ No newline at end of file" in diff
    assert "+pkg/__init__.py\n" in diff  # even a link inside is shown as a link


async def test_diff_skips_fifo_and_does_not_block(workspace):
    result = await workspace.run("mkfifo pipe && echo changed > notes.txt")
    assert result.ok, result.stderr
    diff = await asyncio.wait_for(asyncio.to_thread(workspace.diff), RETURN_BOUND_S)
    assert "+++ b/notes.txt" in diff
    assert "pipe" not in diff


async def test_diff_bounded_runs_off_the_event_loop(workspace):
    await workspace.run("mkfifo pipe && echo x > notes.txt")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    t = asyncio.ensure_future(ticker())
    try:
        diff = await asyncio.wait_for(workspace.diff_async(), RETURN_BOUND_S)
    finally:
        t.cancel()
    assert "+++ b/notes.txt" in diff
    assert ticks >= 1  # the loop kept running while the diff was computed


# ---------------------------------------------------------------- launcher killed

_LAUNCHER = textwrap.dedent("""
    import asyncio, os, signal, sys
    from sandbox import Limits, Workspace, workspace as wsmod
    from sandbox import IsolationConfig

    root, marker, moment, unsafe = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"

    async def main():
        ws = Workspace.create(root + "/snap", root=root,
                              isolation=IsolationConfig(unsafe_no_isolation=unsafe))
        print("WS", ws.path, flush=True)
        if moment == "spawn":
            # Die the instant the sandbox process exists, before it can arm anything.
            real = asyncio.create_subprocess_exec
            async def spawn_then_die(*a, **kw):
                proc = await real(*a, **kw)
                os.kill(os.getpid(), signal.SIGKILL)
                return proc
            wsmod.asyncio.create_subprocess_exec = spawn_then_die
        await ws.run(f"export MISA_MARK={marker}; sleep 600 & sleep 600 & touch started; wait",
                     limits=Limits(timeout_s=900))

    asyncio.run(main())
""")


def _marked(marker: str) -> list[psutil.Process]:
    """Processes whose argv or environment holds ``marker`` (this test's sandbox only)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if any(marker in a for a in (p.info["cmdline"] or [])) or \
                    marker.encode() in Path(f"/proc/{p.pid}/environ").read_bytes():
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def _kill_marked(marker: str) -> None:
    for p in _marked(marker):
        try:
            p.kill()
        except psutil.Error:
            pass


def _wait_until_no_marked(marker: str, bound_s: float = RETURN_BOUND_S) -> list[psutil.Process]:
    deadline = time.monotonic() + bound_s
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _wait_started(ws_path: Path) -> None:
    deadline = time.monotonic() + RETURN_BOUND_S
    while not (ws_path / "started").exists():
        assert time.monotonic() < deadline, "the sandboxed command never started"
        time.sleep(0.05)


def _start_launcher(tmp_path: Path, snapshot: Path, marker: str, moment: str,
                    unsafe: bool = False) -> subprocess.Popen:
    snap = tmp_path / "snap"
    if not snap.exists():
        snap.symlink_to(snapshot)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(tmp_path), marker, moment,
                             "1" if unsafe else "0"],
                            stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("moment", ["spawn", "0.0", "0.05", "0.3", "running"])
def test_no_sandbox_process_outlives_a_killed_launcher(snapshot, tmp_path, moment):
    marker = f"misa-mark-{uuid.uuid4().hex}"
    launcher = _start_launcher(tmp_path, snapshot, marker, moment)
    try:
        line = launcher.stdout.readline()
        assert line.startswith("WS "), line
        if moment == "running":
            _wait_started(Path(line.split(maxsplit=1)[1].strip()))
            launcher.kill()
        elif moment != "spawn":
            time.sleep(float(moment))
            launcher.kill()
        launcher.wait(timeout=RETURN_BOUND_S)
        assert launcher.returncode == -signal.SIGKILL
        left = _wait_until_no_marked(marker)
        assert left == [], [p.info["cmdline"] for p in left]
    finally:
        launcher.kill()
        launcher.wait()
        _kill_marked(marker)


def test_no_bwrap_is_left_blocked_when_launchers_die_during_its_setup(snapshot, tmp_path):
    """A bwrap SIGKILLed between cloning its PID-1 child and releasing it left that child
    blocked for ever on its setup eventfd (about 1 launch in 30 under load): many
    launchers killed in that window, none may leave a process behind."""
    markers = []
    for i in range(30):
        marker = f"misa-mark-{uuid.uuid4().hex}"
        markers.append(marker)
        run_dir = tmp_path / str(i)
        run_dir.mkdir()
        launcher = _start_launcher(run_dir, snapshot, marker, "spawn" if i % 2 else "0.0")
        try:
            assert launcher.stdout.readline().startswith("WS ")
            if i % 2 == 0:
                launcher.kill()
            launcher.wait(timeout=RETURN_BOUND_S)
        finally:
            launcher.kill()
            launcher.wait()
    try:
        deadline = time.monotonic() + RETURN_BOUND_S
        while (left := [p for m in markers for p in _marked(m)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], [p.info["cmdline"][:2] for p in left]
    finally:
        for m in markers:
            _kill_marked(m)


def test_workspace_folder_of_a_killed_owner_is_swept_at_next_create(snapshot, tmp_path):
    marker = f"misa-mark-{uuid.uuid4().hex}"
    launcher = _start_launcher(tmp_path, snapshot, marker, "running")
    try:
        ws_path = Path(launcher.stdout.readline().split(maxsplit=1)[1].strip())
        _wait_started(ws_path)
        launcher.kill()
        launcher.wait(timeout=RETURN_BOUND_S)
        assert _wait_until_no_marked(marker) == []
        assert ws_path.exists()  # nobody was left to remove it ...
        live = Workspace.create(snapshot, root=tmp_path)  # ... until the next start here
        try:
            assert not ws_path.exists()
            assert live.path.exists()
        finally:
            asyncio.run(live.destroy())
    finally:
        launcher.kill()
        launcher.wait()
        _kill_marked(marker)


def test_sweep_spares_folders_of_live_owners(snapshot, tmp_path):
    a = Workspace.create(snapshot, root=tmp_path)
    b = Workspace.create(snapshot, root=tmp_path)  # its sweep must not take a's folder
    try:
        assert a.path.exists() and b.path.exists()
    finally:
        asyncio.run(a.destroy())
        asyncio.run(b.destroy())


def test_sandbox_kills_itself_when_the_callers_pipe_closes(snapshot, tmp_path):
    # The last window (bubblewrap #633): bwrap's PID-1 child may miss --die-with-parent;
    # the in-sandbox watcher still ends everything once the caller's pipe is closed.
    ws = Workspace.create(snapshot, root=tmp_path)
    marker = f"misa-mark-{uuid.uuid4().hex}"
    r, w = os.pipe()
    try:
        argv = ws.isolation.argv(ws.path, ws.uid, Limits(), ws._nproc(Limits()),
                                 f"export MISA_MARK={marker}; sleep 600 & sleep 600; wait",
                                 alive_fd=r)
        proc = subprocess.Popen(argv, pass_fds=(r,), env=ws.isolation.env(), cwd=ws.path)
        os.close(r)
        deadline = time.monotonic() + RETURN_BOUND_S
        while len(_marked(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _marked(marker), "the sandboxed command never started"
        os.close(w)
        proc.wait(timeout=RETURN_BOUND_S)
        assert _wait_until_no_marked(marker) == []
    finally:
        _kill_marked(marker)
        asyncio.run(ws.destroy())
