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
    RequestStarted,
    RouterConfigError,
    SessionEnded,
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


def _ttl_view(n: int = 1) -> ClusterView:
    m = InstanceMetrics(num_blocks=100, block_size=16)
    return ClusterView(tuple(InstanceView(f"w{i}", True, 0, m, 0.5) for i in range(n)))


def _turn(p, session: str, now: float, prompt: int = 640, completion: int = 160, end: bool = False) -> str:
    """One turn of ``session`` admitted at ``now`` and finished at once; its instance."""
    r = Request(f"{session}-{now}", session, "agent", prompt_tokens=prompt, session_end=end)
    d = p.decide(r, _ttl_view(), now)
    assert isinstance(d, Admit), (session, now, d)
    p.observe(RequestStarted(r, d.instance, now))
    p.observe(RequestFinished(r, d.instance, now, prompt_tokens=prompt, completion_tokens=completion))
    return d.instance


def test_progress_ttl_keeps_a_program_over_a_short_tool_call_and_pauses_it_past_its_ttl():
    """A program in a tool call keeps its blocks for its TTL (ttl_scale x its re-prefill
    time); a new program finds room only once a TTL ran out, by pausing that program; the
    paused one's next turn is held with its room kept for it, which no new program takes."""
    p = make_policy("progress_ttl", {"admit_usage": 1.0, "output_prior_tokens": 160, "ttl_scale": 16.0})
    v = _ttl_view()
    _turn(p, "a", 0.0)  # 640 + 160 tokens: 50 of the 100 blocks, owned over its tool call
    _turn(p, "b", 0.0)
    assert p.state()["instances"]["w0"]["owned_blocks"] == 100
    assert p.ttl("w0", 50) == pytest.approx(3.2)  # 16 x 800 tokens / 4,000 tok/s (the prior rate)
    c = Request("c-1", "c", "agent", prompt_tokens=640)
    assert isinstance(p.decide(c, v, 1.0), Hold)  # a and b within their TTL
    assert p.decide(Request("a-2", "a", "agent", prompt_tokens=640), v, 2.0) == Admit("w0", reason="continuation")
    _turn(p, "a", 2.0)  # a's TTL starts again at 2 s
    assert isinstance(p.decide(c, v, 3.5), Admit)  # b's ran out at 3.2 s: b paused, its 50 blocks to c
    assert p.counters["pauses"] == 1 and p.state()["instances"]["w0"]["paused"] == 1
    b2 = Request("b-2", "b", "agent", prompt_tokens=640)
    assert isinstance(p.decide(b2, v, 4.0), Hold)  # a and c own all; a's TTL runs to 5.2 s
    p.observe(SessionEnded("a", 4.5))
    assert isinstance(p.decide(Request("d-1", "d", "rlvr", prompt_tokens=640), v, 5.0), Hold)  # b's room
    assert p.decide(b2, v, 5.0) == Admit("w0") and p.counters["resumes"] == 1


def test_progress_ttl_force_resumes_a_paused_program_after_force_resume_s():
    """A paused program kept out by others resumes on its instance after ``force_resume_s``
    over the budget (fairness); programs expired but too small to make its room are not paused."""
    p = make_policy("progress_ttl", {"admit_usage": 1.0, "output_prior_tokens": 160, "ttl_min_s": 1.0,
                                     "ttl_max_s": 1.0, "force_resume_s": 10.0})
    v = _ttl_view()
    _turn(p, "a", 0.0)
    _turn(p, "b", 0.0)
    assert isinstance(p.decide(Request("c-1", "c", "agent", prompt_tokens=640), v, 2.0), Admit)  # a paused
    a2 = Request("a-2", "a", "agent", prompt_tokens=800)
    assert isinstance(p.decide(a2, v, 3.0), Hold)  # needs 60 blocks: b's expired 50 would not do
    assert p.counters["pauses"] == 1
    assert isinstance(p.decide(a2, v, 12.5), Hold)  # 9.5 s waiting
    assert p.decide(a2, v, 13.0) == Admit("w0") and p.counters["forced_resumes"] == 1
    assert p.state()["instances"]["w0"]["owned_blocks"] > 100  # over the budget: counted, bounded by the waits


def test_progress_ttl_admits_a_program_larger_than_the_budget_on_an_empty_instance():
    p = make_policy("progress_ttl", {"admit_usage": 0.5})
    big = Request("x-1", "x", "agent", prompt_tokens=1600)  # 100 + 64 blocks against a budget of 50
    assert p.decide(big, _ttl_view(), 0.0) == Admit("w0")
    assert isinstance(p.decide(Request("y-1", "y", "agent", prompt_tokens=16), _ttl_view(), 0.0), Hold)


def test_progress_ttl_takes_no_new_program_where_the_engine_counts_its_cache_full():
    """Ownership misses what programs grow past it; the engine's KV usage (a fresh sample) does not."""
    p = make_policy("progress_ttl", {"admit_usage": 0.9})
    full = ClusterView((InstanceView("w0", True, 0, InstanceMetrics(kv_cache_usage=0.95, num_blocks=100,
                                                                     block_size=16), 0.5),))
    assert isinstance(p.decide(Request("x-1", "x", "agent", prompt_tokens=16), full, 0.0), Hold)
    stale = ClusterView((InstanceView("w0", True, 0, full.instances[0].metrics, 60.0),))
    assert p.decide(Request("x-1", "x", "agent", prompt_tokens=16), stale, 1.0) == Admit("w0")


def test_progress_ttl_refuses_bad_options_in_one_message():
    with pytest.raises(RouterConfigError, match="ttl_min_s <= ttl_max_s"):
        make_policy("progress_ttl", {"ttl_min_s": 5.0, "ttl_max_s": 1.0})
    with pytest.raises(RouterConfigError, match="held_forget_s must be >= recheck_s"):
        make_policy("progress_ttl", {"held_forget_s": 0.001})


def test_progress_ttl_prefill_rate_is_the_busiest_recent_window_and_survives_an_engine_restart():
    p = make_policy("progress_ttl", {"rate_windows": 2})
    assert p.prefill_rate("w0") == p.config.prefill_tokens_per_s_prior  # no window yet

    def prompt(now: float, total: float) -> None:
        p.observe(MetricsSampled("w0", InstanceMetrics(prompt_tokens_total=total), now))

    prompt(0.0, 0.0)
    prompt(1.0, 3000.0)  # 3000 tokens/s
    prompt(2.0, 4000.0)  # 1000 tokens/s: a quiet window measures demand, not capacity
    assert p.prefill_rate("w0") == pytest.approx(3000.0)
    prompt(3.0, 5000.0)  # the 3000 window leaves the last 2
    assert p.prefill_rate("w0") == pytest.approx(1000.0)
    prompt(4.0, 10.0)  # the counter went back (engine restart): no rate from it
    prompt(5.0, 2010.0)
    assert p.prefill_rate("w0") == pytest.approx(2000.0)
