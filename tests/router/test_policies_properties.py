"""Properties of the admission policies under random event sequences (hypothesis, derandomized).

- new admissions never push protected occupancy over C_w except as a floor admission;
- a continuation of a protected session on a healthy instance is never held;
- class caps never sum above the global cap except through floor classes;
- every held request is admitted once capacity frees.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.policies import make_policy
from router.policies.base import (
    Admit,
    ClusterView,
    Hold,
    InstanceHealthChanged,
    InstanceMetrics,
    InstanceView,
    MetricsSampled,
    Request,
    RequestFinished,
    RequestStarted,
    SessionEnded,
)

CLASSES = ("agent", "rlvr", "rlhf")
INSTANCES = ("w0", "w1", "w2")
PARAMS = {
    "fallback_num_blocks": 40,
    "k_prior_blocks": 8,
    "idle_timeout_s": 30,
    "k_min_samples": 4,
    "window_s": 2,
    "confirm_windows": 2,
    "min_reference_windows": 1,
}
CLASS_PRIORS = {"class_k_prior_blocks": {"agent": 30, "rlvr": 4, "rlhf": 12}}

new_session = st.tuples(st.just("new"), st.integers(0, 2), st.integers(0, 3))
continuation = st.tuples(st.just("continue"), st.integers(0, 50))
op = st.one_of(
    new_session,
    new_session,  # listed twice: sessions pile up and caps fill
    continuation,
    continuation,
    st.tuples(st.just("finish"), st.integers(0, 50), st.integers(1, 900), st.booleans()),
    st.tuples(st.just("end"), st.integers(0, 50)),
    st.tuples(st.just("redecide"), st.integers(0, 50)),
    st.tuples(st.just("metrics"), st.integers(0, 2), st.integers(0, 3), st.floats(0, 1)),
    st.tuples(st.just("health"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("tick"), st.floats(0.1, 20)),
)


class Driver:
    """Plays the transport: views, RequestStarted on admit, counters for metric samples."""

    def __init__(self, policy, num_blocks: dict[str, int]) -> None:
        self.policy, self.num_blocks, self.now = policy, num_blocks, 0.0
        self.healthy = dict.fromkeys(INSTANCES, True)
        self.counters = dict.fromkeys(INSTANCES, (0.0, 0.0))
        self.in_flight: dict[str, list[tuple[Request, str]]] = {}
        self.classes: dict[str, tuple[str, str]] = {}
        self.ids = itertools.count()
        self.violations: list[str] = []

    def view(self) -> ClusterView:
        return ClusterView(
            tuple(
                InstanceView(
                    w,
                    healthy=self.healthy[w],
                    in_flight=sum(1 for reqs in self.in_flight.values() for _, x in reqs if x == w),
                    metrics=InstanceMetrics(num_blocks=self.num_blocks[w], block_size=16),
                    metrics_age_s=0.0,
                )
                for w in INSTANCES
            )
        )

    def decide(self, session: str, end: bool = False) -> object:
        cls, group = self.classes[session]
        r = Request(f"r{next(self.ids)}", session, cls, group_id=group, session_end=end, prompt_tokens=64)
        view = self.view()
        rec = self.policy.session_ledger.session(session)
        # a protected session idle for idle_timeout_s has ended by ``now``: it re-acquires admission
        expired = rec is not None and rec.in_flight == 0 and self.now - rec.last_activity_s >= PARAMS["idle_timeout_s"]
        continuation = rec is not None and rec.protected and self.healthy[rec.instance] and not expired
        decision = self.policy.decide(r, view, self.now)
        if continuation and not (isinstance(decision, Admit) and decision.instance == rec.instance):
            self.violations.append(f"continuation of {session} got {decision}")
        if isinstance(decision, Admit):
            if decision.reason != "continuation" and "floor" not in decision.reason:
                self.check_occupancy(view, decision.instance)
            self.policy.observe(RequestStarted(r, decision.instance, self.now))
            self.in_flight.setdefault(session, []).append((r, decision.instance))
        self.check_class_caps(view)
        return decision

    def check_occupancy(self, view: ClusterView, instance: str) -> None:
        """Σ k_b over non-floor protected sessions of ``instance`` <= C_w (Eq. 3)."""
        v = next(x for x in view.instances if x.instance == instance)
        caps = self.policy.instance_caps(v)
        occupancy = sum(
            caps.class_k_blocks.get(s.workload_class, caps.ref_blocks)
            for s in self.policy.session_ledger.protected_sessions(instance)
            if not s.floor_admitted
        )
        if occupancy > caps.protected_blocks + 1e-9:
            self.violations.append(f"occupancy {occupancy} > C_w {caps.protected_blocks} on {instance}")

    def check_class_caps(self, view: ClusterView) -> None:
        for v in view.instances:
            caps = self.policy.instance_caps(v)
            total = sum(k for b, k in caps.class_caps.items() if b not in caps.floor_classes)
            if total > caps.cap:
                self.violations.append(f"class caps {caps.class_caps} sum above K_w {caps.cap} on {v.instance}")

    def pick(self, k: int) -> str | None:
        sessions = sorted(self.classes)
        return sessions[k % len(sessions)] if sessions else None

    def apply(self, step: tuple) -> None:
        kind = step[0]
        if kind == "new":
            session = f"s{len(self.classes)}"
            self.classes[session] = (CLASSES[step[1]], f"g{step[2]}")
            self.decide(session)
        elif kind in ("continue", "redecide") and (session := self.pick(step[1])):
            rec = self.policy.session_ledger.session(session)
            if kind == "continue" and rec is not None and rec.protected or kind == "redecide" and rec is not None:
                self.decide(session)
        elif kind == "finish" and (session := self.pick(step[1])) and self.in_flight.get(session):
            r, w = self.in_flight[session].pop(0)
            r = Request(r.request_id, r.session_id, r.workload_class, r.group_id, session_end=step[3], prompt_tokens=64)
            self.policy.observe(RequestFinished(r, w, self.now, prompt_tokens=64, completion_tokens=step[2]))
        elif kind == "end" and (session := self.pick(step[1])):
            self.policy.observe(SessionEnded(session, self.now))
        elif kind == "metrics":
            w = INSTANCES[step[1]]
            queries, hits = self.counters[w]
            self.counters[w] = (queries + 1000, hits + 1000 * step[3])
            m = InstanceMetrics(
                num_requests_waiting=step[2], num_blocks=self.num_blocks[w], block_size=16,
                prefix_cache_queries_total=queries + 1000, prefix_cache_hits_total=hits + 1000 * step[3],
            )  # fmt: skip
            self.policy.observe(MetricsSampled(w, m, self.now))
        elif kind == "health":
            w = INSTANCES[step[1]]
            self.healthy[w] = step[2]
            self.policy.observe(InstanceHealthChanged(w, step[2], self.now))
        elif kind == "tick":
            self.now += step[1]

    def drain(self) -> list[str]:
        """End every session, then re-decide held ones until none is held; returns the never-admitted."""
        self.healthy = dict.fromkeys(INSTANCES, True)
        for session in list(self.classes):
            rec = self.policy.session_ledger.session(session)
            if rec is not None and rec.state != "held":
                self.policy.observe(SessionEnded(session, self.now))
        self.in_flight.clear()
        for _ in range(400):
            held = [rec.session_id for rec in self.policy.session_ledger.held_sessions()]
            if not held:
                return []
            self.now += 1.0
            for session in held:
                if isinstance(self.decide(session), Admit):
                    self.policy.observe(SessionEnded(session, self.now))
                    self.in_flight.pop(session, None)
        return [rec.session_id for rec in self.policy.session_ledger.held_sessions()]


def _run(name: str, steps: list[tuple], sizes: tuple[int, int, int]) -> Driver:
    params = dict(PARAMS, **(CLASS_PRIORS if name != "session_admission" else {}))
    driver = Driver(make_policy(name, params), dict(zip(INSTANCES, sizes)))
    for step in steps:
        driver.apply(step)
    return driver


SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
SIZES = st.tuples(st.sampled_from([8, 40, 100]), st.sampled_from([8, 40, 100]), st.sampled_from([8, 40, 100]))


@SETTINGS
@given(steps=st.lists(op, min_size=30, max_size=120), sizes=SIZES, name=st.sampled_from(["session_admission", "misa", "misa_t"]))
def test_admissions_fit_capacity_and_caps_and_continuations_are_never_held(steps, sizes, name) -> None:
    """Eq. 3 after every non-floor admission, continuations admitted, Σ_b K_wb <= K_w."""
    driver = _run(name, steps, sizes)
    assert driver.violations == []


def test_rebound_session_footprint_counts_at_its_admission() -> None:
    """A rebound session brings its observed blocks (21 here) into k_b when admitted; the
    Eq. 3 check at its admission must already count them (once 37 > C_w = 36 blocks)."""
    steps = ([("new", 1, 0), ("new", 0, 0)] + [("continue", 0)] * 10
             + [("end", 1), ("new", 2, 0), ("health", 0, False), ("finish", 0, 257, False),
                ("new", 0, 0), ("new", 1, 0), ("continue", 0), ("continue", 0), ("redecide", 0)]
             + [("new", 0, 0)] * 9)
    assert _run("misa", steps, (8, 8, 40)).violations == []


def test_continuation_after_idle_timeout_reacquires_admission() -> None:
    """A session idle for idle_timeout_s has ended: its next request is a new admission, and
    may wait behind earlier held sessions of its class (not a continuation held by a cap)."""
    steps = [("new", 0, 0)] * 3 + [("finish", 0, 1, False), ("new", 0, 0), ("new", 0, 0), ("tick", 30.0),
                                   ("continue", 0)]
    driver = _run("session_admission", steps, (8, 8, 8))
    assert driver.violations == []
    assert driver.policy.session_ledger.finished("s0").reason == "idle_timeout"


@SETTINGS
@given(steps=st.lists(op, min_size=30, max_size=120), sizes=SIZES, name=st.sampled_from(["session_admission", "misa", "misa_t"]))
def test_every_held_request_is_admitted_once_capacity_frees(steps, sizes, name) -> None:
    driver = _run(name, steps, sizes)
    assert driver.drain() == []
    assert driver.violations == []


def test_hold_is_a_hold_not_a_drop() -> None:
    driver = _run("misa_t", [("new", 0, 0)] * 30, (8, 8, 8))
    held = driver.policy.session_ledger.held_sessions()
    assert held and all(isinstance(driver.decide(r.session_id), Hold) for r in held[1:])
    assert driver.drain() == []
