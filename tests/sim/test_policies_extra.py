"""The simulator's admission anchors: aimd's cap moves with KV usage; tool_pause pauses at tool boundaries."""

from __future__ import annotations

import pytest

import router.sim  # noqa: F401  (registers aimd, tool_pause)
from router.policies import make_policy
from router.policies.base import (
    Admit,
    ClusterView,
    Hold,
    InstanceMetrics,
    InstanceView,
    MetricsSampled,
    Request,
    RequestFinished,
    RouterConfigError,
)


def view(usage: float = 0.5, waiting: int = 0, age_s: float = 0.5, n: int = 2) -> ClusterView:
    m = InstanceMetrics(kv_cache_usage=usage, num_requests_waiting=waiting)
    return ClusterView(tuple(InstanceView(f"w{i}", True, 0, m, age_s) for i in range(n)))


def sample(w: str, now: float, usage: float, waiting: int = 0, preempt: float = 0.0) -> MetricsSampled:
    return MetricsSampled(w, InstanceMetrics(kv_cache_usage=usage, num_requests_waiting=waiting,
                                             num_preemptions_total=preempt), now)


def test_aimd_cap_shrinks_multiplicatively_on_high_kv_usage_and_grows_additively_on_low():
    p = make_policy("aimd", {"initial_cap": 10, "beta": 0.5, "alpha": 2, "interval_s": 1.0})
    p.observe(sample("w0", 0.0, 0.99))
    assert p.caps["w0"] == 5
    p.observe(sample("w0", 0.5, 0.10))  # within interval_s: ignored
    assert p.caps["w0"] == 5
    p.observe(sample("w0", 1.0, 0.10))
    assert p.caps["w0"] == 7
    p.observe(sample("w0", 2.0, 0.85))  # between low and high: unchanged
    assert p.caps["w0"] == 7
    p.observe(sample("w0", 3.0, 0.5, preempt=3.0))  # preemptions since the last sample: shrink
    assert p.caps["w0"] == 3
    p.observe(sample("w0", 4.0, 0.5, preempt=3.0))  # none since: low usage grows it again
    assert p.caps["w0"] == 5


def test_aimd_holds_new_sessions_at_cap_but_never_continuations():
    p = make_policy("aimd", {"initial_cap": 1})
    v = view(n=1)
    assert isinstance(p.decide(Request("a0", "a"), v, 0.0), Admit)
    assert isinstance(p.decide(Request("b0", "b"), v, 0.0), Hold)
    assert p.decide(Request("a1", "a"), v, 1.0) == Admit("w0", reason="continuation")
    p.observe(RequestFinished(Request("a1", "a", session_end=True), "w0", 2.0))
    assert isinstance(p.decide(Request("b0", "b"), v, 2.0), Admit)


def test_tool_pause_pauses_a_continuation_only_under_kv_pressure():
    p = make_policy("tool_pause", {"admit_usage": 0.8, "pause_usage": 0.9})
    assert isinstance(p.decide(Request("s0", "s"), view(0.5), 0.0), Admit)
    assert isinstance(p.decide(Request("s1", "s"), view(0.95), 1.0), Hold)
    assert isinstance(p.decide(Request("s1", "s"), view(0.85), 2.0), Admit)
    # a new session at 0.85 > admit_usage is held, while the continuation above went through
    assert isinstance(p.decide(Request("t0", "t"), view(0.85), 2.0), Hold)


def test_tool_pause_holds_new_sessions_without_fresh_metrics():
    p = make_policy("tool_pause", {})
    assert isinstance(p.decide(Request("s0", "s"), view(0.1, age_s=60.0), 0.0), Hold)


@pytest.mark.parametrize("name,params", [("aimd", {"beta": 1.5}), ("tool_pause", {"admit_usage": 0.99,
                                                                                  "pause_usage": 0.5})])
def test_bad_anchor_options_are_config_errors(name, params):
    with pytest.raises(RouterConfigError):
        make_policy(name, params)
