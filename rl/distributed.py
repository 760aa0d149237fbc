"""The learner's ranks: process group, commands from rank 0, liveness, the worker loop.

Ranks come from an existing launcher (``torchrun``: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); this module never starts processes. Rank 0 is the
orchestrator (sampler, release, router, weight sync, metrics); every other rank only
trains, inside ``worker_loop``:

    rank 0                                   rank r > 0
    RankGroup.init()  ---- rendezvous ----   RankGroup.init()
    post("build", ...) -> store key          next_command() (polls the store)
    collective body (scatter, FSDP)  <---->  same body, same order
    post("stop")                             marks stopped/<r>, returns
    close(): waits for every stopped/<r>     close()

A command is a small picklable ``(name, args)`` written under a numbered key of the
launcher's TCP store; bulk data (the step's samples) travels inside the command's
collective body (``scatter_object_list``). Workers wait on the store, not on a
collective, because the wait between two steps lasts as long as the rollouts (minutes
to hours) while collectives run under a bounded timeout (``collective_timeout_s``), so
a rank that hangs fails the job instead of blocking it forever.

Liveness: every rank bumps a heartbeat counter in the store every ``HEARTBEAT_S``. When
a collective fails on rank 0, ``diagnose`` names the rank whose counter stopped (or who
wrote its error line) and its log, in one line. A worker whose orchestrator stops beating
(or whose store vanished) exits with one line too. Under torchrun the agent then stops the
remaining processes; rank 0 stops the engines it started on its way out.

Where rank 0 hosts the store (ranks started without torchrun, whose agent hosts it
otherwise), a worker that found the store gone before it read ``stop`` would exit 1 ("the
orchestrator is gone") from a run that ended well; so rank 0 waits at the end (at most
``DEAD_AFTER_S``) until every worker has read ``stop``.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

HEARTBEAT_S = 1.0  # how often each rank bumps its counter
DEAD_AFTER_S = 6.0  # a counter unchanged this long = that rank is gone (several missed beats)
COMMAND_POLL_S = 0.05  # a worker's store poll for the next command (latency of each command)
_PREFIX = "misa-rl/"


class RankError(RuntimeError):
    """The learner ranks do not fit the config or the launch (a usage error)."""


class RankFailure(RankError):
    """A learner rank failed, died or hung at run time; the message names the rank and its log."""


@dataclass(frozen=True)
class RankInfo:
    """This process's place among the learner ranks (from the launcher's environment).

    Attributes:
        rank: global rank, 0 = the orchestrator.
        world_size: number of learner ranks (1 without a launcher).
        local_rank: index on this node (the GPU it uses).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_orchestrator(self) -> bool:
        return self.rank == 0


def rank_from_env(env: dict[str, str] | None = None) -> RankInfo:
    """``RankInfo`` from RANK / WORLD_SIZE / LOCAL_RANK (torchrun sets them); all absent
    = one rank.

    Raises:
        RankError: a value is not a whole number, or RANK is outside [0, WORLD_SIZE).
    """
    env = os.environ if env is None else env
    try:
        info = RankInfo(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                        int(env.get("LOCAL_RANK", 0)))
    except ValueError:
        raise RankError(f"RANK={env.get('RANK')!r} WORLD_SIZE={env.get('WORLD_SIZE')!r}: the "
                        "launcher's rank variables must be whole numbers") from None
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise RankError(f"RANK={info.rank} with WORLD_SIZE={info.world_size}: need "
                        "0 <= RANK < WORLD_SIZE (start the ranks with torchrun)")
    return info


def token_balanced_partition(num_tokens: Sequence[int], num_ranks: int) -> list[list[int]]:
    """Split samples over ranks so every rank gets about the same number of tokens.

    Greedy longest-first (LPT): samples in decreasing length, each to the rank holding the
    fewest tokens so far (ties: fewer samples, then lower rank). The largest rank total is
    at most 4/3 of the optimum (Graham 1969), and within one sample of the mean.

    Args:
        num_tokens: tokens (prompt + completion) of each sample.
        num_ranks: ranks to fill.

    Returns:
        one list of sample indices per rank, each in increasing index order (a rank may get
        none when there are fewer samples than ranks).
    """
    load = [0] * num_ranks
    parts: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in sorted(range(len(num_tokens)), key=lambda i: (-num_tokens[i], i)):
        r = min(range(num_ranks), key=lambda r: (load[r], len(parts[r]), r))
        parts[r].append(i)
        load[r] += num_tokens[i]
    return [sorted(p) for p in parts]


def check_learner_ranks(world_size: int | None, backend: str, info: RankInfo) -> None:
    """Refuse, before anything starts, a learner config that does not fit the launcher's
    ranks: ``trainer.learner.world_size`` other than WORLD_SIZE, or several ranks with a
    backend that trains in one rank.

    Raises:
        RankError: the message names the key and the launch command.
    """
    if world_size is not None and world_size != info.world_size:
        hint = (f"start it with torchrun --nproc-per-node {world_size} -m rl.train ..."
                if info.world_size == 1 else "or set trainer.learner.world_size=null")
        raise RankError(f"trainer.learner.world_size={world_size}, but the launcher started "
                        f"{info.world_size} rank(s) (WORLD_SIZE): {hint}")
    if info.world_size > 1 and backend == "deepspeed":
        raise RankError(f"{info.world_size} learner ranks with trainer.learner.backend=deepspeed "
                        "(ZeRO 1/2 in one rank here): set trainer.learner.backend=fsdp")


class RankGroup:
    """The learner's process group plus the command channel and heartbeats.

    Args:
        info: this rank (``rank_from_env``).
        backend: ``gloo`` (CPU) or ``nccl`` (GPU).
        collective_timeout_s: bound on any one collective (a rank that hangs or died fails
            the job after at most this long; a dead peer usually fails it at once).
        log_path: this rank's log file (reported when it fails).
    """

    def __init__(self, info: RankInfo, backend: str, collective_timeout_s: float,
                 *, log_path: str | None = None):
        import torch.distributed as dist

        self.info = info
        self.backend = backend
        self.timeout_s = float(collective_timeout_s)
        self.log_path = log_path
        self._seq = 0
        self._diagnosing = False
        self._command = "startup"  # rank 0: the command posted last
        self._stopped = threading.Event()
        self._closed = False
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                if info.world_size > 1:
                    raise RankError("MASTER_PORT is not set: start the learner ranks with torchrun "
                                    "(torchrun --nproc-per-node N -m rl.train ...)")
                from common.process import free_port
                os.environ["MASTER_PORT"] = str(free_port("127.0.0.1"))
            os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size),
                              LOCAL_RANK=str(info.local_rank))
            dist.init_process_group(backend, timeout=timedelta(seconds=self.timeout_s))
        self.store = self._client()
        self._beat_store = self._client()
        self.set_log(log_path)
        self._beat = threading.Thread(target=self._heartbeat, name="rank-heartbeat", daemon=True)
        self._beat.start()

    def _client(self):
        from torch.distributed import TCPStore

        return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False, timeout=timedelta(seconds=max(self.timeout_s, 30.0)),
                        wait_for_workers=False)

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def _heartbeat(self) -> None:
        key = f"{_PREFIX}beat/{self.info.rank}"
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                self._beat_store.add(key, 1)
            except Exception:  # the store is gone: the job is ending; the main thread reports
                return

    # ------------------------------------------------------------------ commands

    def post(self, name: str, *args: Any) -> None:
        """Rank 0: tell the workers to run command ``name(*args)`` next."""
        assert self.info.is_orchestrator
        self._seq += 1
        self._command = name
        if self.world_size > 1:
            self.store.set(f"{_PREFIX}cmd/{self._seq}", pickle.dumps((name, args)))

    def next_command(self) -> tuple[str, tuple]:
        """Worker: block until rank 0 posts the next command; return ``(name, args)``.

        Raises:
            RankFailure: rank 0 stopped beating for ``DEAD_AFTER_S`` or its store is gone.
        """
        self._seq += 1
        key = f"{_PREFIX}cmd/{self._seq}"
        last, since = None, time.monotonic()
        while True:
            try:
                if self.store.check([key]):  # (a timed-out store.wait logs a warning each time)
                    return pickle.loads(self.store.get(key))
            except Exception as e:  # the store is gone with rank 0
                raise RankFailure(f"learner rank {self.rank}: the orchestrator (rank 0) is gone "
                                f"({type(e).__name__}); stopping") from None
            beat = self._counter(0)
            if beat != last:
                last, since = beat, time.monotonic()
            elif time.monotonic() - since > DEAD_AFTER_S:
                raise RankFailure(f"learner rank {self.rank}: the orchestrator (rank 0) stopped "
                                  f"beating {DEAD_AFTER_S:.0f} s ago; stopping")
            time.sleep(COMMAND_POLL_S)

    def _counter(self, rank: int) -> int | None:
        key = f"{_PREFIX}beat/{rank}"
        try:
            return int(self.store.add(key, 0))
        except Exception:
            return None

    def report_error(self, line: str) -> None:
        """Worker: leave one line for rank 0 to report before this rank exits."""
        try:
            self.store.set(f"{_PREFIX}error/{self.rank}", line.encode())
        except Exception:
            pass

    def diagnose(self, exc: BaseException, during: str) -> RankFailure:
        """Rank 0, after a collective failed: which worker failed, in one line.

        A worker that wrote an error line is named with it; otherwise the rank whose
        heartbeat stops within ``DEAD_AFTER_S`` (a killed process); otherwise the
        collective's own error (a hang that hit ``collective_timeout_s``). A SIGTERM that
        arrives meanwhile (torchrun's agent stopping the job because a rank exited) waits
        until the answer is known (see ``stop_on_sigterm``).
        """
        self._diagnosing = True
        try:
            line = self._failure(during, settle=False)
        finally:
            self._diagnosing = False
        if line is not None:
            return RankFailure(line)
        return RankFailure(f"learner collective failed during {during} with every rank alive "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                           "a rank may be stuck: see the learner-rank logs")

    def _failure(self, during: str, settle: bool) -> str | None:
        """The first worker that wrote an error line, else the first whose heartbeat stops
        within ``DEAD_AFTER_S``, as one line naming its log; None when none did. Workers
        marked stopped (``mark_stopped``: ``stop`` read, or SIGTERM) are not failures; ``settle``: return None
        at once when every worker is so marked."""
        workers = range(1, self.world_size)
        deadline = time.monotonic() + DEAD_AFTER_S
        first = {r: self._counter(r) for r in workers}
        stopped: set[int] = set()
        while True:
            for r in workers:
                err = self._get(f"{_PREFIX}error/{r}")
                if err is not None:
                    return (f"learner rank {r} failed during {during}: {err.decode()} "
                            f"(its log: {self._log_of(r)})")
            stopped = {r for r in workers if self._get(f"{_PREFIX}stopped/{r}") is not None}
            if (settle and len(stopped) == len(workers)) or time.monotonic() > deadline:
                break
            time.sleep(HEARTBEAT_S)
        dead = [r for r in workers if r not in stopped and self._counter(r) == first[r]]
        if dead:
            r = dead[0]
            return (f"learner rank {r} died during {during} (no heartbeat for "
                    f"{DEAD_AFTER_S:.0f} s; its log: {self._log_of(r)})")
        return None

    def stop_on_sigterm(self) -> None:
        """Handle SIGTERM on this rank (call from the main thread after ``__init__``).

        torchrun's agent, when one rank exits, sends SIGTERM to every other (and SIGKILL
        30 s later), so rank 0 would end before telling which rank failed. Here a worker
        marks itself stopped in the store and exits 143; rank 0 first names a worker that
        failed or died (waiting at most ``DEAD_AFTER_S``, or for the answer ``diagnose`` is
        already waiting for), in one line on stderr (``error: learner rank r died during
        <the last command> ...``), then exits 143 through ``SystemExit`` so ``finally`` blocks stop
        what it started. When every worker was stopped too (the user stopped the job),
        nothing is named.
        """
        def handler(*_):
            if self.rank != 0:
                self.mark_stopped()
                raise SystemExit(143)
            if self._diagnosing:  # diagnose's answer comes first; the job ends with it
                return
            line = self._failure(self._command, settle=True) if self.world_size > 1 else None
            if line is not None:
                print(f"error: {line}", file=sys.stderr, flush=True)
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, handler)

    def publish(self, key: str, value: str) -> None:
        """Rank 0: make ``value`` readable by every rank (``fetch``)."""
        self.store.set(f"{_PREFIX}value/{key}", value.encode())

    def fetch(self, key: str) -> str:
        """The value rank 0 ``publish``-ed under ``key``, waiting for it while rank 0 beats.

        Raises:
            RankFailure: rank 0 stopped beating first.
        """
        full = f"{_PREFIX}value/{key}"
        last, since = None, time.monotonic()
        while True:
            raw = self._get(full)
            if raw is not None:
                return raw.decode()
            beat = self._counter(0)
            if beat != last:
                last, since = beat, time.monotonic()
            elif time.monotonic() - since > DEAD_AFTER_S:
                raise RankFailure(f"learner rank {self.rank}: the orchestrator (rank 0) stopped "
                                  f"beating before it published {key!r}; stopping")
            time.sleep(HEARTBEAT_S / 2)

    def set_log(self, log_path: str) -> None:
        """Record where this rank logs (named when it fails)."""
        self.log_path = log_path
        self.store.set(f"{_PREFIX}info/{self.rank}", pickle.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "log": log_path}))

    def _get(self, key: str) -> bytes | None:
        try:
            if self.store.check([key]):
                return self.store.get(key)
        except Exception:
            pass
        return None

    def _log_of(self, rank: int) -> str:
        raw = self._get(f"{_PREFIX}info/{rank}")
        if raw is None:
            return "unknown"
        info = pickle.loads(raw)
        return f"{info['host']}:{info['log']}" if info.get("log") else f"{info['host']} pid {info['pid']}"

    def mark_stopped(self) -> None:
        """Worker: record in the store that this rank stopped, not failed (it read ``stop``,
        or torchrun's agent sent SIGTERM); rank 0's ``close`` and ``_failure`` read it."""
        try:
            self.store.set(f"{_PREFIX}stopped/{self.rank}", b"1")
        except Exception:  # the store is gone: rank 0 left already
            pass

    def close(self) -> None:
        """Leave the group: on rank 0 after ``post("stop")``, first wait until every worker
        marked itself stopped (``mark_stopped``; at most ``DEAD_AFTER_S``, less when one wrote
        an error line); then stop the heartbeat
        and destroy the process group. Every rank calls this before it exits: a gloo
        process group left for the interpreter's exit aborts the process ("terminate
        called without an active exception") once rank 0's store is gone. A second call
        does nothing."""
        import torch.distributed as dist

        if self._closed:
            return
        self._closed = True
        if self.info.is_orchestrator and self.world_size > 1 and self._command == "stop":
            self._failure("stop", settle=True)  # until every worker is marked stopped
        self._stopped.set()
        if self._beat.is_alive() and self._beat is not threading.current_thread():
            self._beat.join(timeout=2 * HEARTBEAT_S)
        if dist.is_initialized():
            dist.destroy_process_group()


def redirect_output(log_path: Path) -> None:
    """Send this process's stdout and stderr (Python's and the C++ libraries') to
    ``log_path``: a worker rank's output goes to its log, not the orchestrator's console."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def worker_loop(group: RankGroup, learner_factory) -> int:
    """Run rank 0's commands on this worker rank until ``stop``; return the exit status.

    Commands: ``build(args)`` -> ``learner_factory(group, *args)`` (collective), then any
    public collective method of the learner by name (``step``, ``log_probs``,
    ``save_weights``, ``save_checkpoint``, ``load_checkpoint``), and ``stop``.
    A failure is written to the store for rank 0 to report, and gives exit status 1;
    SIGTERM (torchrun's agent stopping the job) exits 143 without blaming this rank.
    """
    group.stop_on_sigterm()
    learner = None
    name = "startup"
    try:
        while True:
            name, args = group.next_command()
            if name == "stop":
                group.mark_stopped()
                return 0
            if name == "build":
                learner = learner_factory(group, *args)
            elif learner is None:
                raise RankError(f"command {name!r} before build")
            else:
                learner.run_command(name, args)
    except RankError as e:
        print(str(e), flush=True)
        return 1
    except SystemExit:  # SIGTERM (stop_on_sigterm): stopped, not failed
        raise
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, then this rank exits
        line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        group.report_error(f"{line} (in {name})")
        import traceback

        traceback.print_exc()
        return 1
