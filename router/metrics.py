"""The live router's own Prometheus metrics (served at ``/metrics``).

One :class:`RouterMetrics` per router process, on its own ``CollectorRegistry`` so that
several routers (tests, the bench) can live in one Python process. Series names start
with ``router_``; labels are ``instance`` (an engine's base URL), ``workload_class`` and
``outcome``. Gauges that mirror the policy's ledgers (caps, sizes) are refreshed from
``policy.state()`` when ``/metrics`` is read, so they never lag what ``/state`` shows.
"""

from __future__ import annotations

from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Hold times span one recheck (~0.05 s) to a long hold of minutes.
_HOLD_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
# A decide() call costs microseconds; the slow tail is what matters.
_DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 5e-2)


class RouterMetrics:
    """The router's Prometheus series.

    Attributes (all prometheus_client objects on ``self.registry``):
        decisions: ``router_decisions_total{outcome=admit|hold}``; one per decide() call.
        holds: ``router_held_requests_total{workload_class}``; requests held at least once.
        held_now: ``router_held_requests_now{workload_class}``; requests waiting in HOLD now.
        hold_time_s: ``router_hold_seconds{workload_class}``; first decide -> admit.
        long_holds: ``router_long_holds_total{workload_class}``; holds longer than
            ``long_hold_s``.
        decision_latency_s: ``router_decision_latency_seconds``; one decide() call.
        unknown_class: ``router_unknown_workload_class_total``; requests whose
            ``X-Workload-Class`` was missing or not configured (mapped to ``default``).
        without_session_id: ``router_requests_without_session_id_total{route}``; requests
            that came with no (or an empty) ``X-Session-Id``, each its own one-turn
            session: a client that forgets the header on agent turns shows up here.
        requests: ``router_requests_total{instance, outcome=ok|error|client_gone}``.
        in_flight: ``router_in_flight_requests{instance}``; set when ``/metrics`` is read.
        engine_failures: ``router_engine_failures_total{instance}``.
        retries: ``router_retries_total``; requests re-decided after an engine failure.
        instance_healthy: ``router_instance_healthy{instance}`` (1/0).
        signal_age_s: ``router_metrics_age_seconds{instance}``; age of the last scrape.
        scrape_failures: ``router_metric_scrape_failures_total{instance}``; scrapes of an
            engine's ``/metrics`` that timed out or failed (routing used an older sample).
        kv_events: ``router_kv_events_total{instance, type}``.
        kv_event_gaps: ``router_kv_event_gaps_total{instance}``; lost KV event batches.
        admission_cap: ``router_admission_cap{instance, workload_class}`` from the
            policy's state (``caps``), where the policy has caps.
        ledger_size: ``router_ledger_size{ledger}`` from the policy's state
            (``ledger_sizes``).
    """

    def __init__(self, long_hold_s: float = 30.0) -> None:
        self.registry = CollectorRegistry()
        self.long_hold_s = long_hold_s
        r = self.registry
        self.decisions = Counter("router_decisions", "decide() calls by outcome", ["outcome"], registry=r)
        self.holds = Counter("router_held_requests", "Requests held at least once", ["workload_class"], registry=r)
        self.held_now = Gauge("router_held_requests_now", "Requests waiting in HOLD now", ["workload_class"], registry=r)
        self.hold_time_s = Histogram(
            "router_hold_seconds", "Time a request spent in HOLD before admission", ["workload_class"],
            buckets=_HOLD_BUCKETS_S, registry=r,
        )
        self.long_holds = Counter(
            "router_long_holds", "Requests held longer than long_hold_s", ["workload_class"], registry=r
        )
        self.decision_latency_s = Histogram(
            "router_decision_latency_seconds", "Wall time of one decide() call", buckets=_DECISION_BUCKETS_S, registry=r
        )
        self.unknown_class = Counter(
            "router_unknown_workload_class", "Requests with a missing or unknown X-Workload-Class", registry=r
        )
        self.without_session_id = Counter(
            "router_requests_without_session_id", "Requests without X-Session-Id (each its own one-turn session)",
            ["route"], registry=r,
        )
        self.requests = Counter("router_requests", "Forwarded requests by instance and outcome", ["instance", "outcome"], registry=r)
        self.in_flight = Gauge("router_in_flight_requests", "Requests forwarded and not finished", ["instance"], registry=r)
        self.engine_failures = Counter("router_engine_failures", "Failed engine requests (connection, 502/503/504)", ["instance"], registry=r)
        self.retries = Counter("router_retries", "Requests retried after an engine failure", registry=r)
        self.policy_errors = Counter("router_policy_errors", "Exceptions raised by the policy (a policy bug)",
                                     ["call"], registry=r)  # call: decide | observe
        self.instance_healthy = Gauge("router_instance_healthy", "1 when the instance is healthy", ["instance"], registry=r)
        self.signal_age_s = Gauge("router_metrics_age_seconds", "Age of the instance's last metric sample", ["instance"], registry=r)
        self.scrape_failures = Counter("router_metric_scrape_failures", "Failed scrapes of an engine's /metrics",
                                       ["instance"], registry=r)
        self.kv_events = Counter("router_kv_events", "KV-cache events received", ["instance", "type"], registry=r)
        self.kv_event_gaps = Counter("router_kv_event_gaps", "Sequence gaps in KV events (index cleared)", ["instance"], registry=r)
        self.admission_cap = Gauge(
            "router_admission_cap", "Admission cap per instance and workload class (policy state)",
            ["instance", "workload_class"], registry=r,
        )
        self.ledger_size = Gauge("router_ledger_size", "Entries per ledger (policy state)", ["ledger"], registry=r)
        # Children bound once: labels() takes a lock and a dict lookup per call, on every request.
        self.admit_decisions = self.decisions.labels("admit")
        self.hold_decisions = self.decisions.labels("hold")
        self._request_counters: dict[tuple[str, str], Any] = {}

    def count_request(self, instance: str, outcome: str) -> None:
        """``router_requests_total{instance, outcome}`` += 1."""
        counter = self._request_counters.get((instance, outcome))
        if counter is None:
            counter = self._request_counters[(instance, outcome)] = self.requests.labels(instance, outcome)
        counter.inc()

    def observe_hold_end(self, workload_class: str, held_s: float) -> None:
        """Record a finished hold of ``held_s`` seconds (admitted or dropped)."""
        self.hold_time_s.labels(workload_class).observe(held_s)
        if held_s > self.long_hold_s:
            self.long_holds.labels(workload_class).inc()

    def refresh_from_policy_state(self, state: Mapping[str, Any]) -> None:
        """Copy caps and ledger sizes from ``policy.state()`` into their gauges.

        Reads ``state["caps"]`` as ``{instance: {workload_class: cap}}`` and
        ``state["ledger_sizes"]`` as ``{ledger: size}``; a policy without them (round_robin)
        leaves the gauges empty. Values that are not numbers are skipped.
        """
        caps = state.get("caps")
        self.admission_cap.clear()  # a class whose cap is gone from the state is gone from /metrics too
        if isinstance(caps, Mapping):
            for instance, per_class in caps.items():
                if isinstance(per_class, Mapping):
                    for cls, cap in per_class.items():
                        if isinstance(cap, (int, float)):
                            self.admission_cap.labels(str(instance), str(cls)).set(cap)
                elif isinstance(per_class, (int, float)):
                    self.admission_cap.labels(str(instance), "all").set(per_class)
        sizes = state.get("ledger_sizes")
        self.ledger_size.clear()
        if isinstance(sizes, Mapping):
            for ledger, size in sizes.items():
                if isinstance(size, (int, float)):
                    self.ledger_size.labels(str(ledger)).set(size)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
