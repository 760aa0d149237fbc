"""Push new policy weights into running vLLM engines without restarting them
(DESIGN.md step 8).

Two methods, chosen by ``WeightSyncConfig.method``:

``http_reload`` (one machine; what runs on this CPU): the trainer writes the weights as
safetensors into a shared-memory folder (``/dev/shm``), then for every engine, in
parallel: ``POST /pause`` -> ``POST /collective_rpc`` ``reload_weights(weights_path=...)``
-> ``POST /reset_prefix_cache`` -> ``POST /resume`` (the dev-mode endpoints that
``rollout/engines.py`` turns on with ``VLLM_SERVER_DEV_MODE=1``; shared/notes/vllm-cpu.md,
"Updating weights"). Each phase is timed.

``nccl`` (GPUs): the engines run with ``--worker-extension-cls
rollout.weight_sync.NcclWeightSyncWorker`` (``WORKER_EXTENSION``). ``NcclWeightSync.connect``
builds one NCCL group of trainer rank 0 plus every engine worker; a sync pauses the
engines, tells them over ``/collective_rpc`` which tensors follow
(``misa_receive_weights``), broadcasts each tensor from the trainer, and the workers load
them with ``model.load_weights``. Not yet run on a GPU (the development machine has none).

After either, the engine's prefix cache is empty, and the router is told so
(``POST {router}/admin/reset_prefix_index`` with ``{"instance": engine_url}``) so its prefix
index drops the instance's blocks at once rather than waiting for the KV event.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import httpx

from common.options import build_options

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A weight sync failed; the message names the engine, the step and the reply."""


@dataclass
class WeightSyncConfig:
    """Options of the weight sync.

    Attributes:
        method: ``http_reload`` (shared-memory folder + reload_weights) or ``nccl``.
        shm_dir: where ``http_reload`` writes the weights (a tmpfs such as /dev/shm keeps
            the write and the engines' read in memory). One subfolder per version; the
            previous one is deleted after a successful sync.
        pause_mode: what ``/pause`` does with requests in flight: ``wait`` (let them
            finish, then update), ``keep`` (freeze them; they continue on the new
            weights), ``abort`` (cancel them).
        request_timeout_s: HTTP timeout of each call to an engine.
        reset_retries: ``/reset_prefix_cache`` answers success=false while blocks are
            still held; retry this many times, 0.2 s apart.
        router_url: the router to tell about the reset, or None (no router).
        nccl_master_address / nccl_master_port: the trainer's rendezvous for ``nccl``.
    """

    method: str = "http_reload"
    shm_dir: str = "/dev/shm/misa-rl-weights"
    pause_mode: str = "wait"
    request_timeout_s: float = 300.0
    reset_retries: int = 25
    router_url: str | None = None
    nccl_master_address: str = "127.0.0.1"
    nccl_master_port: int = 29555

    def __post_init__(self) -> None:
        if self.method not in ("http_reload", "nccl"):
            raise WeightSyncError(f"weight_sync.method={self.method!r}: choose http_reload or nccl")
        if self.pause_mode not in ("wait", "keep", "abort"):
            raise WeightSyncError(f"weight_sync.pause_mode={self.pause_mode!r}: choose wait, "
                                  "keep or abort")


@dataclass
class EngineSyncTiming:
    """Seconds each phase took on one engine."""

    engine_url: str
    pause_s: float = 0.0
    load_s: float = 0.0
    reset_s: float = 0.0
    resume_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.pause_s + self.load_s + self.reset_s + self.resume_s


@dataclass
class SyncReport:
    """What one sync did and how long it took.

    Attributes:
        policy_version: the version now served.
        write_s: writing the weights (http_reload) or broadcasting them (nccl).
        total_s: wall time of the whole sync, trainer's view.
        engines: per-engine phase timings.
        router_errors: engine URL -> why the router could not be told (empty = all told,
            or no router configured).
    """

    policy_version: int
    write_s: float
    total_s: float
    engines: list[EngineSyncTiming] = field(default_factory=list)
    router_errors: dict[str, str] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        """Flat numbers for the run log."""
        worst = max(self.engines, key=lambda e: e.total_s) if self.engines else EngineSyncTiming("")
        return {"weight_sync/total_s": self.total_s, "weight_sync/write_s": self.write_s,
                "weight_sync/pause_s": worst.pause_s, "weight_sync/load_s": worst.load_s,
                "weight_sync/reset_s": worst.reset_s, "weight_sync/resume_s": worst.resume_s}


class _EngineControl:
    """The dev-mode endpoints of a set of engines, and the router notice; shared by both
    sync methods."""

    def __init__(self, engine_urls: Sequence[str], cfg: WeightSyncConfig,
                 client: httpx.Client | None = None):
        if not engine_urls:
            raise WeightSyncError("weight sync needs at least one engine URL")
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.cfg = cfg
        self._http = client or httpx.Client(timeout=cfg.request_timeout_s)

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()

    def _post(self, url: str, path: str, what: str, **kw) -> httpx.Response:
        try:
            r = self._http.post(f"{url}{path}", **kw)
        except httpx.TimeoutException:
            raise WeightSyncError(
                f"engine {url}: {what} did not answer within weight_sync.request_timeout_s="
                f"{self.cfg.request_timeout_s:g} s (with pause_mode=wait a pause waits for the "
                "generations in flight: raise the timeout, or use pause_mode=keep)") from None
        except httpx.HTTPError as e:
            raise WeightSyncError(f"engine {url}: {what} failed ({type(e).__name__}: {e}); "
                                  "is the engine still running?") from None
        if r.status_code == 404:
            raise WeightSyncError(f"engine {url}: {what} answered HTTP 404: the engine has no "
                                  "such endpoint; start it with VLLM_SERVER_DEV_MODE=1 "
                                  "(rollout/engines.py does)")
        if r.status_code != 200:
            raise WeightSyncError(f"engine {url}: {what} answered HTTP {r.status_code}: "
                                  f"{r.text[:300]}")
        return r

    def pause(self, url: str) -> None:
        self._post(url, "/pause", "POST /pause", params={"mode": self.cfg.pause_mode})

    def resume(self, url: str) -> None:
        self._post(url, "/resume", "POST /resume")

    def rpc(self, url: str, method: str, args: Sequence[str] = (), kwargs: Mapping[str, str] | None = None) -> Any:
        """``POST /collective_rpc`` (string arguments only, as vLLM requires)."""
        body = {"method": method, "args": list(args), "kwargs": dict(kwargs or {})}
        r = self._post(url, "/collective_rpc", f"collective_rpc {method}", json=body)
        return r.json().get("results") if r.content else None

    def reset_prefix_cache(self, url: str) -> None:
        """Reset, retrying while the engine still holds blocks."""
        for _ in range(self.cfg.reset_retries + 1):
            r = self._post(url, "/reset_prefix_cache", "POST /reset_prefix_cache")
            if not r.content or r.json().get("success", True):
                return
            time.sleep(0.2)
        raise WeightSyncError(f"engine {url}: /reset_prefix_cache kept answering success=false "
                              f"({self.cfg.reset_retries} retries): blocks are still held by "
                              "running requests; use weight_sync.pause_mode=wait")

    def notify_router(self) -> dict[str, str]:
        """Tell the router each engine's prefix cache is empty; returns failures."""
        errors: dict[str, str] = {}
        if not self.cfg.router_url:
            return errors
        for url in self.engine_urls:
            try:
                r = self._http.post(f"{self.cfg.router_url.rstrip('/')}/admin/reset_prefix_index",
                                    json={"instance": url})
                if r.status_code != 200:
                    errors[url] = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                errors[url] = f"{type(e).__name__}: {e}"
        for url, why in errors.items():
            log.warning("router %s not told of the prefix-cache reset of %s (%s); its index "
                        "clears on the engine's AllBlocksCleared event instead",
                        self.cfg.router_url, url, why)
        return errors

    def update_all(self, load: Callable[[str], None]) -> list[EngineSyncTiming]:
        """pause -> load(url) -> reset -> resume on every engine in parallel. Once the
        pause was sent the engine is resumed whatever failed after (a pause that timed out
        included); the first failure is raised afterwards, naming the step.

        Raises:
            WeightSyncError: a step failed on an engine (the message says which and why).
        """

        def one(url: str) -> EngineSyncTiming:
            t = EngineSyncTiming(url)
            marks = [time.perf_counter()]
            try:
                # Once /pause is sent the engine may be paused, whether or not the answer
                # arrives (a timed-out pause still takes effect), so resume is always sent.
                self.pause(url)
                marks.append(time.perf_counter())
                load(url)
                marks.append(time.perf_counter())
                self.reset_prefix_cache(url)
                marks.append(time.perf_counter())
            except BaseException as failed:
                try:
                    self.resume(url)
                except WeightSyncError as e:
                    raise WeightSyncError(f"{failed}; and the engine may still be paused: {e}") from None
                raise
            self.resume(url)
            marks.append(time.perf_counter())
            t.pause_s, t.load_s, t.reset_s, t.resume_s = (b - a for a, b in zip(marks, marks[1:]))
            return t

        with ThreadPoolExecutor(len(self.engine_urls)) as ex:
            return list(ex.map(one, self.engine_urls))


class WeightSource(Protocol):
    """Where a weight sync reads the new policy weights from (the trainer's learner)."""

    def save_weights(self, folder: Path) -> object:
        """Write every weight an engine loads into ``folder`` as safetensors (``http_reload``)."""

    def weights_for_sync(self, to_cpu: bool = True) -> Mapping[str, Any]:
        """name -> tensor of every weight an engine loads, on the learner's device when
        ``to_cpu`` is false (``nccl``)."""


class WeightSync(Protocol):
    """What the trainer calls after an optimizer step: one ``sync`` for both methods."""

    def sync(self, source: WeightSource, policy_version: int) -> "SyncReport":
        """Load ``source``'s weights (policy version ``policy_version``) into every engine,
        reset their prefix caches and tell the router.

        Raises:
            WeightSyncError: an engine refused a step.
        """

    def close(self) -> None:
        """Release connections and any copy of the weights the sync holds."""


class HttpReloadSync:
    """Weight sync through a shared-memory folder and ``reload_weights`` (one machine).

    Args:
        engine_urls: base URLs of the engines.
        cfg: options (``method`` must be ``http_reload``).
        client: the HTTP client to use (tests pass one with a mock transport).
    """

    def __init__(self, engine_urls: Sequence[str], cfg: WeightSyncConfig | None = None,
                 client: httpx.Client | None = None):
        self.cfg = cfg or WeightSyncConfig()
        self.control = _EngineControl(engine_urls, self.cfg, client)
        self._last_dir: Path | None = None

    def sync(self, source: WeightSource, policy_version: int) -> SyncReport:
        """Write the weights with ``source.save_weights(folder)`` (``rl.learner.Learner``:
        safetensors, the tied lm_head included) and load them into every engine.

        Raises:
            WeightSyncError: an engine refused a step (the engines are resumed first, and
                this version's folder is removed).
        """
        t0 = time.perf_counter()
        folder = Path(self.cfg.shm_dir) / f"v{policy_version}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        try:
            source.save_weights(folder)
            write_s = time.perf_counter() - t0
            timings = self.control.update_all(
                lambda url: self.control.rpc(url, "reload_weights",
                                             kwargs={"weights_path": str(folder)}))
        except BaseException:
            # a failed sync leaves no copy of the weights (~0.5 GB for 135M) in shared memory
            shutil.rmtree(folder, ignore_errors=True)
            raise
        router_errors = self.control.notify_router()
        if self._last_dir is not None and self._last_dir != folder:
            shutil.rmtree(self._last_dir, ignore_errors=True)
        self._last_dir = folder
        return SyncReport(policy_version, write_s, time.perf_counter() - t0, timings, router_errors)

    def close(self) -> None:
        """Close connections and delete the last weights folder (and ``shm_dir`` when
        nothing else is left in it)."""
        self.control.close()
        if self._last_dir is not None:
            shutil.rmtree(self._last_dir, ignore_errors=True)
        try:
            Path(self.cfg.shm_dir).rmdir()
        except OSError:  # absent, or holds another run's folders
            pass


# --------------------------------------------------------------------------- NCCL (GPU)


def _tensor_meta(named: Iterable[tuple[str, Any]]) -> list[list[Any]]:
    """[[name, dtype name, shape], ...] for the engines to allocate receive buffers."""
    return [[n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in named]


WORKER_EXTENSION = "rollout.weight_sync.NcclWeightSyncWorker"


class NcclWeightSyncWorker:
    """vLLM worker extension (``--worker-extension-cls rollout.weight_sync.NcclWeightSyncWorker``).

    vLLM mixes this class into each GPU worker, so ``self.device`` and
    ``self.model_runner`` are the worker's. The trainer calls the methods through
    ``POST /collective_rpc`` (string arguments only). Every name here starts with
    ``misa_``: vLLM refuses to start a worker whose class already has a name of the
    extension (its GPU worker has its own ``update_weights`` since 0.32).
    """

    def misa_init_weight_group(self, master_address: str, master_port: str,
                               rank_offset: str, world_size: str) -> None:
        """Join the trainer's NCCL group as rank ``rank_offset + this worker's rank``."""
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.parallel_state import get_world_group
        from vllm.distributed.utils import StatelessProcessGroup

        rank = get_world_group().rank + int(rank_offset)
        pg = StatelessProcessGroup.create(host=master_address, port=int(master_port),
                                          rank=rank, world_size=int(world_size))
        self._misa_weight_group = PyNcclCommunicator(pg, device=self.device)

    def misa_receive_weights(self, meta_json: str) -> None:
        """Receive every tensor listed in ``meta_json`` (``_tensor_meta``) from trainer
        rank 0, in order, and load each into the model."""
        import torch

        model = self.model_runner.get_model()
        for name, dtype, shape in json.loads(meta_json):
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self._misa_weight_group.broadcast(buf, src=0,
                                              stream=torch.cuda.current_stream(self.device))
            model.load_weights(weights=[(name, buf)])
            del buf
        torch.cuda.synchronize(self.device)


class NcclWeightSync:
    """Trainer side of the NCCL weight sync (GPU only; not yet run on a GPU).

    Args:
        engine_urls: base URLs of engines started with ``--worker-extension-cls``
            ``WORKER_EXTENSION``.
        workers_per_engine: GPU workers per engine (its tensor-parallel size).
        cfg: options (rendezvous address/port).
        device: the trainer's CUDA device, with its index (where the learner's weights are).
    """

    def __init__(self, engine_urls: Sequence[str], workers_per_engine: int = 1,
                 cfg: WeightSyncConfig | None = None, *, device: str = "cuda:0"):
        self.cfg = cfg or WeightSyncConfig(method="nccl")
        self.control = _EngineControl(engine_urls, self.cfg)
        self.workers_per_engine = int(workers_per_engine)
        self.device = device
        self._group = None

    def connect(self) -> None:
        """Form the NCCL group: trainer rank 0, engine e's workers from 1 + e * tp.

        Raises:
            WeightSyncError: no CUDA device, or an engine refused to join.
        """
        import torch

        if not torch.cuda.is_available():
            raise WeightSyncError("weight_sync.method=nccl needs a CUDA device on the trainer; "
                                  "use http_reload on CPU")
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        n = len(self.control.engine_urls)
        world = 1 + n * self.workers_per_engine
        addr, port = self.cfg.nccl_master_address, str(self.cfg.nccl_master_port)
        # The engines block in the rendezvous until the trainer joins: call them from threads.
        with ThreadPoolExecutor(n) as ex:
            futs = [ex.submit(self.control.rpc, url, "misa_init_weight_group",
                              [addr, port, str(1 + i * self.workers_per_engine), str(world)])
                    for i, url in enumerate(self.control.engine_urls)]
            pg = StatelessProcessGroup.create(host=addr, port=int(port), rank=0, world_size=world)
            group = PyNcclCommunicator(pg, device=self.device)
            for f in futs:
                f.result()
        if group.disabled:
            # vLLM turns the communicator off without a word when it finds no NCCL library
            # (or VLLM_DISABLE_PYNCCL is set); the broadcasts would then send nothing.
            raise WeightSyncError("weight_sync.method=nccl: vLLM's NCCL communicator is "
                                  "disabled in the trainer (no NCCL library found, or "
                                  "VLLM_DISABLE_PYNCCL set); use http_reload")
        self._group = group

    def sync(self, source: WeightSource, policy_version: int) -> SyncReport:
        """Broadcast ``source.weights_for_sync(to_cpu=False)`` (the learner's tensors, from
        its GPU; nothing is written to disk) to every engine.

        Raises:
            WeightSyncError: ``connect`` was not called, or an engine failed.
        """
        import torch

        if self._group is None:
            raise WeightSyncError("call NcclWeightSync.connect() before the first sync")
        t0 = time.perf_counter()
        items = list(source.weights_for_sync(to_cpu=False).items())
        meta = json.dumps(_tensor_meta(items))
        # Every engine is paused and called before the broadcasts start; if one fails, the
        # barrier times out and breaks instead of leaving the others waiting forever.
        done = threading.Barrier(len(self.control.engine_urls) + 1,
                                 timeout=self.cfg.request_timeout_s)
        write: dict[str, Any] = {"s": 0.0, "error": None}

        def load(url: str) -> None:
            # All engines must be inside misa_receive_weights before the broadcasts start.
            with ThreadPoolExecutor(1) as ex:
                fut = ex.submit(self.control.rpc, url, "misa_receive_weights", [meta])
                try:
                    done.wait()
                except threading.BrokenBarrierError:
                    raise WeightSyncError(f"engine {url}: another engine failed before the "
                                          "NCCL broadcast; weights not updated") from None
                fut.result()

        def broadcast() -> None:
            try:
                done.wait()
            except threading.BrokenBarrierError:
                return
            tb = time.perf_counter()
            # the stream of the communicator's device, not of whatever device is current
            stream = torch.cuda.current_stream(self._group.device)
            try:
                for _, t in items:
                    self._group.broadcast(t.to(self._group.device).contiguous(), src=0,
                                          stream=stream)
                torch.cuda.synchronize(self._group.device)
            except Exception as e:  # reported after the engines' calls return
                write["error"] = e
            write["s"] = time.perf_counter() - tb

        sender = threading.Thread(target=broadcast, name="nccl-broadcast")
        sender.start()
        try:
            timings = self.control.update_all(load)
        finally:
            sender.join()
        if write["error"] is not None:
            raise WeightSyncError(f"NCCL broadcast from the trainer failed: {write['error']}")
        router_errors = self.control.notify_router()
        return SyncReport(policy_version, write["s"], time.perf_counter() - t0, timings, router_errors)

    def close(self) -> None:
        """Close the HTTP client."""
        self.control.close()


def make_weight_sync(cfg: WeightSyncConfig, engine_urls: Sequence[str],
                     workers_per_engine: int = 1,
                     device: str = "cuda:0") -> HttpReloadSync | NcclWeightSync:
    """The sync of ``cfg.method`` for these engines (NCCL: ``device`` is the trainer's
    CUDA device; call ``connect()`` next)."""
    if cfg.method == "nccl":
        return NcclWeightSync(engine_urls, workers_per_engine, cfg, device=device)
    return HttpReloadSync(engine_urls, cfg)


def job_shm_dir(parent: str | os.PathLike, run_name: str) -> Path:
    """This job's own weights folder under ``parent`` (``trainer.weight_sync.shm_dir``):
    ``<parent>/<run folder name>-<pid>``, so two jobs on one machine never share one; the
    pid lets ``remove_stale_shm_dirs`` tell a killed job's folder from a running one's."""
    return Path(parent) / f"{run_name}-{os.getpid()}"


def remove_stale_shm_dirs(parent: str | os.PathLike) -> list[Path]:
    """Remove the ``job_shm_dir`` folders under ``parent`` whose job (the pid their name
    ends with) is no longer running: a job killed with SIGKILL cannot remove its own
    weights (0.5 GB for 135M, in memory on a tmpfs). Folders of running jobs, other
    users' and names without a pid are left alone. Returns the folders removed."""
    removed = []
    root = Path(parent)
    for entry in (root.iterdir() if root.is_dir() else ()):
        name, _, pid = entry.name.rpartition("-")
        if not (name and pid.isdigit() and entry.is_dir()):
            continue
        try:
            os.kill(int(pid), 0)
            continue  # running (or a reused pid: kept, to be safe)
        except ProcessLookupError:
            pass
        except PermissionError:  # another user's running process
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def weight_sync_config(opts: Mapping[str, Any], router_url: str | None = None) -> WeightSyncConfig:
    """``WeightSyncConfig`` from ``trainer.weight_sync`` plus the router's URL.

    Raises:
        WeightSyncError: unknown or invalid option.
    """
    return build_options(WeightSyncConfig, {**dict(opts), "router_url": router_url},
                         "trainer.weight_sync", error=WeightSyncError)
