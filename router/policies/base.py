"""The policy core's interface: what a routing policy sees and what it returns.

A policy is pure and clock-injected (DESIGN.md, "The router's inside"): it never does
I/O, never reads a clock and never imports HTTP, ZMQ or asyncio. The live router
(`router/server.py`) and the simulator (`router/sim/`) both drive the same policy
objects through two calls:

- ``decide(request, view, now) -> Admit | Hold``: place or hold one request.
- ``observe(event)``: take a lifecycle event, a KV-cache event or a metric sample.

Everything here is a small frozen dataclass so the two transports build the same
values. Times are seconds on the caller's clock (``now``), block counts are in the
engine's KV blocks (``block_size`` tokens each).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Union

DEFAULT_CLASS = "default"
"""Workload class of a request that carries no (or an unknown) ``X-Workload-Class``."""


class RouterConfigError(ValueError):
    """A router or policy option is invalid; the message says which and what to do."""


class UnknownOptionError(RouterConfigError):
    """A policy name or policy option name that does not exist; the message lists the valid
    ones. Entry points treat it like an unknown config key (exit code 2), other
    ``RouterConfigError`` s as bad values."""


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """One model request as the policy sees it (DESIGN.md, "Request metadata").

    Attributes:
        request_id: unique id of this request.
        session_id: ``X-Session-Id``; a request without one is its own session.
        workload_class: ``X-Workload-Class`` (``agent``, ``rlvr``, ``rlhf``, ...), or
            ``DEFAULT_CLASS``.
        group_id: ``X-Group-Id`` (GRPO group), or None.
        unit_id: ``X-Rollout-Unit``; the session id when absent.
        session_end: ``X-Session-End: 1`` was sent: the session closes when this
            request finishes.
        prompt_tokens: L_r, prompt length in tokens (MISA-T Eq. 1, Eq. 7).
        block_hashes: chained hashes of the prompt's *full* KV blocks, in order, at the
            engines' block size, in the prefix index's hash space (see
            ``router/prefix_index.py``); empty when unknown.
        prompt_text: the prompt as text (the cache_aware baseline matches on text).
        max_tokens: requested output limit in tokens, or None.
        arrival_s: when the request reached the router (the caller's clock).
    """

    request_id: str
    session_id: str
    workload_class: str = DEFAULT_CLASS
    group_id: str | None = None
    unit_id: str | None = None
    session_end: bool = False
    prompt_tokens: int = 0
    block_hashes: tuple[int, ...] = ()
    prompt_text: str = ""
    max_tokens: int | None = None
    arrival_s: float = 0.0


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Admit:
    """Send the request to ``instance`` now."""

    instance: str
    reason: str = ""


@dataclass(frozen=True)
class Hold:
    """Do not send the request yet; ask ``decide`` again after ``recheck_after_s``.

    The request stays in the policy's demand ledger while held (HOLD never loses work).
    """

    recheck_after_s: float
    reason: str = ""


Decision = Union[Admit, Hold]


# --------------------------------------------------------------------------- signals


@dataclass(frozen=True)
class InstanceMetrics:
    """One scrape of an engine's Prometheus ``/metrics`` (vLLM names in comments).

    Counters are cumulative totals as the engine reports them; a policy differences
    successive samples itself. ``None`` means the engine did not report the value.
    """

    num_requests_running: int = 0  # vllm:num_requests_running
    num_requests_waiting: int = 0  # vllm:num_requests_waiting
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0-1
    num_blocks: int | None = None  # vllm:cache_config_info{num_gpu_blocks}
    block_size: int | None = None  # vllm:cache_config_info{block_size}
    prefix_cache_queries_total: float = 0.0  # vllm:prefix_cache_queries_total (tokens)
    prefix_cache_hits_total: float = 0.0  # vllm:prefix_cache_hits_total (tokens)
    prompt_tokens_total: float = 0.0  # vllm:prompt_tokens_total
    generation_tokens_total: float = 0.0  # vllm:generation_tokens_total
    num_preemptions_total: float = 0.0  # vllm:num_preemptions_total
    engine_steps_total: float = 0.0  # vllm:iteration_tokens_total's count: engine steps (iterations)
    prefills_total: float = 0.0  # vllm:time_to_first_token_seconds' count: prefills that gave a first token
    e2e_latency_s_total: float = 0.0  # vllm:e2e_request_latency_seconds' sum: engine-side request time (s)
    e2e_requests_total: float = 0.0  # its count: finished requests
    queue_time_s_total: float = 0.0  # vllm:request_queue_time_seconds' sum: waiting in the scheduler (s)
    prefill_time_s_total: float = 0.0  # vllm:request_prefill_time_seconds' sum: first schedule to first token (s)
    decode_time_s_total: float = 0.0  # vllm:request_decode_time_seconds' sum: first token to last (s)


@dataclass(frozen=True)
class InstanceView:
    """What the transport knows about one instance at decision time.

    Attributes:
        instance: the instance id (the engine's base URL in the live router).
        healthy: False after a failed request or probe; a policy must not admit there.
        in_flight: requests the transport has sent there and not yet seen finish.
        metrics: the latest metric sample, or None if none arrived yet.
        metrics_age_s: seconds since that sample was taken (None if no sample).
    """

    instance: str
    healthy: bool = True
    in_flight: int = 0
    metrics: InstanceMetrics | None = None
    metrics_age_s: float | None = None


@dataclass(frozen=True)
class ClusterView:
    """All instances, in a fixed order (the order round_robin cycles in)."""

    instances: tuple[InstanceView, ...]

    def healthy(self) -> tuple[InstanceView, ...]:
        return tuple(i for i in self.instances if i.healthy)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class RequestStarted:
    """The transport forwarded an admitted request to ``instance`` at ``now``."""

    request: Request
    instance: str
    now: float


@dataclass(frozen=True)
class RequestFinished:
    """A request finished (or failed) on ``instance``.

    ``prompt_tokens``/``completion_tokens`` are the engine's usage figures when known;
    ``ok`` is False when the engine failed the request. ``instance == ""`` (with
    ``ok=False``): the request was dropped before admission and never forwarded (its
    client left while it was held, or no engine was healthy); a policy releases the
    demand it holds for it at once.
    """

    request: Request
    instance: str
    now: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    ok: bool = True


@dataclass(frozen=True)
class SessionEnded:
    """A session closed: ``X-Session-End`` seen and its last request done, or idle timeout."""

    session_id: str
    now: float
    reason: str = "end"  # "end" | "idle_timeout"


@dataclass(frozen=True)
class BlocksStored:
    """KV event BlockStored, translated into the prefix index's hash space."""

    instance: str
    block_hashes: tuple[int, ...]
    now: float


@dataclass(frozen=True)
class BlocksRemoved:
    """KV event BlockRemoved (eviction), in the prefix index's hash space."""

    instance: str
    block_hashes: tuple[int, ...]
    now: float


@dataclass(frozen=True)
class AllBlocksCleared:
    """KV event AllBlocksCleared: the instance reset its prefix cache (e.g. weight sync)."""

    instance: str
    now: float


@dataclass(frozen=True)
class MetricsSampled:
    """A new metric sample for ``instance`` taken at ``now``."""

    instance: str
    metrics: InstanceMetrics
    now: float


@dataclass(frozen=True)
class InstanceHealthChanged:
    """The transport marked ``instance`` healthy or unhealthy."""

    instance: str
    healthy: bool
    now: float


Event = Union[
    RequestStarted,
    RequestFinished,
    SessionEnded,
    BlocksStored,
    BlocksRemoved,
    AllBlocksCleared,
    MetricsSampled,
    InstanceHealthChanged,
]


# --------------------------------------------------------------------------- policy


class Policy(Protocol):
    """What every routing policy implements (round_robin ... misa_t).

    The contract both transports (the live router and the simulator) rely on; a new
    policy keeps it (``tests/router/test_policy_contract.py`` checks every registered one):

    - **Arrival order.** While an older new session (a session's first request) of a
      workload class is held, a younger new session of that class is held too: held new
      sessions of a class are admitted in arrival order. The simulator re-asks only the
      head of a class's queue and asks the next one the moment the head is admitted.
    - **Recheck.** A held new session is admitted only after something that can make
      room reached the policy: a session admitted or ended, a new request held, a metric
      sample, an instance's health or cache reset, or time passing (an idle session
      expired). Request start/finish of an admitted session and KV block events do not
      make room; the simulator does not re-ask a held new session for them. A held
      request is asked again at least every ``held_refresh_s`` of the simulator.
    - **Purity.** ``decide`` and ``observe`` read no clock but ``now`` / ``event.now``,
      and do no I/O; an exception from either is a policy bug, counted by the live
      router in ``router_policy_errors_total`` and raised by the simulator.
    """

    name: str

    def decide(self, request: Request, view: ClusterView, now: float) -> Decision:
        """Admit ``request`` on one healthy instance of ``view``, or Hold it.

        A Hold keeps the request in the policy's demand ledger; the caller calls
        ``decide`` again for the same request after ``recheck_after_s``. An Admit
        is final: the caller then forwards the request and reports RequestStarted.
        """
        ...

    def observe(self, event: Event) -> None:
        """Update internal state (ledgers, estimators) from one event."""
        ...

    def state(self) -> dict:
        """A JSON-serialisable snapshot (ledgers, caps) for ``/state`` and metrics."""
        ...


@dataclass
class PolicyStats:
    """Counters every policy keeps for metrics (decisions by outcome)."""

    admits: int = 0
    holds: int = 0
    extra: dict = field(default_factory=dict)


def option_bound_errors(config: object, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = (),
                        at_least_one: tuple[str, ...] = (), not_below: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """One message per option of the dataclass ``config`` out of its bound (``NAME must be >
    0, got V``, ``>= 0``, ``>= 1``; for a pair ``(NAME, OTHER)`` of ``not_below``, ``NAME must be
    >= OTHER (W), got V: raise NAME or lower OTHER``), for a config's ``__post_init__`` to join into one error."""
    bounds = ((positive, "> 0", lambda v: v > 0), (non_negative, ">= 0", lambda v: v >= 0),
              (at_least_one, ">= 1", lambda v: v >= 1))
    bad = [f"{name} must be {text}, got {getattr(config, name)}"
           for names, text, ok in bounds for name in names if not ok(getattr(config, name))]
    return bad + [f"{name} must be >= {other} ({getattr(config, other)}), got {getattr(config, name)}: raise "
                  f"{name} or lower {other}"
                  for name, other in not_below if getattr(config, name) < getattr(config, other)]
