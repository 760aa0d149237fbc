"""Real vLLM OpenAI-compatible engines: launch, health, shutdown (DESIGN.md step 5).

``EnginePool.start`` brings up ``engine.num_engines`` servers from the config, one per
replica, each with prefix caching on, KV-cache events published over ZMQ on its own
endpoint, Prometheus ``/metrics``, and the dev-mode endpoints the weight sync uses
(``/pause``, ``/collective_rpc``, ``/reset_prefix_cache``, ``/resume``). On CPU the cores
are split between engines (``VLLM_CPU_OMP_THREADS_BIND``); on GPU the devices are
(``CUDA_VISIBLE_DEVICES``, ``tensor_parallel_size`` each, from the front of the job's GPU
list; ``gpu_placement`` also gives the trainer process GPUs of its own after them). Logs go
to the run folder.

KV space per engine is ``engine.kv_cache_space_gib`` (passed as ``--kv-cache-memory-bytes``,
which takes fractions of a GiB; the legacy ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only).

``engine.urls=[...]`` uses engines that already run elsewhere (the multi-node case):
nothing is launched, the URLs are health-checked and used as they are.

The CPU build of vLLM is started as ``python -m vllm.entrypoints.openai.api_server``:
its ``vllm serve`` entry point cannot find the distribution named ``vllm``
(shared/notes/vllm-cpu.md).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx
from omegaconf import DictConfig

from common.process import ManagedProcess, ProcessStartError, free_port, wait_all_healthy
from common.urls import engine_urls_problem, kv_event_endpoints_problem
from rollout.leftovers import (POOL_PREFIX, SHM_DIR, files_in_use, group_pids, mark_owner,
                               sweep_leftovers, wait_groups_gone)


class EngineError(RuntimeError):
    """An engine could not be started or reached; the message says which and why."""


class EngineStartError(EngineError):
    """An engine process did not come up, or a running engine did not answer: a failure at
    run time (exit code 1), not a bad value in the config."""


@dataclass
class EngineHandle:
    """One running engine.

    Attributes:
        index: replica number (0-based).
        url: base URL of its OpenAI-compatible server (``http://host:port``).
        kv_events_endpoint: ZMQ endpoint its KV-cache events are published on
            (``tcp://host:port``), or None if events are off / unknown.
        process: the launched process, or None for an external engine.
        start_s: seconds from launch to healthy (None for an external engine).
    """

    index: int
    url: str
    kv_events_endpoint: str | None
    process: ManagedProcess | None = None
    start_s: float | None = None

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path if self.process else None


def cpu_core_split(num_engines: int, cores: Sequence[int] | None = None) -> list[str]:
    """Split the usable CPU cores into ``num_engines`` contiguous OMP bind lists.

    Returns one ``VLLM_CPU_OMP_THREADS_BIND`` value per engine (e.g. ``["0", "1"]`` for
    two engines on two cores, ``["0-1"]`` for one). With more engines than cores,
    engines share cores round-robin (each still gets one).

    Raises:
        EngineError: ``num_engines`` < 1.
    """
    if num_engines < 1:
        raise EngineError(f"engine.num_engines must be >= 1, got {num_engines}")
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if num_engines >= len(cores):
        return [str(cores[i % len(cores)]) for i in range(num_engines)]
    per = len(cores) // num_engines
    out = []
    for i in range(num_engines):
        chunk = cores[i * per:(i + 1) * per]
        out.append(f"{chunk[0]}-{chunk[-1]}" if len(chunk) > 1 else str(chunk[0]))
    return out


@dataclass(frozen=True)
class GpuPlacement:
    """Which GPUs each process of a job on one machine gets, as ``CUDA_VISIBLE_DEVICES``
    values (the ids of the job's own visible list, so a job given GPUs 4-7 stays on them).

    Attributes:
        engines: one value per local engine, ``tensor_parallel_size`` GPUs each
            (``"0,1"``, ``"2,3"``, ...).
        trainer: the trainer process's value: the learner (on its first GPU), the NCCL
            weight sync and a reward model on GPU; never one of the engines' GPUs.
    """

    engines: tuple[str, ...]
    trainer: str


def gpu_placement(num_engines: int, tensor_parallel_size: int,
                  trainer_gpus: Sequence[int] | None = None,
                  visible: str | None = None) -> GpuPlacement:
    """Split the job's GPUs between the local engines and the trainer process.

    Args:
        num_engines: engines launched on this machine (0 when they run elsewhere).
        tensor_parallel_size: GPUs per engine.
        trainer_gpus: positions in the job's GPU list for the trainer process
            (``trainer.learner.gpus``); None = the one GPU right after the engines'; empty =
            none (a trainer on CPU).
        visible: the job's ``CUDA_VISIBLE_DEVICES`` (comma-separated ids or UUIDs), or
            None when unset (all GPUs, ids 0, 1, ...).

    Engine ``i`` takes positions ``i * tp .. (i + 1) * tp - 1``.

    Raises:
        EngineError: a trainer GPU is also an engine's, a position is negative or
            repeated, or the job's GPU list is too short; the message names the keys.
    """
    tp = int(tensor_parallel_size)
    if tp < 1 or num_engines < 0:
        raise EngineError(f"engine.tensor_parallel_size={tp}, engine.num_engines={num_engines}: "
                          "give a whole number >= 1 for each")
    used = num_engines * tp
    trainer = [used] if trainer_gpus is None else [int(g) for g in trainer_gpus]
    if any(g < 0 for g in trainer) or len(set(trainer)) != len(trainer):
        raise EngineError(f"trainer.learner.gpus={list(trainer)}: give distinct GPU positions "
                          ">= 0 (or null for the first GPU after the engines')")
    overlap = sorted(g for g in trainer if g < used)
    if overlap:
        raise EngineError(
            f"trainer.learner.gpus={trainer} overlaps the engines' GPUs (positions 0-{used - 1}: "
            f"engine.num_engines={num_engines} x engine.tensor_parallel_size={tp}) at {overlap}; "
            f"give positions >= {used}, or fewer or smaller engines")
    need = max([used - 1, *trainer]) + 1
    if visible is None:
        ids = [str(i) for i in range(need)]
    else:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        if need > len(ids):
            raise EngineError(
                f"this job sees {len(ids)} GPUs (CUDA_VISIBLE_DEVICES={visible}) but the engines "
                f"({num_engines} x {tp}) and trainer.learner.gpus={trainer} need {need}")
    return GpuPlacement(
        engines=tuple(",".join(ids[i * tp:(i + 1) * tp]) for i in range(num_engines)),
        trainer=",".join(ids[g] for g in trainer))


def engine_argv(ecfg: DictConfig, model_path: str, served_name: str, max_model_len: int,
                dtype: str, port: int, kv_port: int | None) -> list[str]:
    """The command line of one vLLM server for config ``engine`` (``ecfg``)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_path, "--served-model-name", served_name,
            "--host", str(ecfg.host), "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--max-num-seqs", str(ecfg.max_num_seqs),
            "--enable-prefix-caching", "--disable-uvicorn-access-log",
            "--seed", str(ecfg.seed)]
    if ecfg.enforce_eager:
        argv.append("--enforce-eager")
    if ecfg.block_size:
        argv += ["--block-size", str(ecfg.block_size)]
    if ecfg.kv_cache_space_gib is not None:
        # VLLM_CPU_KVCACHE_SPACE takes whole GiB only; the flag takes bytes, on CPU and GPU.
        argv += ["--kv-cache-memory-bytes", str(int(float(ecfg.kv_cache_space_gib) * 2**30))]
    if ecfg.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(ecfg.max_num_batched_tokens)]
    if ecfg.kind == "gpu":
        argv += ["--tensor-parallel-size", str(ecfg.tensor_parallel_size),
                 "--gpu-memory-utilization", str(ecfg.gpu_memory_utilization)]
    if kv_port is not None:
        argv += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{kv_port}", "topic": "kv-events"})]
    argv += [str(a) for a in ecfg.extra_args]
    return argv


def engine_env(ecfg: DictConfig, index: int) -> dict[str, str]:
    """Environment of engine ``index``: device/core split (``gpu_placement`` over the job's
    ``CUDA_VISIBLE_DEVICES``), dev endpoints, then ``engine.env``."""
    env = {"VLLM_SERVER_DEV_MODE": "1",  # /pause, /collective_rpc, /reset_prefix_cache
           "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
           "TOKENIZERS_PARALLELISM": "false"}
    if ecfg.kind == "cpu":
        binds = cpu_core_split(int(ecfg.num_engines))
        env["VLLM_CPU_OMP_THREADS_BIND"] = binds[index]
    else:
        split = gpu_placement(int(ecfg.num_engines), int(ecfg.tensor_parallel_size),
                              trainer_gpus=(), visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
        env["CUDA_VISIBLE_DEVICES"] = split.engines[index]
    env.update({str(k): str(v) for k, v in (ecfg.env or {}).items()})
    return env


def inductor_cache_dir() -> str:
    """Torch's compile cache folder: ``TORCHINDUCTOR_CACHE_DIR``, else torch's default
    ``<system temp>/torchinductor_<user>`` (pinned before a process's temp folder moves,
    so compiled code is reused across runs)."""
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")


def private_temp_env(temp_dir: Path) -> dict[str, str]:
    """Environment that sends an engine's temporary files to ``temp_dir``.

    vLLM writes its distributed-init file store (``vllm_dist_<hex>``) and its RPC sockets
    (``ipc://<temp>/<uuid>``) into the system temp folder and leaves them there. In a folder
    of the pool's own they are removed with it. Torch's compile cache keeps its usual
    place (``<system temp>/torchinductor_<user>``), so compiled engines reuse it across runs.
    """
    return {"TMPDIR": str(temp_dir), "VLLM_RPC_BASE_PATH": str(temp_dir),
            "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}


def validate_engine_cfg(ecfg: DictConfig) -> None:
    """Check the ``engine`` group's values before anything starts.

    Raises:
        EngineError: a value has the wrong type or range; the message names the key,
            the value and what is allowed.
    """
    def bad(key: str, want: str) -> EngineError:
        return EngineError(f"engine.{key}={ecfg.get(key)!r} is invalid: {want}.")

    if ecfg.kind not in ("cpu", "gpu"):
        raise bad("kind", "use cpu or gpu")
    for key, lo in (("num_engines", 1), ("max_num_seqs", 1), ("tensor_parallel_size", 1),
                    ("startup_timeout_s", 1), ("seed", 0)):
        v = ecfg.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or int(v) != v:
            raise bad(key, f"give a whole number >= {lo}")
    for key in ("block_size", "max_num_batched_tokens"):
        v = ecfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise bad(key, "give a whole number >= 1, or null for the engine's default")
    v = ecfg.get("kv_cache_space_gib")
    if v is None and ecfg.kind == "cpu" or v is not None and (
            isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
        raise bad("kv_cache_space_gib", "give a size in GiB > 0 (e.g. 0.5)"
                  + ("" if ecfg.kind == "cpu" else ", or null to size it by gpu_memory_utilization"))
    for key in ("enforce_eager", "kv_events"):
        if not isinstance(ecfg.get(key), bool):
            raise bad(key, "use true or false")
    v = ecfg.get("request_timeout_s")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
        raise bad("request_timeout_s", "give seconds > 0, or null for the router's default")
    if not 0 < float(ecfg.gpu_memory_utilization) <= 1:
        raise bad("gpu_memory_utilization", "give a fraction in (0, 1]")
    problem = engine_urls_problem(ecfg.get("urls") or [], "engine.urls") or kv_event_endpoints_problem(
        ecfg.get("kv_event_endpoints") or [], "engine.kv_event_endpoints", len(ecfg.get("urls") or []))
    if problem is not None:  # before any health check waits startup_timeout_s on it
        raise EngineError(problem)
    urls, kv = list(ecfg.get("urls") or []), list(ecfg.get("kv_event_endpoints") or [])
    if urls and not kv and ecfg.kv_events:
        # Without this the router started and exited on engines.kv_event_endpoints=[null].
        raise EngineError(
            f"engine.urls gives {len(urls)} running engine(s) but engine.kv_event_endpoints is "
            "empty: give one ZMQ endpoint per URL, same order (e.g. engine.kv_event_endpoints="
            "[tcp://node1:5557,tcp://node2:5557], engines started with --kv-events-config), or "
            "set engine.kv_events=false to route without KV events (no prefix index)")
    if kv and not ecfg.kv_events:
        raise EngineError("engine.kv_event_endpoints is given but engine.kv_events=false: drop "
                          "the endpoints, or set engine.kv_events=true to use them")


def wait_until_healthy(url: str, timeout_s: float) -> None:
    """Poll ``url/health`` until it answers 200.

    Raises:
        EngineError: no 200 within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/health", timeout=5)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = str(e) or type(e).__name__
        time.sleep(1.0)
    raise EngineStartError(f"engine {url} did not answer /health within {timeout_s:.0f} s ({last}). "
                      "Check that it is running and reachable from here.")


class EnginePool:
    """The engines of one job: launched here, or external ones given by URL.

    Use as a context manager, or call ``stop()``; stopping ends every process group it
    started (external engines are left running) and removes ``temp_dir``, the engines'
    temporary folder (``private_temp_env``).
    """

    def __init__(self, handles: list[EngineHandle], temp_dir: Path | None = None):
        self.handles = handles
        self.temp_dir = temp_dir

    @property
    def urls(self) -> list[str]:
        return [h.url for h in self.handles]

    @property
    def kv_events_endpoints(self) -> list[str]:
        """The engines' KV-event endpoints, in order, for the router; [] when the engines
        publish none (``engine.kv_events=false``): the router then runs without KV events
        (empty prefix index, DESIGN.md: missing signals degrade, never crash)."""
        kv = [h.kv_events_endpoint for h in self.handles]
        return [e for e in kv if e is not None] if all(kv) else []

    @classmethod
    def start(cls, ecfg: DictConfig, model_path: str, served_name: str, max_model_len: int,
              dtype: str, log_dir: Path) -> "EnginePool":
        """Launch (or attach to) the engines of config ``engine``; block until all are healthy.

        Raises:
            EngineError: an engine did not come up; the message carries its last log lines.
                Engines already started are stopped first.
        """
        validate_engine_cfg(ecfg)
        if ecfg.urls:
            kv = [str(e).strip() for e in ecfg.kv_event_endpoints or []]
            handles = [EngineHandle(i, str(u).rstrip("/"), kv[i] if kv else None)
                       for i, u in enumerate(ecfg.urls)]
            for h in handles:
                wait_until_healthy(h.url, float(ecfg.startup_timeout_s))
            return cls(handles)

        handles: list[EngineHandle] = []
        sweep_leftovers()  # what engines of a killed job left in /dev/shm and the temp folder
        # A short path: a Unix socket's path is limited to 107 bytes.
        temp_dir = Path(tempfile.mkdtemp(prefix=POOL_PREFIX))
        mark_owner(temp_dir)
        for i in range(int(ecfg.num_engines)):
            port = free_port(ecfg.host)
            kv_port = free_port(ecfg.host) if ecfg.kv_events else None
            proc = ManagedProcess(
                name=f"engine-{i}",
                argv=engine_argv(ecfg, model_path, served_name, max_model_len, dtype, port, kv_port),
                log_path=Path(log_dir) / f"engine-{i}.log",
                health_url=f"http://{ecfg.host}:{port}/health",
                env={**private_temp_env(temp_dir), **engine_env(ecfg, i)},  # engine.env wins
            )
            handles.append(EngineHandle(
                i, f"http://{ecfg.host}:{port}",
                f"tcp://{ecfg.host}:{kv_port}" if kv_port else None, proc))
        pool = cls(handles, temp_dir)
        try:
            for h in handles:
                h.process.start()
            # in this thread: a Ctrl-C or SIGTERM ends the wait at once (wait_all_healthy)
            starts = wait_all_healthy([h.process for h in handles], float(ecfg.startup_timeout_s),
                                      poll_s=2.0)
            for h, s in zip(handles, starts):
                h.start_s = s
        except ProcessStartError as e:
            pool.stop()
            raise EngineStartError(str(e)) from None
        except BaseException:
            pool.stop()
            raise
        return pool

    def stop(self) -> None:
        """Stop every engine this pool launched (in parallel), then remove what they left in
        /dev/shm (:func:`rollout.leftovers.sweep_leftovers`, its rules: only segments nobody
        maps or holds open; older than a minute, or held by these engines just before the
        stop): an engine stopped by its job can leave its ring buffers (160-250 MB each; a
        full ``make test`` left two, a ``make run`` one written until its end), which the
        sweep at the next pool start would only catch if there were one."""
        procs = [h.process for h in self.handles if h.process is not None]
        groups = [p.pid for p in procs if p.pid is not None]  # an engine's pid is its group id
        held: set[tuple[int, int]] = set()
        try:
            if groups and SHM_DIR.is_dir():
                held = files_in_use(SHM_DIR, group_pids(groups))
        except OSError:  # a hint for the sweep only: the engines are stopped regardless
            held = set()
        if procs:
            with ThreadPoolExecutor(len(procs)) as ex:
                list(ex.map(lambda p: p.stop(), procs))
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        if procs:
            # the leader is reaped; its workers may still be exiting and still list their
            # mappings: give them a moment (SIGKILLed already), or their segments stay
            wait_groups_gone(groups)
            sweep_leftovers(released=held)

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
