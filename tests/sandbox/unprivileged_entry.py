"""The sandbox run by an ordinary user (run by tests/sandbox/test_unprivileged.py).

    python tests/sandbox/unprivileged_entry.py WORKDIR

Must run as a non-root user: bubblewrap then makes a user namespace (the *unprivileged
host* mode of ``sandbox/isolation.py``). WORKDIR belongs to that user and holds
``snapshot/`` (a tiny repository) and ``outside/`` (host files beside the workspace, which
this user may read and write on the host). Each isolation property is tried from inside
one workspace; the findings go to stdout as one JSON object for the test to assert on.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sandbox import IsolationConfig, Limits, Workspace
from tests.processes import MARKER_ENV, kill_marked, marked_processes, new_marker, wait_until_gone

# Processes this user runs outside the sandbox while the fork bomb runs inside it: on a
# CI runner the user's other jobs; a process limit must not grow with them.
OUTSIDE_PROCESSES = 20


async def findings(work: Path) -> dict:
    out: dict = {"euid": os.geteuid(), "as_root": IsolationConfig().as_root}
    ws = Workspace.create(work / "snapshot", root=work / "workspaces")
    out["uid"] = ws.uid
    try:
        # no network, not even this host's loopback
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        try:
            loop = await ws.run(f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"")
            net = await ws.run("python -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
        finally:
            server.close()
        out["loopback_exit"], out["internet_exit"], out["internet_err"] = loop.exit_code, net.exit_code, net.stderr

        # the workspace is writable, and what is written there is what the host sees
        wr = await ws.run("echo written-inside > new.txt && sed -i 's/a + b/a - b/' pkg/__init__.py")
        out["write_ok"] = wr.ok
        out["host_sees"] = (ws.path / "new.txt").read_text() if (ws.path / "new.txt").exists() else None
        out["diff"] = ws.diff()

        # host files outside the workspace: neither readable nor writable, though this
        # user may read and write them on the host
        secret, target = work / "outside" / "secret.txt", work / "outside" / "writable.txt"
        rd = await ws.run(f"cat {secret}; cat /etc/passwd; ls /")
        out["read_out"] = rd.stdout
        wo = await ws.run(f"echo from-sandbox >> {target}; echo from-sandbox > {work}/planted.txt")
        out["write_outside_exit"] = wo.exit_code
        out["target_after"] = target.read_text()
        out["planted"] = (work / "planted.txt").exists()

        # a timeout kills the whole process tree
        marker = new_marker()
        out["marker"] = marker
        try:
            t = await ws.run(f"export {MARKER_ENV}={marker}; sleep 300 & sleep 300 & sleep 300",
                             limits=Limits(timeout_s=0.5))
            out["timed_out"], out["timeout_exit"] = t.timed_out, t.exit_code
            out["left_after_timeout"] = len(await asyncio.to_thread(
                wait_until_gone, lambda: marked_processes(marker)))
        finally:
            kill_marked(marker)

        # a fork bomb stops at max_processes, however many processes this user runs
        # outside; the count is taken with shell builtins (no fork) after the bomb
        outside = [subprocess.Popen(["sleep", "120"]) for _ in range(OUTSIDE_PROCESSES)]
        try:
            bomb = await ws.run("sh -c 'for i in $(seq 100); do sleep 30 & done' 2>/dev/null; "
                                "set -- /proc/[0-9]*; echo procs $#",
                                limits=Limits(max_processes=10, timeout_s=20))
        finally:
            for p in outside:
                p.kill()
                p.wait()
        out["bomb_out"], out["bomb_err"] = bomb.stdout, bomb.stderr[-500:]
    finally:
        path = ws.path
        await ws.destroy()
        out["removed"] = not path.exists()
    return out


def main() -> int:
    work = Path(sys.argv[1])
    started = time.monotonic()
    result = asyncio.run(findings(work))
    result["elapsed_s"] = time.monotonic() - started
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
