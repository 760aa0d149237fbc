"""kv_horizon on small hand-made cases, fake clock (router/policies/kv_horizon.py).

Engine in every case: 100 KV blocks of 16 tokens, U = 0.9 -> budget 90 blocks; decode rate
prior 10 tokens/s per sequence and horizon 16 s (set in OPTIONS) -> a running request reserves
min(10 * 16, out_b) = 160 tokens = 10 blocks of growth. Most cases use the request-level
model (``current_from: model``, ``growth_model: request``), whose sums are easy to compute
by hand; the defaults (engine-measured current blocks, session growth rate) have their own.
OPTIONS turn ``growth_remaining`` off so each case sums whole growths; the remaining-growth
cases turn it on.
"""

from __future__ import annotations

import pytest

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
    SessionEnded,
)

METRICS = InstanceMetrics(num_blocks=100, block_size=16)
OPTIONS = {"target_usage": 0.9, "decode_tokens_per_s_prior": 10.0, "horizon_s": 16.0, "turn_growth_prior_tokens": 32.0,
           "current_from": "model", "growth_model": "request", "lifetime_floor": False, "growth_remaining": False}


def policy(**kw):
    p = make_policy("kv_horizon", {**OPTIONS, **kw})
    for w in ("w0", "w1"):
        p.observe(MetricsSampled(w, METRICS, 0.0))
    return p


def cluster(*names: str, metrics=METRICS, age_s: float = 0.0) -> ClusterView:
    return ClusterView(tuple(InstanceView(n, metrics=metrics, metrics_age_s=age_s) for n in names))


def req(session: str, cls: str = "agent", turn: int = 0, tokens: int = 160, **kw) -> Request:
    return Request(request_id=f"{session}/{turn}", session_id=session, workload_class=cls, prompt_tokens=tokens, **kw)


def start(p, r: Request, view: ClusterView, now: float) -> str:
    d = p.decide(r, view, now)
    assert isinstance(d, Admit), d
    p.observe(RequestStarted(r, d.instance, now))
    return d.instance


def test_reservation_is_current_blocks_plus_decode_so_far_plus_horizon_growth() -> None:
    p = policy()
    start(p, req("s0", tokens=320), cluster("w0"), 0.0)  # 320 / 16 = 20 prompt blocks
    # t = 0: 20 + decoded 0 + growth 10 = 30 blocks
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(30.0)
    # t = 8 s: decoded 10 tok/s * 8 s = 80 tokens = 5 blocks -> 35
    assert p.reserved_blocks("w0", 8.0) == pytest.approx(35.0)
    # the turn finishes with 160 output tokens: 480 tokens = 30 blocks; between turns it
    # reserves those plus the class's turn growth prior 32 tokens = 2 blocks
    p.observe(RequestFinished(req("s0", tokens=320), "w0", 16.0, prompt_tokens=320, completion_tokens=160))
    assert p.reserved_blocks("w0", 16.0) == pytest.approx(32.0)


def test_default_reservation_is_the_engines_count_plus_new_prompts_plus_session_growth() -> None:
    p = policy(current_from="metrics", growth_model="session")
    view = cluster("w0")
    start(p, req("s0", tokens=320), view, 0.5)  # after the sample of t = 0 (usage 0)
    # 0 measured + 20 prompt blocks started since + gamma prior (r_w = 10 tok/s) x 16 s = 10 blocks
    assert p.reserved_blocks("w0", 0.5) == pytest.approx(30.0)
    p.observe(MetricsSampled("w0", InstanceMetrics(num_blocks=100, block_size=16, kv_cache_usage=0.25), 1.0))
    # the sample of t = 1 counts it: 25 measured blocks + 10 growth
    assert p.reserved_blocks("w0", 1.0) == pytest.approx(35.0)
    # it ends after 100 s with 1,320 tokens: gamma = (1320 - 320) / 100 s = 10 tok/s; after 8
    # such sessions the class's own gamma replaces the prior
    end = req("s0", tokens=1000, session_end=True)
    p.observe(RequestFinished(end, "w0", 100.5, prompt_tokens=1000, completion_tokens=320))
    assert list(p.session_growth["agent"]._samples) == [pytest.approx(10.0)]
    assert p.reserved_blocks("w0", 100.5) == 0.0  # the sample is stale by now: the model, no session left


def _complete_sessions(p, cls: str, n: int, first: int, final: int, residency_s: float) -> None:
    """``n`` sessions of ``cls`` on w1, each from ``first`` to ``final`` tokens in ``residency_s``."""
    for i in range(n):
        r = req(f"{cls}-done{i}", cls=cls, tokens=first, session_end=True)
        w = start(p, r, cluster("w1"), 0.0)
        p.observe(RequestFinished(r, w, residency_s, prompt_tokens=first, completion_tokens=final - first))


def test_growth_is_at_most_a_whole_session_of_the_class() -> None:
    # sessions of 4 s that grow 160 tokens: gamma = 40 tok/s, so gamma x 16 s = 640 tokens =
    # 40 blocks of growth, four times what a whole session adds (160 tokens = 10 blocks)
    for bound, growth in ((True, 10.0), (False, 40.0)):
        p = policy(current_from="metrics", growth_model="session", growth_bound=bound)
        _complete_sessions(p, "rlvr", 8, first=160, final=320, residency_s=4.0)
        assert p._session_growth_blocks(p._load("w0"), "rlvr", 16, "w0") == pytest.approx(growth)
        start(p, req("s0", cls="rlvr", tokens=320), cluster("w0"), 0.5)
        assert p.reserved_blocks("w0", 0.5) == pytest.approx(20 + growth)  # 20 prompt blocks since the sample
    # where the horizon is the shorter (sessions of 100 s growing 160 tokens: 1.6 tok/s x 16 s =
    # 25.6 tokens), the bound does not bind
    p = policy(current_from="metrics", growth_model="session", growth_bound=True)
    _complete_sessions(p, "rlvr", 8, first=160, final=320, residency_s=100.0)
    assert p._session_growth_blocks(p._load("w0"), "rlvr", 16, "w0") == pytest.approx(25.6 / 16)
    # before 8 sessions completed there is no G_b: r_w x horizon (10 tok/s x 16 s = 10 blocks),
    # at most the footprint prior (32,768 tokens, at most 1/8 of 100 blocks = 12.5: not binding)
    assert p._session_growth_blocks(p._load("w0"), "agent", 16, "w0") == pytest.approx(10.0)
    # a prior smaller than r_w x horizon binds: 1/20 of 100 blocks = 5 blocks
    p = policy(current_from="metrics", growth_model="session", growth_bound=True, footprint_prior_share=0.05)
    assert p._session_growth_blocks(p._load("w0"), "agent", 16, "w0") == pytest.approx(5.0)
    start(p, req("s0", cls="agent", tokens=320), cluster("w0"), 0.5)
    assert p.reserved_blocks("w0", 0.5) == pytest.approx(20 + 5.0)
    # without growth_bound the young session reserves the whole r_w x horizon
    p = policy(current_from="metrics", growth_model="session", growth_bound=False, footprint_prior_share=0.05)
    assert p._session_growth_blocks(p._load("w0"), "agent", 16, "w0") == pytest.approx(10.0)


def test_lifetime_floor_reserves_the_class_mean_footprint_for_young_sessions() -> None:
    p = policy(lifetime_floor=True, footprint_prior_tokens=480.0, footprint_prior_share=1.0)  # prior k̄ = 30 blocks
    view = cluster("w0")
    start(p, req("s0", tokens=16), view, 0.0)  # 1 block + 10 growth, but k̄ = 30 counts
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(30.0)
    start(p, req("s1", tokens=16), view, 0.0)
    start(p, req("s2", tokens=16), view, 0.0)
    assert isinstance(p.decide(req("s3", tokens=16), view, 0.0), Hold)  # 3 x 30 = 90: full
    # 8 completed sessions of 100 s holding 10 blocks each -> k̄ = 10 blocks
    for i in range(8):
        r = req(f"d{i}", cls="rlhf", tokens=160, session_end=True)
        p.observe(MetricsSampled("w1", METRICS, 0.0))
        w = start(p, r, cluster("w1"), 0.0)
        p.observe(RequestFinished(r, w, 100.0, prompt_tokens=160, completion_tokens=0))
    assert p._footprint_blocks("rlhf", "w0") == pytest.approx(10.0)


def test_the_footprint_prior_is_at_most_its_share_of_the_instance() -> None:
    # a prior of 32,768 tokens on an instance of 100 blocks x 16 tokens (1,600 tokens) would let
    # one young session fill it; at share 1/8 the prior is 12.5 blocks: 7 fit the budget of 90
    p = policy(lifetime_floor=True, footprint_prior_tokens=32768.0, footprint_prior_share=0.125)
    view = cluster("w0")
    assert p._footprint_blocks("agent", "w0") == pytest.approx(12.5)
    for i in range(7):
        start(p, req(f"s{i}", tokens=16), view, 0.0)
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(7 * 12.5)
    assert isinstance(p.decide(req("s7", tokens=16), view, 0.0), Hold)
    # on an instance 100x larger the token prior (2,048 blocks) is the smaller one
    big = InstanceMetrics(num_blocks=100 * 100 * 16, block_size=16)
    p.observe(MetricsSampled("w1", big, 0.0))
    assert p._footprint_blocks("agent", "w1") == pytest.approx(32768 / 16)
    with pytest.raises(ValueError, match="footprint_prior_share"):
        policy(footprint_prior_share=0.0)


def test_a_last_request_reserves_at_most_its_max_tokens() -> None:
    # prompt 64 tokens = 4 blocks, max_tokens 16 = 1 block: the engine stops it at 5 blocks, so
    # it reserves 4 + min(10 growth, 1) = 5, and its lifetime floor min(k̄ prior 12.5, 4 + 1) = 5
    last = dict(tokens=64, session_end=True, max_tokens=16)
    for bound, reserved, admitted in ((True, 5.0, 18), (False, 14.0, 6)):
        p = policy(lifetime_floor=True, request_bound=bound)
        view = cluster("w0")
        start(p, req("s0", cls="rlvr", **last), view, 0.0)
        assert p.reserved_blocks("w0", 0.0) == pytest.approx(reserved)
        n = 1
        while isinstance(p.decide(req(f"s{n}", cls="rlvr", **last), view, 0.0), Admit):
            p.observe(RequestStarted(req(f"s{n}", cls="rlvr", **last), "w0", 0.0))
            n += 1
        # budget 90: 18 x 5 with the bound; without it 6 x max(4 + 10, 12.5) = 84
        assert n == admitted
        assert p.reserved_blocks("w0", 0.0) == pytest.approx(admitted * reserved)


def test_request_bound_applies_to_the_last_request_only_and_leaves_with_it() -> None:
    p = policy()
    view = cluster("w0")
    # a turn that is not the session's last may be followed by more: full growth (10 blocks)
    start(p, req("a", tokens=160, max_tokens=16), view, 0.0)
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(10 + 10)
    # two last requests of one class: 10 prompt blocks + 1 each, and 10 + 3
    one, three = req("b", tokens=160, session_end=True, max_tokens=16), req("c", tokens=160, session_end=True, max_tokens=48)
    start(p, one, view, 0.0)
    start(p, three, view, 0.0)
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(20 + 11 + 13)
    # a last request whose max_tokens exceeds the growth reserves the growth: 10 + min(10, 100)
    start(p, req("d", cls="rlhf", tokens=160, session_end=True, max_tokens=1600), view, 0.0)
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(20 + 11 + 13 + 20)
    # each leaves with exactly what it reserved
    p.observe(RequestFinished(three, "w0", 0.0, prompt_tokens=160, completion_tokens=48))
    p.observe(RequestFinished(one, "w0", 0.0, prompt_tokens=160, completion_tokens=16))
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(20 + 20)
    load = p._load("w0")
    assert load.closing_by_class == {"rlhf": 1} and load.closing_growth == pytest.approx({"rlhf": 100.0})


def test_stale_metrics_fall_back_to_the_model() -> None:
    p = policy(current_from="metrics", growth_model="session")
    start(p, req("s0", tokens=320), cluster("w0"), 0.5)
    # 60 s later the last sample is stale: prompt 20 + decoded 10 tok/s x 59.5 s / 16 + growth 10
    assert p.reserved_blocks("w0", 60.0) == pytest.approx(20 + 595 / 16 + 10)


def test_new_sessions_admitted_while_eq3_budget_holds_then_held() -> None:
    p = policy()
    view = cluster("w0")
    # each session: 20 prompt blocks + 10 growth = 30; budget 90 -> three fit, the fourth not
    for i in range(3):
        start(p, req(f"s{i}", cls="agent", tokens=320), view, 0.0)
        assert p.reserved_blocks("w0", 0.0) <= p.budget_blocks("w0")
    d = p.decide(req("s3", cls="agent", tokens=320), view, 0.0)
    assert isinstance(d, Hold) and "room" in d.reason
    assert p.state()["over_budget_admissions"] == 0


def test_continuation_is_never_held_by_the_budget_or_the_queue() -> None:
    p = policy()
    view = cluster("w0")
    start(p, req("a", tokens=320), view, 0.0)
    p.observe(RequestFinished(req("a", tokens=320), "w0", 1.0, prompt_tokens=320, completion_tokens=16))
    for i in range(2):
        start(p, req(f"s{i}", tokens=320), view, 1.0)
    assert isinstance(p.decide(req("late", tokens=320), view, 1.0), Hold)  # budget full, a new session waits
    # the next turn of "a" is 1,200 tokens (75 blocks): far over the budget, admitted anyway
    d = p.decide(req("a", turn=1, tokens=1200), view, 2.0)
    assert d == Admit("w0", reason="continuation")


def test_class_is_never_starved_beyond_its_floor() -> None:
    p = policy()
    view = cluster("w0")
    for i in range(3):
        start(p, req(f"v{i}", cls="rlvr", tokens=320), view, 0.0)
    assert isinstance(p.decide(req("v3", cls="rlvr", tokens=320), view, 0.0), Hold)
    # rlhf has no session on w0: its floor (1) admits one past the budget and past the
    # older held rlvr session, and counts it as an overshoot of Eq. 3
    d = p.decide(req("h0", cls="rlhf", tokens=320), view, 0.0)
    assert isinstance(d, Admit) and d.reason.startswith("floor")
    st = p.state()
    assert st["floor_admissions"] == 1 and st["over_budget_admissions"] == 1
    # a second rlhf session is above the floor: it waits like any other
    assert isinstance(p.decide(req("h1", cls="rlhf", tokens=320), view, 0.0), Hold)
    assert p.state()["instances"]["w0"]["floor_sessions"] == {"rlhf": 1}


def test_without_a_floor_a_class_waits_behind_the_budget() -> None:
    p = policy(class_floor_sessions=0)
    view = cluster("w0")
    for i in range(3):
        start(p, req(f"v{i}", cls="rlvr", tokens=320), view, 0.0)
    assert isinstance(p.decide(req("h0", cls="rlhf", tokens=320), view, 0.0), Hold)


def two_running_and_a_big_one_held(backfill_share: float):
    """w0 with two agent sessions of 30 blocks (60 of the 90-block budget) and a big agent
    session (60 prompt blocks + 10 growth) held: it does not fit."""
    p = policy(class_floor_sessions=0, backfill_share=backfill_share)
    view = cluster("w0")
    for i in range(2):
        start(p, req(f"a{i}", tokens=320), view, 0.0)
    assert isinstance(p.decide(req("big", tokens=960), view, 0.0), Hold)
    return p, view


def test_new_sessions_admitted_in_arrival_order_over_classes() -> None:
    p, view = two_running_and_a_big_one_held(backfill_share=0.0)
    # a small rlhf one that would fit (2 + 10) must not pass the held big one
    d = p.decide(req("small", cls="rlhf", tokens=32), view, 0.0)
    assert isinstance(d, Hold) and "behind" in d.reason
    # one session ends: the big one enters first, then the small one
    p.observe(RequestFinished(req("a0", tokens=320, session_end=True), "w0", 1.0, prompt_tokens=320,
                              completion_tokens=0))
    p.observe(SessionEnded("a1", 1.0))
    assert isinstance(p.decide(req("big", tokens=960), view, 1.0), Admit)
    assert isinstance(p.decide(req("small", cls="rlhf", tokens=32), view, 1.0), Admit)


def test_a_small_session_passes_a_held_one_only_within_the_backfill_share() -> None:
    # budget 90 blocks, backfill share 0.3 -> 27 blocks may enter past the queue at a time
    p, view = two_running_and_a_big_one_held(backfill_share=0.3)
    # small rlhf sessions of 2 + 10 = 12 blocks fit the budget's 30 free blocks: two pass the
    # held big one (24 of the 27 blocks of the share), a third would exceed the share and waits
    for i in range(2):
        d = p.decide(req(f"small{i}", cls="rlhf", tokens=32), view, 0.0)
        assert d == Admit("w0", reason="backfill new")
    d = p.decide(req("small2", cls="rlhf", tokens=32), view, 0.0)
    assert isinstance(d, Hold) and "behind" in d.reason
    st = p.state()
    assert st["backfill_admissions"] == 2 and st["instances"]["w0"]["backfill_blocks"] == pytest.approx(24.0)
    assert st["over_budget_admissions"] == 0  # a backfill never breaks Eq. 3
    # one backfilled session ends: its share is free again, the next small one passes
    p.observe(SessionEnded("small0", 1.0))
    assert p.state()["instances"]["w0"]["backfill_blocks"] == pytest.approx(12.0)
    assert p.decide(req("small2", cls="rlhf", tokens=32), view, 1.0) == Admit("w0", reason="backfill new")
    # the held big one enters as soon as the budget has its room (70 of it; small2 reserves
    # 12 and what it decoded), ahead of every younger one
    for s in ("a0", "a1", "small1"):
        p.observe(SessionEnded(s, 2.0))
    assert p.decide(req("big", tokens=960), view, 2.0) == Admit("w0", reason="new")


def test_a_class_passes_the_queue_only_while_it_holds_its_share_of_the_held_sessions() -> None:
    p, view = two_running_and_a_big_one_held(backfill_share=1.0)
    for i in range(1, 3):  # three big agent sessions wait (70 blocks each)
        assert isinstance(p.decide(req(f"big{i}", tokens=960), view, 0.0), Hold)
    # seen so far: 5 agent, then 1 rlhf -> rlhf's arrival share 1/6; held with it: 1 of 4,
    # 1/4 >= 1/6, so it may pass
    assert p.decide(req("h0", cls="rlhf", tokens=32), view, 0.0) == Admit("w0", reason="backfill new")
    # three more agent sessions arrive and wait (6 held); the next rlhf ones are 1 of 7 held
    # against 2 of 10 seen, then 2 of 8 against 3 of 11: they wait their turn like the rest
    for i in range(3, 6):
        assert isinstance(p.decide(req(f"big{i}", tokens=960), view, 0.0), Hold)
    for h in ("h1", "h2"):
        d = p.decide(req(h, cls="rlhf", tokens=32), view, 0.0)
        assert isinstance(d, Hold) and "behind" in d.reason
    # a fourth makes the class 3 of 9 held and 4 of 12 seen (3/9 >= 4/12): it passes
    assert p.decide(req("h3", cls="rlhf", tokens=32), view, 0.0) == Admit("w0", reason="backfill new")
    assert p.state()["backfill_admissions"] == 2


def test_a_backfill_never_takes_room_the_budget_does_not_have() -> None:
    p = policy(class_floor_sessions=0, backfill_share=1.0)
    view = cluster("w0")
    for i in range(3):
        start(p, req(f"a{i}", tokens=320), view, 0.0)  # 90 of 90 blocks reserved
    assert isinstance(p.decide(req("big", tokens=960), view, 0.0), Hold)
    d = p.decide(req("small", cls="rlhf", tokens=32), view, 0.0)
    assert isinstance(d, Hold) and "behind" in d.reason
    assert p.state()["backfill_admissions"] == 0
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=rf"backfill_share must be in \[0, 1\], got {bad}"):
            policy(backfill_share=bad)
    with pytest.raises(ValueError, match=r"backoff must be in \(0, 1\), got 1.0; horizon_s must be > 0, got 0"):
        policy(backoff=1.0, horizon_s=0)  # every bad value named with what was given
    with pytest.raises(ValueError, match=r"held_forget_s must be >= no_healthy_recheck_s \(1.0\), got 0.8"):
        policy(held_forget_s=0.8)  # a held session would be forgotten before its recheck


def test_shared_prefix_is_reserved_once_per_instance() -> None:
    from router.policies.base import BlocksStored

    p = policy()
    view = cluster("w0")
    shared = tuple(range(1, 11))  # a 10-block class prompt already cached on w0
    p.observe(BlocksStored("w0", shared, 0.0))
    r = req("s0", tokens=320, block_hashes=shared + (101, 102, 103, 104, 105, 106, 107, 108, 109, 110))
    start(p, r, view, 0.0)
    # 20 prompt blocks, 10 of them matched on w0: own 10 + growth 10
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(20.0)


def test_preemptions_back_the_usage_target_off_and_clean_samples_restore_it() -> None:
    p = policy()
    p.observe(MetricsSampled("w0", InstanceMetrics(num_blocks=100, block_size=16, num_preemptions_total=3), 1.0))
    assert p.budget_blocks("w0") == pytest.approx(0.9 * 0.95 * 100)  # U_w <- 0.95 U_w
    p.observe(MetricsSampled("w0", InstanceMetrics(num_blocks=100, block_size=16, num_preemptions_total=3), 6.0))
    # 5 s without preemptions: +0.002/s * 5 s = +0.01
    assert p.budget_blocks("w0") == pytest.approx((0.9 * 0.95 + 0.01) * 100)
    p.observe(MetricsSampled("w0", InstanceMetrics(num_blocks=100, block_size=16, num_preemptions_total=3), 600.0))
    assert p.budget_blocks("w0") == pytest.approx(90.0)  # never above target_usage


def test_decode_rate_follows_the_engines_generation_counter() -> None:
    p = policy(rate_smoothing=1.0)
    p.observe(MetricsSampled("w0", InstanceMetrics(num_blocks=100, block_size=16, num_requests_running=4,
                                                   generation_tokens_total=400.0), 2.0))
    # 400 tokens in 2 s over 4 sequences = 50 tokens/s each
    assert p.state()["instances"]["w0"]["decode_tokens_per_s"] == pytest.approx(50.0)


def test_decode_rate_counts_scrapes_in_which_the_bursty_counter_did_not_move() -> None:
    """vLLM's generation counter moves in bursts: 4 sequences at 20 tokens/s each show 0
    tokens in one 0.5 s scrape and 80 in the next. The rate is 20, not the 40 of the scrapes
    that moved."""
    p = policy(rate_smoothing=0.2)
    total, t = 0.0, 0.0
    for i in range(40):
        t += 0.5
        total += 80.0 if i % 2 else 0.0
        p.observe(MetricsSampled("w1", InstanceMetrics(num_blocks=100, block_size=16, num_requests_running=4,
                                                       generation_tokens_total=total), t))
    assert p.state()["instances"]["w1"]["decode_tokens_per_s"] == pytest.approx(20.0, rel=0.15)
    # an idle engine (nothing running at either end of a scrape, nothing generated) leaves
    # the rate as it was: after the scrape in which the last sequences ended, nothing moves
    idle = InstanceMetrics(num_blocks=100, block_size=16, num_requests_running=0, generation_tokens_total=total)
    p.observe(MetricsSampled("w1", idle, t + 0.5))
    before = p.state()["instances"]["w1"]["decode_tokens_per_s"]
    for k in range(2, 7):
        p.observe(MetricsSampled("w1", idle, t + 0.5 * k))
    assert p.state()["instances"]["w1"]["decode_tokens_per_s"] == before


def test_long_waiting_queue_or_usage_above_target_stops_new_sessions_only() -> None:
    p = policy()
    start(p, req("a"), cluster("w0"), 0.0)
    queued = InstanceMetrics(num_blocks=100, block_size=16, num_requests_waiting=9)
    d = p.decide(req("b"), cluster("w0", metrics=queued), 0.0)
    assert isinstance(d, Hold) and "signal" in d.reason
    full = InstanceMetrics(num_blocks=100, block_size=16, kv_cache_usage=0.95)
    assert isinstance(p.decide(req("b"), cluster("w0", metrics=full), 0.0), Hold)
    assert isinstance(p.decide(req("a", turn=1), cluster("w0", metrics=full), 0.0), Admit)
    # a stale sample gives no signal
    assert isinstance(p.decide(req("b"), cluster("w0", metrics=full, age_s=60.0), 0.0), Admit)


def test_placement_prefers_the_prefix_match_unless_that_instance_is_much_fuller() -> None:
    from router.policies.base import BlocksStored

    p = policy(balance_blocks=64.0)
    view = cluster("w0", "w1")
    group = tuple(range(1, 9))  # 8 blocks of a group prompt cached on w1
    p.observe(BlocksStored("w1", group, 0.0))
    r = req("g1", tokens=160, block_hashes=group + (50, 51))
    # w0: own 10 blocks + 0 fill; w1: own 2 + 0 fill -> w1
    assert start(p, r, view, 0.0) == "w1"
    # fill w1 (its reservations reach 62 of 90): 64 * 62/90 = 44 > the 8 blocks saved -> w0
    start(p, req("fill", tokens=640), ClusterView((view.instances[1],)), 0.0)
    r2 = req("g2", tokens=160, block_hashes=group + (60, 61))
    assert start(p, r2, view, 0.0) == "w0"


def test_abandoned_hold_is_forgotten_and_does_not_block_the_queue() -> None:
    p = policy(class_floor_sessions=0)
    view = cluster("w0")
    for i in range(3):
        start(p, req(f"s{i}", tokens=320), view, 0.0)
    assert isinstance(p.decide(req("gone", tokens=320), view, 0.0), Hold)
    p.observe(RequestFinished(req("gone", tokens=320), "", 1.0, ok=False))  # its client left
    p.observe(SessionEnded("s0", 1.0))
    assert isinstance(p.decide(req("next", tokens=160), view, 1.0), Admit)  # 61.25 + 20 <= 90
    assert p.state()["abandoned_holds"] == 1


@pytest.mark.parametrize("remaining", [False, True])
def test_a_session_that_ends_returns_exactly_its_reservation(remaining: bool) -> None:
    # regression: a session closed by its last request's X-Session-End was once subtracted
    # from the idle sums it never entered, and the instance's reservation went negative
    p = policy(growth_model="request", growth_remaining=remaining)
    view = cluster("w0")
    start(p, req("keep", tokens=320), view, 0.0)
    kept = p.reserved_blocks("w0", 0.0)
    for i in range(3):
        r = req(f"s{i}", tokens=160, session_end=True)
        start(p, r, view, 0.0)
        p.observe(RequestFinished(r, "w0", 0.0, prompt_tokens=160, completion_tokens=160))
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(kept)


def test_growth_remaining_reserves_what_a_session_has_left_to_grow() -> None:
    # G_b before 8 sessions completed = the footprint prior, 1/8 of 100 blocks = 12.5 blocks;
    # g = min(r_w x horizon = 10 blocks, 12.5) = 10
    p = policy(growth_model="session", growth_remaining=True)
    start(p, req("s0", tokens=320), cluster("w0"), 0.0)  # 20 own prompt blocks
    assert p.reserved_blocks("w0", 0.0) == pytest.approx(20 + 10)  # young: the whole horizon growth
    # t = 8 s: decoded 5 blocks, left 12.5 - 5 = 7.5 < 10 (a whole growth again would be 35)
    assert p.reserved_blocks("w0", 8.0) == pytest.approx(25 + 7.5)
    assert p.reserved_blocks("w0", 16.0) == pytest.approx(30 + 2.5)
    assert p.reserved_blocks("w0", 24.0) == pytest.approx(35 + 0.0)  # past G_b: nothing more
    # the turn ends with 560 tokens (35 blocks): idle, grown 15 >= 12.5 -> only its blocks
    p.observe(RequestFinished(req("s0", tokens=320), "w0", 24.0, prompt_tokens=320, completion_tokens=240))
    assert p.reserved_blocks("w0", 24.0) == pytest.approx(35.0)
    # its next turn (600 tokens = 37 blocks) reserves its prompt and nothing to grow
    start(p, req("s0", turn=1, tokens=600), cluster("w0"), 30.0)
    assert p.reserved_blocks("w0", 30.0) == pytest.approx(37.0)
    # a young session beside it: the class's bound is min(2 x 10, 2 x 12.5 - 12.5) = 12.5, at
    # least the exact 10 + 0 (the grown session counts at most G_b, so its excess of 4.5
    # blocks cannot eat the young one's reservation)
    start(p, req("s1", tokens=320), cluster("w0"), 30.0)
    assert p.reserved_blocks("w0", 30.0) == pytest.approx(37 + 20 + 12.5)


def test_growth_remaining_follows_the_measured_whole_session_growth() -> None:
    # 8 completed rlvr sessions grew 160 tokens each: G_b = 10 blocks (gamma x 16 s = 25.6 tokens
    # over 100 s sessions, so g = 1.6 blocks binds while a session is young)
    p = policy(growth_model="session", growth_remaining=True)
    _complete_sessions(p, "rlvr", 8, first=160, final=320, residency_s=100.0)
    start(p, req("s0", cls="rlvr", tokens=160), cluster("w0"), 200.0)  # 10 prompt blocks
    assert p.reserved_blocks("w0", 200.0) == pytest.approx(10 + 1.6)
    # after 15.2 s it decoded 152 tokens = 9.5 blocks: 0.5 blocks left < g
    assert p.reserved_blocks("w0", 215.2) == pytest.approx(19.5 + 0.5)
    assert p.reserved_blocks("w0", 230.0) == pytest.approx(10 + 30 * 10 / 16)  # past G_b: held only


def test_a_request_decoding_past_its_class_growth_does_not_lower_another_sessions_reservation() -> None:
    # G_b = the prior 12.5 blocks = 200 tokens = 20 s of decode at 10 tok/s. "old" decodes for
    # 50 s (31.25 blocks, far past G_b); summed unclipped it would cancel the young session's
    # growth (2 x 12.5 - 31.25 < 0). It leaves the growing sums after 20 s instead.
    p = policy(growth_model="session", growth_remaining=True)
    start(p, req("old", tokens=320), cluster("w0"), 0.0)
    assert p.reserved_blocks("w0", 19.0) == pytest.approx(20 + 19 * 10 / 16 + (12.5 - 19 * 10 / 16))
    start(p, req("young", tokens=320), cluster("w0"), 50.0)
    # held: 2 x 20 prompt blocks + 31.25 decoded; growth: min(2 x g = 20, young's 12.5 left) = 12.5
    assert p.reserved_blocks("w0", 50.0) == pytest.approx(40 + 31.25 + 12.5)
    assert p._load("w0").growing_count == {"agent": 1}
    # both end: every growing sum returns to empty
    for sid in ("old", "young"):
        r = req(sid, tokens=320, session_end=True)
        p.observe(RequestFinished(r, "w0", 51.0, prompt_tokens=320, completion_tokens=10))
    load = p._load("w0")
    assert (load.growing_count, load.grown, load.start_by_class) == ({}, {}, {})
    assert p.reserved_blocks("w0", 51.0) == pytest.approx(0.0)


def _learn_prefill_shares(p, view: ClusterView) -> None:
    """8 agent requests (4 sessions of 2 turns: 160 new prompt tokens then 64, 16 output
    each: phi = 112 / (112 + 16) = 0.875) and 8 single-turn rlvr samples (32 prompt tokens,
    320 output: phi = 32 / 352 = 0.09), each session ended."""
    for i in range(4):
        r0 = req(f"learn-a{i}", tokens=160)
        w = start(p, r0, view, 0.0)
        p.observe(RequestFinished(r0, w, 1.0, prompt_tokens=160, completion_tokens=16))
        r1 = req(f"learn-a{i}", turn=1, tokens=160 + 16 + 64, session_end=True)
        start(p, r1, view, 2.0)
        p.observe(RequestFinished(r1, w, 3.0, prompt_tokens=240, completion_tokens=16))
    for i in range(8):
        r = req(f"learn-r{i}", cls="rlvr", tokens=32, session_end=True)
        w = start(p, r, view, 0.0)
        p.observe(RequestFinished(r, w, 4.0, prompt_tokens=32, completion_tokens=320))


def test_prefill_share_is_what_requests_add_to_their_session_over_that_plus_output() -> None:
    p = policy(interference_blocks=64.0)
    view = cluster("w0", "w1")
    assert p.prefill_share("agent") is None  # before 8 requests: no term
    _learn_prefill_shares(p, view)
    assert p.prefill_share("agent") == pytest.approx(112 / 128)
    assert p.prefill_share("rlvr") == pytest.approx(32 / 352)
    assert p.state()["prefill_share"] == {"agent": pytest.approx(112 / 128), "rlvr": pytest.approx(32 / 352)}


@pytest.mark.parametrize("interference_blocks, agent_to, rlvr_to", [(0.0, "w1", "w0"), (64.0, "w0", "w1")])
def test_interference_places_a_session_beside_its_own_kind_unless_off(interference_blocks: float, agent_to: str,
                                                                       rlvr_to: str) -> None:
    p = policy(interference_blocks=interference_blocks)
    view = cluster("w0", "w1")
    _learn_prefill_shares(p, view)
    assert start(p, req("a1", tokens=320), ClusterView((view.instances[0],)), 5.0) == "w0"  # 20 + 1 growth blocks
    assert start(p, req("r1", cls="rlvr", tokens=32), ClusterView((view.instances[1],)), 5.0) == "w1"  # 2 + 10
    # a new agent session (10 own blocks either way): w0 costs 10 + 64 x 21/90 = 24.9, w1
    # 10 + 64 x 12/90 = 18.5, so the fill alone sends it to w1; the term adds 64 x |0.875 - 0.09|
    # = 50 on w1 (an rlvr instance) and nothing on w0 (an agent one)
    assert start(p, req("a2", tokens=160), view, 5.0) == agent_to
    # and an rlvr sample goes to the rlvr instance even when it is the fuller one: with 3 more
    # rlvr on w1, the term on: w0 (32 blocks, agents) costs 2 + 22.8 + 50.2 = 75, w1 (48) 2 + 34.1;
    # off: w0 (21) 2 + 14.9, w1 (59 with a2) 2 + 42
    for i in range(3):
        start(p, req(f"r-fill{i}", cls="rlvr", tokens=32), ClusterView((view.instances[1],)), 5.0)
    assert start(p, req("r2", cls="rlvr", tokens=32), view, 5.0) == rlvr_to


def test_interference_never_places_past_the_budget() -> None:
    p = policy(interference_blocks=1e6)
    view = cluster("w0", "w1")
    _learn_prefill_shares(p, view)
    start(p, req("r1", cls="rlvr", tokens=32), ClusterView((view.instances[1],)), 5.0)
    start(p, req("big", tokens=1200), ClusterView((view.instances[1],)), 5.0)  # w1: 12 + 75 + 1 = 88 of 90
    assert start(p, req("r2", cls="rlvr", tokens=32), view, 5.0) == "w0"  # 12 more do not fit on w1
    with pytest.raises(ValueError, match="interference_blocks must be >= 0"):
        make_policy("kv_horizon", {"interference_blocks": -1})
