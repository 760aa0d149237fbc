"""The live router's transport options (``recipes/router_service.yaml``), one frozen dataclass."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from common.config import register_renamed_key
from router.policies.base import RouterConfigError


@dataclass(frozen=True)
class ServiceConfig:
    """Transport options of the live router (``recipes/router_service.yaml``).

    Attributes:
        workload_classes: classes accepted in ``X-Workload-Class``; others (and a
            missing header) become ``DEFAULT_CLASS`` and are counted.
        max_body_bytes: largest request body accepted (413 above).
        connect_timeout_s: engine connect timeout; a timeout fails the engine.
        request_timeout_s: longest silence while reading an engine's answer.
        max_retries: decisions after engine failures before the client gets 502.
        probe_interval_s: period of ``/health`` probes of an unhealthy engine.
        scrape_interval_s / scrape_timeout_s: metric scrape period and timeout.
        idle_scrape_interval_s: the scrape period while the engines are idle and nothing is
            in flight or held (never shorter than ``scrape_interval_s``; keep it under the
            policies' ``metrics_stale_s``, 10 s by default); a request going out scrapes at once.
        kv_topic: ZMQ topic of the engines' KV event publishers.
        long_hold_s: holds longer than this are counted as long holds, in
            ``router_long_holds_total`` and (``build_service`` passes it to ``make_policy``)
            in the policy's ``state()["long_holds"]``: one knob, ``server.long_hold_s``.
        session_forget_idle_s: the live router's own session table: a session with
            nothing in flight for this long is forgotten and ``SessionEnded(reason=
            "idle_timeout")`` sent to the policy, whatever the policy (0 = never). Not the
            admission policy's ``idle_timeout_s`` (session_admission, 120 s), after which
            an idle session gives its cap back in the policy's own ledger.
        no_engine_timeout_s: a request waiting while no engine is healthy gets a 503
            after this long (holds for capacity are not bounded; holds for dead engines are).
        tokenizer_threads: threads that tokenize prompts off the event loop.
        wake_per_finish: held requests (oldest first) rechecked at once when a request
            finishes; the others recheck after their hold delay.
    """

    workload_classes: tuple[str, ...] = ("agent", "rlvr", "rlhf")
    max_body_bytes: int = 16 * 1024 * 1024
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0
    max_retries: int = 3
    probe_interval_s: float = 1.0
    scrape_interval_s: float = 0.5
    scrape_timeout_s: float = 2.0
    idle_scrape_interval_s: float = 5.0
    kv_topic: str = "kv-events"
    long_hold_s: float = 30.0
    session_forget_idle_s: float = 600.0
    no_engine_timeout_s: float = 30.0
    tokenizer_threads: int = 1
    wake_per_finish: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            value, default = getattr(self, f.name), f.default
            if isinstance(default, (int, float)) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise RouterConfigError(f"{SERVICE_OPTIONS.get(f.name, f.name)} must be a number, got {value!r}")
            if isinstance(default, int) and not isinstance(value, int):
                raise RouterConfigError(f"{SERVICE_OPTIONS.get(f.name, f.name)} must be an integer, got {value!r}")
            if isinstance(default, (int, float)) and not math.isfinite(value):
                # nan passes every comparison below, and a timer of nan or inf seconds stops the
                # loop that schedules it (the scraper, the probes) without a word
                raise RouterConfigError(f"{SERVICE_OPTIONS.get(f.name, f.name)} must be a finite number, got {value!r}")
        for name in ("max_body_bytes", "connect_timeout_s", "request_timeout_s", "probe_interval_s",
                     "no_engine_timeout_s", "long_hold_s",
                     "scrape_interval_s", "scrape_timeout_s", "idle_scrape_interval_s", "tokenizer_threads",
                     "wake_per_finish"):
            if getattr(self, name) <= 0:
                raise RouterConfigError(f"{SERVICE_OPTIONS.get(name, name)} must be > 0, got {getattr(self, name)!r}")
        if self.max_retries < 0 or self.session_forget_idle_s < 0:
            name = "max_retries" if self.max_retries < 0 else "session_forget_idle_s"
            raise RouterConfigError(f"{SERVICE_OPTIONS[name]} must be >= 0, got {getattr(self, name)!r}")


# ServiceConfig field -> its key in recipes/router_service.yaml.
SERVICE_OPTIONS = {
    "max_body_bytes": "server.max_body_bytes",
    "long_hold_s": "server.long_hold_s",
    "tokenizer_threads": "server.tokenizer_threads",
    "wake_per_finish": "server.wake_per_finish",
    "connect_timeout_s": "engines.connect_timeout_s",
    "request_timeout_s": "engines.request_timeout_s",
    "max_retries": "engines.max_retries",
    "probe_interval_s": "engines.probe_interval_s",
    "scrape_interval_s": "signals.scrape_interval_s",
    "scrape_timeout_s": "signals.scrape_timeout_s",
    "idle_scrape_interval_s": "signals.idle_scrape_interval_s",
    "kv_topic": "signals.kv_topic",
    "session_forget_idle_s": "sessions.forget_idle_s",
    "no_engine_timeout_s": "engines.no_engine_timeout_s",
}

# The key's old name, easy to take for the policy's idle_timeout_s: refused, naming the new one.
register_renamed_key("sessions.idle_timeout_s", "sessions.forget_idle_s")
