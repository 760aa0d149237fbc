"""What stopped engines leave behind, removed when a pool stops and when the next one starts.

vLLM's shared-memory ring buffers (``/dev/shm/psm_*``, 160-250 MB each on CPU, four for a
2-engine job) and multiprocessing's named semaphores (``sem.mp-*``) are not always removed
when an engine stops: a job killed with SIGKILL (``kill -9``, the out-of-memory killer)
leaves all of them (its group guard, ``common.process``, still ends the engines), and even
an engine stopped by its job left 2 of its 4 segments on CPU. They stay in RAM until the
next reboot. A killed job also leaves the pool's temporary folder (``misa-rl-engines-*``,
``rollout.engines.private_temp_env``) in the system temp folder.

``sweep_leftovers`` removes them before a pool launches engines and after it stopped the
ones it launched (``rollout.engines.EnginePool.stop``), by rules that never touch what a
living process uses:

- a shared-memory file is removed only if this user owns it, it was last modified more
  than ``MIN_AGE_S`` ago (a segment being created is never caught between its creation and
  its first mapping) and no process of the machine has it mapped or open
  (``/proc/<pid>/maps`` and ``/proc/<pid>/fd``, compared by inode: ``files_in_use``); a
  segment nobody maps can no longer be reached by anyone but a process that would attach by
  name later, which vLLM's never do;
- at a pool's stop, the segments its own engines had mapped or open just before they were
  stopped (``files_in_use`` of the engines' process groups, ``group_pids``) skip the age
  rule: a ring buffer is written until its engine ends, so it is always younger than a
  minute then (a ``make run`` left one of 160 MB that way); the other rules hold;
- a pool temp folder is removed only if the process that made it (``OWNER_FILE``: its pid
  and start time, so a reused pid does not count) is gone; a folder without that file is
  left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterable

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
SHM_PATTERNS = ("psm_*", "sem.mp-*")
MIN_AGE_S = 60.0
GROUP_EXIT_WAIT_S = 5.0
"""How long a pool's stop waits for its engines' SIGKILLed workers to be gone before it sweeps."""
POOL_PREFIX = "misa-rl-engines-"
OWNER_FILE = "owner"


@dataclass(frozen=True)
class Swept:
    """What ``sweep_leftovers`` removed: shared-memory files and their bytes, pool folders."""

    shm_files: int = 0
    shm_bytes: int = 0
    pool_folders: int = 0
    of_stopped_engines: int = 0
    """Of ``shm_files``, those the stopping pool's own engines held (``released``)."""

    def __bool__(self) -> bool:
        return bool(self.shm_files or self.pool_folders)


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (state) on, past the "(comm)" that may
    hold spaces; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot), or None
    when the process is gone."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def mark_owner(folder: Path) -> None:
    """Write this process's pid and start time into ``folder/OWNER_FILE``."""
    (Path(folder) / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")


def _owner_alive(folder: Path) -> bool:
    try:
        pid, start = (folder / OWNER_FILE).read_text().split()
        return _start_time(int(pid)) == start
    except (OSError, ValueError):  # no owner file, or one we cannot read: not ours to judge
        return True


def group_pids(pgids: Iterable[int]) -> set[int]:
    """The pids of the living processes whose process group is one of ``pgids`` (field 5 of
    ``/proc/<pid>/stat``): an engine and the workers it spawned."""
    wanted, found = set(pgids), set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            fields = _stat_fields(proc.name)
            try:
                if fields and int(fields[2]) in wanted:
                    found.add(int(proc.name))
            except (ValueError, IndexError):
                continue
    return found


def wait_groups_gone(pgids: Iterable[int], timeout_s: float = GROUP_EXIT_WAIT_S,
                     poll_s: float = 0.05) -> set[int]:
    """Wait until no process of the groups ``pgids`` is left (killed workers still exiting
    list their mappings until they are gone), at most ``timeout_s`` seconds.

    Returns:
        the pids still there at the deadline (empty when all are gone).
    """
    pgids = list(pgids)
    deadline = time.monotonic() + timeout_s
    while True:
        left = group_pids(pgids)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


def files_in_use(under: Path, pids: Iterable[int] | None = None) -> set[tuple[int, int]]:
    """The files on ``under``'s file system that some process (of ``pids``; None: any) has
    mapped or open, as ``(st_dev, st_ino)`` pairs (``/proc/<pid>/maps`` and
    ``/proc/<pid>/fd``; the processes this user may not read are skipped: they cannot open
    this user's ``0600`` segments either).

    By inode, not by name: glibc's ``sem_open`` maps a temporary file, links it to the
    semaphore's name and unlinks the temporary one, so the maps line of a live named
    semaphore (multiprocessing's ``sem.mp-*`` under the spawn start method) names a deleted
    file, never ``sem.mp-*``.
    """
    device = under.stat().st_dev
    prefix = str(under).rstrip("/") + "/"
    used: set[tuple[int, int]] = set()
    procs = (Path(f"/proc/{pid}") for pid in pids) if pids is not None else Path("/proc").iterdir()
    for proc in procs:
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                if len(fields) == 6 and fields[5].startswith(prefix):
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    used.add((os.makedev(major, minor), int(fields[4])))
            for fd in (proc / "fd").iterdir():
                try:
                    if os.readlink(fd).startswith(prefix):  # stat only what lies under it
                        st = fd.stat()
                        used.add((st.st_dev, st.st_ino))
                except OSError:
                    continue
        except (OSError, ValueError):  # gone meanwhile, not readable, or a line we cannot read
            continue
    return {key for key in used if key[0] == device}


def sweep_leftovers(shm_dir: Path = SHM_DIR, temp_dir: Path | None = None,
                    min_age_s: float = MIN_AGE_S,
                    released: Collection[tuple[int, int]] = frozenset()) -> Swept:
    """Remove the shared-memory files and pool temp folders killed jobs (and stopped engines)
    left (module docstring: the rules); one log line when anything was removed.

    Args:
        shm_dir: the shared-memory folder (``/dev/shm``).
        temp_dir: where pool temp folders are made (None: the system temp folder).
        min_age_s: a shared-memory file modified more recently is kept, seconds.
        released: ``(st_dev, st_ino)`` of the segments the engines just stopped held
            (``files_in_use`` of their ``group_pids`` before the stop): exempt from the age
            rule, still kept while any process maps or holds them.

    Returns:
        what was removed. A file or folder that cannot be removed is skipped, never raised.
    """
    files, size, folders, own = 0, 0, 0, 0
    if shm_dir.is_dir():
        candidates = [p for pattern in SHM_PATTERNS for p in shm_dir.glob(pattern)]
        if candidates:
            used = files_in_use(shm_dir)
            now = time.time()
            for p in candidates:
                try:
                    st = p.lstat()  # a link is no regular file here: never followed
                    key = (st.st_dev, st.st_ino)
                    if (st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode) or key in used
                            or (key not in released and now - st.st_mtime < min_age_s)):
                        continue
                    p.unlink()
                except OSError:
                    continue
                files, size, own = files + 1, size + st.st_size, own + (key in released)
    for folder in Path(temp_dir or tempfile.gettempdir()).glob(POOL_PREFIX + "*"):
        if folder.is_dir() and not folder.is_symlink() and not _owner_alive(folder):
            shutil.rmtree(folder, ignore_errors=True)
            folders += 1
    swept = Swept(files, size, folders, own)
    if swept:
        parts = [f"{own} shared-memory file(s) the stopped engines left"] if own else []
        if files > own:
            parts.append(f"{files - own} {'other ' if own else ''}shared-memory file(s) nobody used for a minute")
        if folders:
            parts.append(f"{folders} engine temp folder(s) of killed runs")
        freed = f" ({size / 1e9:.2f} GB freed in {shm_dir})" if files else ""
        log.info("removed %s%s", ", ".join(parts), freed)
    return swept
