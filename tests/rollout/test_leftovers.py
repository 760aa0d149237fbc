"""What killed engines leave behind is removed at the next pool start (rollout.leftovers),
and nothing a living process uses is touched."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from rollout.leftovers import (OWNER_FILE, SHM_DIR, Swept, files_in_use, group_pids, mark_owner,
                               sweep_leftovers, wait_groups_gone)

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

# A child that makes a segment as glibc's sem_open does for a named semaphore: it maps a
# file under a temporary name, links it to the final name and unlinks the temporary one,
# so its maps line names a deleted file that is not the segment's name.
LINKED_HOLDER = """
import mmap, os, sys, time
final, tmp = sys.argv[1], sys.argv[1] + ".tmpXYZ"
fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600)
os.write(fd, bytes(32))
mapped = mmap.mmap(fd, 32)
os.close(fd)
os.link(tmp, final)
os.unlink(tmp)
past = time.time() - 3600
os.utime(final, (past, past))
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

    def hold(*paths, script=HOLDER):
        p = subprocess.Popen([sys.executable, "-c", script, *map(str, paths)],
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


def test_a_named_semaphore_in_use_stays_though_its_maps_line_names_another_file(tmp_path,
                                                                               holder):
    # Seen in a run: the sweep removed the live semaphores of the reward pool (spawn
    # start method), whose next worker then failed in SemLock._rebuild (FileNotFoundError).
    shm = tmp_path / "shm"
    shm.mkdir()
    holder(shm / "sem.mp-live", script=LINKED_HOLDER)
    dead = _old(shm / "sem.mp-dead", 32)
    assert sweep_leftovers(shm, temp_dir=tmp_path / "no-pools") == Swept(shm_files=1,
                                                                         shm_bytes=32)
    assert (shm / "sem.mp-live").exists() and not dead.exists()


def test_a_real_multiprocessing_semaphore_counts_as_in_use():
    import multiprocessing

    lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore in /dev/shm
    st = (SHM_DIR / ("sem." + lock._semlock.name.lstrip("/"))).stat()
    assert (st.st_dev, st.st_ino) in files_in_use(SHM_DIR)


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


def test_a_pool_that_stops_its_engines_sweeps_what_they_left(tmp_path, monkeypatch, caplog):
    """EnginePool.stop ends the engines it launched, then sweeps: a stale segment nobody maps
    goes (here in a stand-in shared-memory folder), and so does a fresh one the engine's
    process group held until the stop (a ring buffer written until the end: the age rule
    would keep it); a fresh one the engine did not hold stays. A pool that only attached to
    engines started elsewhere stops nothing and sweeps nothing."""
    import rollout.engines as engines
    from common.process import ManagedProcess

    shm = tmp_path / "shm"
    shm.mkdir()
    calls = []

    def sweep(**kw):
        calls.append(1)
        return sweep_leftovers(shm_dir=shm, temp_dir=tmp_path / "temp", **kw)

    monkeypatch.setattr(engines, "sweep_leftovers", sweep)
    monkeypatch.setattr(engines, "SHM_DIR", shm)
    ring, opened, not_ours = shm / "psm_ring", shm / "psm_opened", shm / "psm_fresh_not_ours"
    ring.write_bytes(b"\0" * 4096)
    for p in (opened, not_ours):
        p.write_bytes(b"\0" * 16)
    # the engine maps its ring buffer in a worker it spawned (vLLM's engine core), same group
    engine = ("import subprocess, sys, time\n"
              f"w = subprocess.Popen([sys.executable, '-c', {HOLDER!r}, {str(opened)!r}, {str(ring)!r}],"
              " stdout=subprocess.PIPE, text=True)\n"
              "print(w.stdout.readline().strip(), flush=True)\ntime.sleep(60)\n")
    log_path = tmp_path / "engine-0.log"
    proc = ManagedProcess("engine-0", [sys.executable, "-c", engine], log_path)
    proc.start()
    deadline = time.monotonic() + 60
    def ready():  # the log's first line is the command, which says "ready" too
        return "ready" in log_path.read_text().splitlines()[1:]

    while not ready() and time.monotonic() < deadline:  # under load: wait, never race
        time.sleep(0.1)
    assert ready(), log_path.read_text()
    members = group_pids([proc.pid])
    assert proc.pid in members and len(members) == 2  # the engine and its worker
    stale = _old(shm / "psm_left")
    pool = engines.EnginePool([engines.EngineHandle(0, "http://127.0.0.1:1", None, proc)])
    with caplog.at_level(logging.INFO, logger="rollout.leftovers"):
        pool.stop()
    assert not proc.alive() and calls == [1]
    assert not stale.exists() and not ring.exists() and not opened.exists()  # mapped or open: the engine's
    assert not_ours.exists()  # fresh and never the engine's: the age rule keeps it
    assert ("removed 2 shared-memory file(s) the stopped engines left, "
            "1 other shared-memory file(s) nobody used for a minute (0.00 GB freed in ") in caplog.text
    attached = engines.EnginePool([engines.EngineHandle(0, "http://127.0.0.1:1", None)])
    kept = _old(shm / "psm_other")
    fresh = shm / "psm_fresh"
    fresh.write_bytes(b"\0" * 16)
    attached.stop()
    assert kept.exists() and fresh.exists() and calls == [1]
    not_ours.unlink()


def test_the_stop_waits_for_killed_workers_to_be_gone(tmp_path):
    # a worker that ignores SIGTERM and outlives its leader; the stop SIGKILLs it, and the
    # sweep must not run while it is still listed (its mappings would keep the segments)
    from common.process import ManagedProcess

    script = ("import signal, subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)'])\n"
              "time.sleep(60)\n")
    proc = ManagedProcess("engine-0", [sys.executable, "-c", script], tmp_path / "e.log").start()
    deadline = time.monotonic() + 60
    while len(group_pids([proc.pid])) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(group_pids([proc.pid])) == 2
    proc.stop(grace_s=1)
    assert wait_groups_gone([proc.pid], timeout_s=30) == set()
    assert group_pids([proc.pid]) == set()


def test_waiting_for_a_group_that_stays_returns_what_is_left_at_the_deadline(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        t0 = time.monotonic()
        assert wait_groups_gone([p.pid], timeout_s=0.3) == {p.pid}
        assert time.monotonic() - t0 >= 0.3
    finally:
        p.kill()
        p.wait()


def test_a_fresh_segment_not_held_by_the_stopped_engines_stays(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    fresh = shm / "psm_fresh"
    fresh.write_bytes(b"\0" * 16)
    st = fresh.stat()
    assert sweep_leftovers(shm, temp_dir=tmp_path, released={(st.st_dev, st.st_ino + 1)}) == Swept()
    assert fresh.exists()
    assert sweep_leftovers(shm, temp_dir=tmp_path, released={(st.st_dev, st.st_ino)}) == Swept(
        shm_files=1, shm_bytes=16, of_stopped_engines=1)


def test_a_released_segment_still_in_use_stays(tmp_path, holder):
    shm = tmp_path / "shm"
    shm.mkdir()
    mapped, opened = shm / "psm_mapped", shm / "psm_open"
    for p in (mapped, opened):
        p.write_bytes(b"\0" * 4096)
    holder(opened, mapped)
    released = {(p.stat().st_dev, p.stat().st_ino) for p in (mapped, opened)}
    assert sweep_leftovers(shm, temp_dir=tmp_path, released=released) == Swept()
    assert mapped.exists() and opened.exists()
