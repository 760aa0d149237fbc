"""The tests' own helpers for finding and waiting out the processes they start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import MARKER_ENV, kill_marked, marked_processes, new_marker, wait_until_gone

# Takes a moment to die: on SIGTERM it waits until the file named by argv[1] exists.
_SLOW_TO_DIE = textwrap.dedent("""
    import os, signal, sys, time
    release = sys.argv[1]
    def on_term(*_):
        while not os.path.exists(release):
            time.sleep(0.02)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_marked_processes_finds_only_the_marked_ones_by_argv_or_environment(tmp_path):
    marker, other = new_marker(), new_marker()
    by_argv = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    by_env = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**os.environ, MARKER_ENV: marker})
    try:
        assert sorted(p.pid for p in marked_processes(marker)) == sorted([by_argv.pid, by_env.pid])
        assert marked_processes(other) == []
    finally:
        kill_marked(marker)
        by_argv.wait(timeout=30)
        by_env.wait(timeout=30)
    assert marked_processes(marker) == []


def test_wait_until_gone_waits_for_a_process_that_takes_a_moment_to_die(tmp_path):
    marker = new_marker()
    release = tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_TO_DIE, str(release), marker],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.terminate()
        seen = []

        def find():
            left = marked_processes(marker)
            seen.append(len(left))
            release.touch()  # lets it die only after the first look found it still alive
            return left

        # A zombie is not counted: the helper sees it go without our wait().
        assert wait_until_gone(find, timeout_s=60) == []
        assert seen[0] == 1 and seen[-1] == 0 and len(seen) >= 2
    finally:
        kill_marked(marker)
        proc.wait(timeout=30)


def test_wait_until_gone_returns_what_is_left_at_the_deadline():
    marker = new_marker()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    try:
        left = wait_until_gone(lambda: marked_processes(marker), timeout_s=0.3, poll_s=0.05)
        assert [p.pid for p in left] == [proc.pid]
    finally:
        kill_marked(marker)
        proc.wait(timeout=30)
