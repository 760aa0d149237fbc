"""The serving stack on its own: engines plus the router, for users who want no trainer.

``python -m rollout.serve [router=misa-t] [engine.num_engines=2] ...`` prepares the
model, starts the engines and the router, prints their URLs and serves until Ctrl-C
(or SIGTERM), then stops everything it started. The same ``ServingStack`` is what the
training job brings up.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.config import EXIT_FAILURE, hydra_entry, register_user_error
from rollout.engines import EngineError, EnginePool, EngineStartError, validate_engine_cfg
from rollout.model import ModelBuildError, ModelPrepareError, check_model_path, resolve_model_path
from common.process import ProcessStartError

register_user_error(EngineError)  # a bad engine value: exit 2
register_user_error(ModelPrepareError)  # a bad model.path: exit 2
for _failure in (EngineStartError, ModelBuildError, ProcessStartError):  # at run time: exit 1
    register_user_error(_failure, exit_code=EXIT_FAILURE)


class ServingStack:
    """Model + engines + router of one run, started and stopped together.

    Args:
        cfg: a composed config with ``model``, ``engine`` and ``router`` groups.
        run_dir: the run folder; logs go to ``run_dir/logs``.

    After ``start()``: ``router_url`` is where rollout traffic goes, ``engines`` the pool,
    ``model_path`` what the engines loaded, ``served_model_name`` the name to send.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / "logs"
        self.engines: EnginePool | None = None
        self.router = None
        self.model_path: str | None = None
        self.timings_s: dict[str, float] = {}

    @property
    def served_model_name(self) -> str:
        return str(self.cfg.model.name)

    @property
    def router_url(self) -> str:
        assert self.router is not None, "start() first"
        return self.router.url

    def check(self) -> None:
        """The checks of the config that ``start()`` runs first; nothing is started or written.

        Raises:
            ModelPrepareError, EngineError, RouterConfigError: a bad model path, engine or
                router value.
        """
        from router.launch import check_router_cfg

        check_model_path(self.cfg.model)
        validate_engine_cfg(self.cfg.engine)
        check_router_cfg(self.cfg.router)

    def start(self) -> "ServingStack":
        """Prepare the model, start engines and router; block until all are healthy.

        Raises:
            ModelPrepareError, EngineError, ProcessStartError: something did not come up;
                whatever was already started is stopped first.
        """
        from router.launch import start_router

        self.check()
        t0 = time.monotonic()
        self.model_path = resolve_model_path(self.cfg.model)
        self.timings_s["model_s"] = time.monotonic() - t0
        try:
            t1 = time.monotonic()
            self.engines = EnginePool.start(
                self.cfg.engine, self.model_path, self.served_model_name,
                int(self.cfg.model.max_model_len), str(self.cfg.model.dtype), self.log_dir)
            self.timings_s["engines_s"] = time.monotonic() - t1
            t2 = time.monotonic()
            self.router = start_router(
                self.cfg.router, self.engines.urls, self.engines.kv_events_endpoints,
                self.model_path, self.log_dir,
                request_timeout_s=self.cfg.engine.get("request_timeout_s"))
            self.timings_s["router_s"] = time.monotonic() - t2
        except BaseException:
            self.stop()
            raise
        return self

    def describe(self) -> dict:
        """URLs, endpoints and logs of everything running, as a JSON-able dict."""
        return {
            "router": {"url": self.router.url if self.router else None,
                       "kind": getattr(self.router, "kind", None)},
            "engines": [{"url": h.url, "kv_events": h.kv_events_endpoint,
                         "log": str(h.log_path) if h.log_path else None,
                         "start_s": round(h.start_s, 1) if h.start_s else None}
                        for h in (self.engines.handles if self.engines else [])],
            "model": self.model_path,
            "served_model_name": self.served_model_name,
            "logs": str(self.log_dir),
        }

    def stop(self) -> None:
        """Stop the router, then the engines; safe to call twice."""
        if self.router is not None:
            self.router.stop()
            self.router = None
        if self.engines is not None:
            self.engines.stop()
            self.engines = None

    def __enter__(self) -> "ServingStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks stop the children."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))


@hydra_entry("serve")
def main(cfg: DictConfig) -> None:
    stop_on_sigterm()
    run_dir = Path(cfg.run_dir)
    stack = ServingStack(cfg, run_dir)
    stack.check()  # a refused command writes nothing into its run folder (Hydra's files are removed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    with stack:
        info = stack.describe()
        (run_dir / "serving.json").write_text(json.dumps(info, indent=1))
        print(json.dumps(info, indent=1), flush=True)
        print(f"serving: send OpenAI requests to {stack.router_url}/v1 (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopping", flush=True)


if __name__ == "__main__":
    main()
