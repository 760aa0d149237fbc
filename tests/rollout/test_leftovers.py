"""What killed engines leave behind is removed at the next pool start (rollout.leftovers),
and nothing a living process uses is touched."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from rollout.leftovers import OWNER_FILE, Swept, mark_owner, sweep_leftovers

# A child that holds one file open and maps another (then closes that one's descriptor),
# as a running engine holds its ring buffers; it prints "ready" once both are held.
HOLDER = """
import mmap, os, sys, time
held = open(sys.argv[1], "rb")
fd = os.open(sys.argv[2], os.O_RDWR)
mapped = mmap.mmap(fd, 4096)
os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


def _old(path, size=4096):
    path.write_bytes(b"\0" * size)
    past = time.time() - 3600
    os.utime(path, (past, past))
    return path


@pytest.fixture
def holder():
    procs = []

    def hold(open_path, mapped_path):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(open_path), str(mapped_path)],
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_stale_segments_go_and_those_in_use_or_new_stay(tmp_path, holder, caplog):
    shm = tmp_path / "shm"
    shm.mkdir()
    stale = [_old(shm / "psm_dead1"), _old(shm / "sem.mp-dead2", 32)]
    kept = [_old(shm / "psm_open"), _old(shm / "psm_mapped"), shm / "psm_fresh",
            _old(shm / "other_file")]
    kept[2].write_bytes(b"\0" * 16)
    outside = _old(tmp_path / "outside")
    (shm / "psm_link").symlink_to(outside)
    holder(kept[0], kept[1])
    with caplog.at_level(logging.INFO, logger="rollout.leftovers"):
        swept = sweep_leftovers(shm, temp_dir=tmp_path / "no-pools")
    assert swept == Swept(shm_files=2, shm_bytes=4096 + 32, pool_folders=0)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept) and (shm / "psm_link").is_symlink() and outside.exists()
    assert "2 shared-memory file(s)" in caplog.text


def test_a_pool_folder_goes_only_when_the_process_that_made_it_is_gone(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = tmp_path / "misa-rl-engines-gone"
    gone.mkdir()
    (gone / OWNER_FILE).write_text(f"{dead.stdout.strip()} 12345\n")
    (gone / "vllm_dist_0").write_text("")
    reused = tmp_path / "misa-rl-engines-reused"  # this pid, another start time: a reused pid
    reused.mkdir()
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1\n")
    ours = tmp_path / "misa-rl-engines-ours"
    ours.mkdir()
    mark_owner(ours)
    unknown = tmp_path / "misa-rl-engines-unknown"  # no owner file: not ours to judge
    unknown.mkdir()
    other = tmp_path / "something-else"
    other.mkdir()
    swept = sweep_leftovers(tmp_path / "no-shm", temp_dir=tmp_path)
    assert swept == Swept(pool_folders=2)
    assert not gone.exists() and not reused.exists()
    assert ours.exists() and unknown.exists() and other.exists()


def test_nothing_to_sweep_is_quiet(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="rollout.leftovers"):
        assert not sweep_leftovers(tmp_path / "no-shm", temp_dir=tmp_path)
    assert caplog.text == ""
