"""Start the router in front of running engines, as a managed child process.

``start_router`` runs either our router (``python -m router`` with the recipe's policy)
or, for a recipe with ``impl: vllm``, the real vLLM Router program (PyPI
``vllm-router``, policy ``cache_aware``), health-checks it and hands back a
:class:`RouterHandle`. Both log to ``log_dir/router.log`` and die with the job
(``common.process.ManagedProcess``).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from common.process import ManagedProcess, free_port

from router.policies.base import RouterConfigError, UnknownOptionError
from common.urls import engine_urls_problem, normalize_engine_urls

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RouterHandle:
    """A started router.

    Attributes:
        url: base URL (``http://127.0.0.1:PORT``); OpenAI routes under ``/v1``.
        kind: ``ours`` or ``vllm``.
        process: the managed child process.
        metrics_url: where its Prometheus metrics are (``vllm``: its own ``--prometheus-port``;
            ``ours``: ``url``), ``<metrics_url>/metrics``.
    """

    url: str
    kind: str
    process: ManagedProcess
    metrics_url: str | None = None

    def stop(self) -> None:
        """Stop the router's process group (SIGTERM, then SIGKILL)."""
        self.process.stop()


def _hydra_value(value: Any) -> str:
    """Encode a Python value in Hydra's override grammar (quoted strings, lists, dicts)."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return json.dumps(value)


def _vllm_router_binary() -> str:
    candidate = Path(sys.executable).parent / "vllm-router"
    found = str(candidate) if candidate.exists() else shutil.which("vllm-router")
    if not found:
        raise RouterConfigError("router=vllm needs the vllm-router program: pip install vllm-router")
    return found


VLLM_ROUTER_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""``vllm-router --log-level`` choices (0.1.17); ``router.log_level`` of ``recipes/router/vllm.yaml``."""


def _vllm_log_level(router_cfg: Mapping[str, Any]) -> str:
    """``router.log_level`` of a ``router=vllm`` config (default ``info``).

    Raises:
        RouterConfigError: not one of :data:`VLLM_ROUTER_LOG_LEVELS`.
    """
    log_level = str(router_cfg.get("log_level", "info"))
    if log_level not in VLLM_ROUTER_LOG_LEVELS:
        raise RouterConfigError(f"router.log_level={log_level!r} is not one of vllm-router's levels: "
                                f"{', '.join(VLLM_ROUTER_LOG_LEVELS)}")
    return log_level


def router_argv(
    router_cfg: Mapping[str, Any],
    engine_urls: Sequence[str],
    kv_event_endpoints: Sequence[str],
    model_path: str | None,
    port: int,
    extra_overrides: Sequence[str] = (),
    request_timeout_s: float | None = None,
    metrics_port: int | None = None,
) -> list[str]:
    """The command line that starts the router described by ``router_cfg`` on ``port``.

    ``router_cfg`` is a ``recipes/router/<name>.yaml`` (as a mapping): ``impl`` (``ours``
    or ``vllm``), ``policy``, ``params``, and for ``vllm`` the cache_aware thresholds.
    ``extra_overrides`` are further Hydra overrides for ours (``signals.scrape_interval_s=1``).
    ``request_timeout_s``: longest wait for one engine answer (``engine.request_timeout_s``);
    None = the router's own default. ``metrics_port``: vllm-router's ``--prometheus-port``
    (None: a free one; it defaults to a fixed 29000 that two routers would share).

    Raises:
        RouterConfigError: unknown ``impl``, an engine URL that is not ``http(s)://host:port``
            (named as ``engine.urls``), or ``vllm-router`` not installed.
    """
    impl = router_cfg.get("impl", "ours")
    problem = engine_urls_problem(engine_urls, "engine.urls")
    if problem is not None:
        raise RouterConfigError(problem)
    urls = normalize_engine_urls(engine_urls)
    if impl == "vllm":
        log_level = _vllm_log_level(router_cfg)
        timeout = ([] if request_timeout_s is None
                   else ["--request-timeout-secs", str(max(1, round(float(request_timeout_s))))])
        return [
            _vllm_router_binary(), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
            "--policy", "cache_aware",
            "--cache-threshold", str(router_cfg["cache_threshold"]),
            "--balance-abs-threshold", str(router_cfg["balance_abs_threshold"]),
            "--balance-rel-threshold", str(router_cfg["balance_rel_threshold"]),
            "--eviction-interval-secs", str(router_cfg["eviction_interval_s"]),
            "--max-tree-size", str(router_cfg["max_tree_size"]),
            "--prometheus-port", str(metrics_port or free_port()),
            "--log-level", log_level,
            *timeout,
        ]
    if impl != "ours":
        raise RouterConfigError(f"router impl {impl!r} is unknown; use 'ours' or 'vllm'")
    argv = [
        sys.executable, "-m", "router",
        f"router.policy={_hydra_value(router_cfg['policy'])}",
        "server.host=127.0.0.1", f"server.port={port}",
        f"engines.urls={_hydra_value(urls)}",
        f"engines.kv_event_endpoints={_hydra_value(list(kv_event_endpoints))}",
        f"model.path={_hydra_value(model_path)}",
    ]
    # Policy options are not in the recipe's empty params: add them with '++'.
    argv += [f"++router.params.{k}={_hydra_value(v)}" for k, v in dict(router_cfg.get("params") or {}).items()]
    if request_timeout_s is not None:
        argv.append(f"engines.request_timeout_s={float(request_timeout_s)}")
    return argv + list(extra_overrides)


def check_router_cfg(router_cfg: Mapping[str, Any]) -> None:
    """Check the ``router`` config group before anything starts: a known ``impl``; for
    ``vllm`` the ``vllm-router`` program is installed; for ``ours`` the policy exists and
    takes the given ``params`` (a router that would exit at start-up is refused here,
    before engines spend minutes starting).

    Raises:
        RouterConfigError: the message names the key and what to give instead
            (``UnknownOptionError`` for an unknown policy or option).
    """
    from omegaconf import DictConfig, OmegaConf

    from router.policies import make_policy

    if isinstance(router_cfg, DictConfig):
        router_cfg = OmegaConf.to_container(router_cfg, resolve=True)
    impl = router_cfg.get("impl", "ours")
    if impl == "vllm":
        if router_cfg.get("params"):
            keys = ", ".join(str(k) for k in router_cfg if k not in ("impl", "policy", "params"))
            raise UnknownOptionError(
                f"router.params={router_cfg['params']!r}: router=vllm takes no policy options; its settings "
                f"are the keys under 'router': {keys}")
        _vllm_log_level(router_cfg)
        _vllm_router_binary()
    elif impl == "ours":
        make_policy(router_cfg.get("policy", "misa_t"), router_cfg.get("params") or {})
    else:
        raise RouterConfigError(f"router.impl={impl!r} is unknown; use 'ours' or 'vllm'")


def start_router(
    router_cfg: Mapping[str, Any],
    engine_urls: Sequence[str],
    kv_event_endpoints: Sequence[str],
    model_path: str | None,
    log_dir: str | Path,
    port: int | None = None,
    timeout_s: float = 180.0,
    extra_overrides: Sequence[str] = (),
    request_timeout_s: float | None = None,
) -> RouterHandle:
    """Start the router (ours or vllm-router) in front of ``engine_urls`` and wait until healthy.

    Args:
        router_cfg: the ``router`` config group (``recipes/router/*.yaml``), a mapping
            or DictConfig.
        engine_urls: engine base URLs.
        kv_event_endpoints: ZMQ KV event endpoints, same order (ours only; may be empty).
        model_path: tokenizer source for ours, or None.
        log_dir: the run folder; the router logs to ``log_dir/router.log``.
        port: port to serve on; None = a free one.
        timeout_s: how long to wait for ``/health`` (a router that exits fails at once). Our
            router's start-up (imports, tokenizer) took over 60 s on the 2-core machine while engines
            started and a learner loaded beside it.
        extra_overrides: more Hydra overrides for ours.
        request_timeout_s: longest wait for one engine answer; None = the router's default.

    Raises:
        RouterConfigError: bad ``router_cfg`` or engine URL.
        common.process.ProcessStartError: the router exited or stayed unhealthy; the
            message holds its log's last lines.
    """
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(router_cfg, DictConfig):
            router_cfg = OmegaConf.to_container(router_cfg, resolve=True)
    except ImportError:
        pass
    port = port or free_port()
    kind = router_cfg.get("impl", "ours")
    metrics_port = free_port() if kind == "vllm" else None  # ours serves /metrics on its own port
    argv = router_argv(router_cfg, engine_urls, kv_event_endpoints, model_path, port, extra_overrides,
                       request_timeout_s, metrics_port)
    url = f"http://127.0.0.1:{port}"
    # Both serve /health: ours always, vllm-router once its workers answered theirs.
    process = ManagedProcess("router", argv, Path(log_dir) / "router.log", health_url=f"{url}/health", cwd=REPO_ROOT)
    process.start()
    process.wait_healthy(timeout_s, poll_s=0.2)
    metrics_url = f"http://127.0.0.1:{metrics_port}" if metrics_port else url
    return RouterHandle(url=url, kind=kind, process=process, metrics_url=metrics_url)
