"""session_admission / misa / misa_t against hand-computed values (MISA-T Eqs. 6-13), fake clock."""

from __future__ import annotations

import pytest

from router.estimators import MetricWindow
from router.policies import make_policy, policy_config_fields
from router.policies.base import (
    Admit,
    BlocksStored,
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
    UnknownOptionError,
)
from router.policies.overload import OverloadControl
from router.policies.session_admission import SessionAdmissionConfig

METRICS = InstanceMetrics(num_blocks=100, block_size=16)  # C_w = 0.9 * 100 = 90 blocks


def cluster(*names: str, unhealthy: tuple[str, ...] = (), age_s: float = 0.0, metrics=METRICS) -> ClusterView:
    return ClusterView(
        tuple(InstanceView(n, healthy=n not in unhealthy, metrics=metrics, metrics_age_s=age_s) for n in names)
    )


def req(session: str, cls: str = "default", turn: int = 0, **kw) -> Request:
    return Request(request_id=f"{session}/{turn}", session_id=session, workload_class=cls, **kw)


def admitted(decision) -> str:
    assert isinstance(decision, Admit), decision
    return decision.instance


def run_session(policy, view, session, cls, start_s, end_s, tokens=16):
    """One single-request session from admission at start_s to X-Session-End at end_s."""
    r = req(session, cls, session_end=True, prompt_tokens=tokens)
    w = admitted(policy.decide(r, view, start_s))
    policy.observe(RequestStarted(r, w, start_s))
    policy.observe(RequestFinished(r, w, end_s, prompt_tokens=tokens, completion_tokens=0))
    return w


# --------------------------------------------------------------------------- Eq. 6


def test_new_sessions_admitted_until_global_cap_then_held() -> None:
    # K_base = floor(C_w / k_ref) = floor(90 / 10) = 9  (MISA-T section 4.1)
    policy = make_policy("session_admission", {"k_prior_blocks": 10})
    view = cluster("w0")
    decisions = [policy.decide(req(f"s{i}"), view, 0.0) for i in range(10)]
    assert all(isinstance(d, Admit) for d in decisions[:9])
    assert isinstance(decisions[9], Hold)
    assert policy.state()["instances"]["w0"]["base_cap"] == 9


def test_continuation_never_held_by_cap() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 45})  # K = floor(90/45) = 2
    view = cluster("w0")
    first = req("a")
    assert admitted(policy.decide(first, view, 0.0)) == "w0"
    admitted(policy.decide(req("b"), view, 0.0))
    assert isinstance(policy.decide(req("c"), view, 0.0), Hold)
    assert policy.decide(req("a", turn=1), view, 1.0) == Admit("w0", reason="continuation")


def test_pending_session_becomes_active_only_after_a_later_snapshot() -> None:
    policy = make_policy("session_admission")
    view = cluster("w0")
    r = req("a")
    policy.decide(r, view, 0.0)
    policy.observe(RequestStarted(r, "w0", 1.0))
    policy.observe(MetricsSampled("w0", METRICS, 1.0))  # same instant: not after the start
    assert (policy.session_ledger.pending_count("w0"), policy.session_ledger.active_count("w0")) == (1, 0)
    policy.observe(MetricsSampled("w0", METRICS, 2.0))
    assert (policy.session_ledger.pending_count("w0"), policy.session_ledger.active_count("w0")) == (0, 1)


def test_session_end_header_frees_cap_headroom() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 90})  # K = 1
    view = cluster("w0")
    run_session(policy, view, "a", "default", 0.0, 1.0)
    assert policy.session_ledger.ended_by_reason == {"end": 1}
    assert admitted(policy.decide(req("b"), view, 2.0)) == "w0"


def test_idle_session_expires_from_now_and_frees_cap() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 90, "idle_timeout_s": 10})
    view = cluster("w0")
    r = req("a")
    policy.decide(r, view, 0.0)
    policy.observe(RequestStarted(r, "w0", 0.0))
    policy.observe(RequestFinished(r, "w0", 1.0, prompt_tokens=16))
    assert isinstance(policy.decide(req("b"), view, 10.9), Hold)  # idle 9.9 s < 10 s
    assert admitted(policy.decide(req("b"), view, 11.0)) == "w0"
    assert policy.session_ledger.ended_by_reason == {"idle_timeout": 1}


def test_session_with_request_in_flight_never_idles_out() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 90, "idle_timeout_s": 10})
    view = cluster("w0")
    r = req("a")
    policy.decide(r, view, 0.0)
    policy.observe(RequestStarted(r, "w0", 0.0))  # a long decode, nothing finishes
    assert isinstance(policy.decide(req("b"), view, 500.0), Hold)


def test_held_sessions_of_a_class_are_admitted_in_arrival_order() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 90})  # K = 1
    view = cluster("w0")
    policy.decide(req("a"), view, 0.0)
    assert isinstance(policy.decide(req("early"), view, 1.0), Hold)
    assert isinstance(policy.decide(req("late"), view, 2.0), Hold)
    policy.observe(SessionEnded("a", 3.0))
    assert isinstance(policy.decide(req("late"), view, 3.0), Hold)  # must not jump "early"
    assert admitted(policy.decide(req("early"), view, 3.1)) == "w0"


def test_recheck_delay_shrinks_as_group_siblings_become_visible() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 30, "recheck_max_s": 1.0})  # K = 3
    view = cluster("w0")
    for i in range(3):
        r = req(f"g-{i}", group_id="g")
        policy.decide(r, view, 0.0)
        policy.observe(RequestStarted(r, "w0", 0.0))
    assert policy.decide(req("other"), view, 0.5).recheck_after_s == 1.0
    assert policy.decide(req("g-3", group_id="g"), view, 0.5).recheck_after_s == 1.0  # siblings pending
    policy.observe(MetricsSampled("w0", METRICS, 1.0))  # 3 siblings visible
    assert policy.decide(req("g-3", group_id="g"), view, 1.5).recheck_after_s == pytest.approx(1.0 / 4)


def test_unhealthy_bound_instance_rebinds_session_elsewhere() -> None:
    policy = make_policy("session_admission")
    r = req("a")
    assert admitted(policy.decide(r, cluster("w0", "w1"), 0.0)) == "w0"
    policy.observe(InstanceHealthChanged("w0", False, 1.0))
    decision = policy.decide(req("a", turn=1), cluster("w0", "w1", unhealthy=("w0",)), 1.0)
    assert decision == Admit("w1", reason="rebound")


def test_no_healthy_instance_holds_and_keeps_the_demand() -> None:
    policy = make_policy("misa")
    decision = policy.decide(req("a", "agent"), cluster("w0", unhealthy=("w0",)), 0.0)
    assert isinstance(decision, Hold)
    assert policy.session_ledger.held_counts() == {"agent": 1}


def test_stale_metrics_fall_back_to_conservative_capacity() -> None:
    big = InstanceMetrics(num_blocks=1000, block_size=16)
    policy = make_policy("session_admission", {"k_prior_blocks": 10, "fallback_num_blocks": 100})
    fresh = policy.instance_caps(InstanceView("w0", metrics=big, metrics_age_s=1.0))
    stale = policy.instance_caps(InstanceView("w0", metrics=big, metrics_age_s=60.0))
    missing = policy.instance_caps(InstanceView("w1"))
    assert (fresh.protected_blocks, fresh.cap, fresh.stale) == (900.0, 90, False)
    assert (stale.protected_blocks, stale.cap, stale.stale) == (90.0, 9, True)
    assert (missing.protected_blocks, missing.cap) == (90.0, 9)


def test_reference_footprint_is_window_quantile_after_min_samples() -> None:
    policy = make_policy("session_admission", {"k_min_samples": 4, "k_quantile": 0.75, "k_prior_blocks": 3})
    view = cluster("w0")
    seen = []
    for i, blocks in enumerate([1, 2, 4, 8]):
        # 16-token blocks: (prompt + completion) / 16 = blocks
        run_session(policy, view, f"s{i}", "default", float(i), float(i) + 0.5, tokens=16 * blocks)
        seen.append(policy.reference_blocks())
    # fewer than 4 samples: max(prior 3, p75); then p75 of [1, 2, 4, 8] (nearest rank) alone
    assert seen == [3, 3, 4, 4]
    assert policy.state()["instances"]["w0"]["base_cap"] == 22  # floor(90 / 4)


# --------------------------------------------------------------------------- Eq. 7


def _reacquiring_setup(prefill_tokens_per_s: float):
    """Session "a" idled out of w0 with 10 cached blocks (160 tokens); w0 is full (K=1), w1 is empty."""
    policy = make_policy(
        "session_admission",
        {"k_prior_blocks": 60, "idle_timeout_s": 5, "prefill_tokens_per_s_prior": prefill_tokens_per_s},
    )
    view = cluster("w0", "w1")
    hashes = tuple(range(1, 11))
    first = req("a", prompt_tokens=160, block_hashes=hashes)
    assert admitted(policy.decide(first, view, 0.0)) == "w0"
    policy.observe(RequestStarted(first, "w0", 0.0))
    policy.observe(RequestFinished(first, "w0", 1.0, prompt_tokens=160))
    policy.observe(BlocksStored("w0", hashes, 1.0))
    policy.decide(req("x"), view, 2.0)  # takes w1
    policy.observe(SessionEnded("x", 2.5))
    policy.decide(req("y"), cluster("w0"), 7.0)  # "a" idles out at 6 s; "y" takes w0
    return policy, view, req("a", turn=1, prompt_tokens=176, block_hashes=hashes)


def test_eq7_holds_for_cached_instance_when_prefix_saves_more_than_the_wait() -> None:
    # Δ_r + q_hit - q_cold = 1.0 (recheck) + 0 - 0 < H_r / F = 160 tokens / 100 tokens/s = 1.6
    policy, view, again = _reacquiring_setup(prefill_tokens_per_s=100)
    assert isinstance(policy.decide(again, view, 8.0), Hold)
    assert policy.counters["eq7_hold_for_cache"] == 1
    # one more second held: Δ_r = 1.0 held + 1.0 recheck = 2.0 >= 1.6 -> cold route to w1
    assert policy.decide(again, view, 9.0) == Admit("w1", reason="rebound")


def test_eq7_cold_routes_when_prefill_is_cheaper_than_waiting() -> None:
    # 1.0 + 0 - 0 >= 160 / 1000 = 0.16: cold route at once
    policy, view, again = _reacquiring_setup(prefill_tokens_per_s=1000)
    assert policy.decide(again, view, 8.0) == Admit("w1", reason="rebound")
    assert policy.counters["eq7_cold_route"] == 1


# --------------------------------------------------------------------------- Eq. 8


def _window(h: float | None, queue: bool = False) -> MetricWindow:
    return MetricWindow(0.0, 5.0, h, queue, 500.0)


def test_overload_pressure_contracts_cap_after_confirmation_and_recovers_by_one() -> None:
    ctl = OverloadControl(SessionAdmissionConfig())  # gap 0.1, confirm 3, factor 0.75, step 1
    for _ in range(3):
        ctl.on_window(_window(0.9), cap=40, base_cap=40)  # h* = 0.9
    ctl.on_window(_window(0.7), cap=40, base_cap=40)  # G = 0.2
    ctl.on_window(_window(0.6), cap=40, base_cap=40)  # G = 0.3
    assert ctl.cap_limit is None  # two pressure windows: not yet confirmed
    ctl.on_window(_window(0.5), cap=40, base_cap=40)  # G = 0.4, slope < 0: confirmed
    assert (ctl.h_star, ctl.gap) == (pytest.approx(0.9), pytest.approx(0.4))
    assert ctl.cap_limit == 30  # floor(0.75 * 40)
    limits = []
    for _ in range(5):
        ctl.on_window(_window(0.9), cap=ctl.cap_limit or 40, base_cap=40)
        limits.append(ctl.cap_limit)
    assert limits == [30, 30, 31, 32, 33]  # 3 healthy windows to confirm, then +1 per window


def test_overload_pressure_not_confirmed_while_hit_rate_recovers() -> None:
    ctl = OverloadControl(SessionAdmissionConfig())
    for _ in range(3):
        ctl.on_window(_window(0.9), cap=40, base_cap=40)
    for h in (0.5, 0.6, 0.7):  # G > 0.1 each time but h_hat rising
        ctl.on_window(_window(h), cap=40, base_cap=40)
    assert ctl.cap_limit is None


def test_persistent_waiting_queue_contracts_cap() -> None:
    ctl = OverloadControl(SessionAdmissionConfig())
    for _ in range(3):
        ctl.on_window(_window(None, queue=True), cap=8, base_cap=8)
    assert ctl.cap_limit == 6  # floor(0.75 * 8)


def test_recovery_returns_to_base_cap() -> None:
    ctl = OverloadControl(SessionAdmissionConfig())
    for _ in range(3):
        ctl.on_window(_window(None, queue=True), cap=4, base_cap=4)
    assert ctl.cap_limit == 3
    for _ in range(3):
        ctl.on_window(_window(0.8), cap=3, base_cap=4)
    assert ctl.cap_limit is None  # 3 + 1 reached K_base


def test_metric_samples_give_differenced_hit_rate_and_contract_policy_cap() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 10, "window_s": 5})
    queries = hits = 0.0
    for t in range(0, 55, 5):  # windows end at 5..50; pressure from the window ending at 30
        rate = 0.9 if t < 30 else 0.3
        queries, hits = queries + 1000, hits + 1000 * rate
        m = InstanceMetrics(num_blocks=100, block_size=16, prefix_cache_queries_total=queries, prefix_cache_hits_total=hits)
        policy.observe(MetricsSampled("w0", m, float(t)))
    ctl = policy.control["w0"]
    assert ctl.h_hat == pytest.approx(0.3) and ctl.h_star == pytest.approx(0.9)
    assert ctl.contractions == 1 and ctl.cap_limit == 6  # floor(0.75 * 9)
    policy.decide(req("a"), cluster("w0"), 55.0)
    assert policy.state()["instances"]["w0"]["cap"] == 6


# --------------------------------------------------------------------------- Eqs. 9-13


def _held_demand(policy, agents: int, rlvrs: int) -> None:
    """Hold ``agents`` agent and ``rlvrs`` rlvr sessions (no healthy instance)."""
    down = cluster("w0", unhealthy=("w0",))
    for i in range(agents):
        policy.decide(req(f"a{i}", "agent"), down, 0.0)
    for i in range(rlvrs):
        policy.decide(req(f"r{i}", "rlvr"), down, 0.0)


def test_misa_class_caps_match_eqs_9_and_10() -> None:
    policy = make_policy("misa", {"class_k_prior_blocks": {"agent": 30, "rlvr": 10}})
    _held_demand(policy, agents=2, rlvrs=4)
    caps = policy.instance_caps(InstanceView("w0", metrics=METRICS, metrics_age_s=0.0))
    # S_agent = 2 * 30 = 60, S_rlvr = 4 * 10 = 40; k_mix = 100 / (2 + 4); K_base = floor(90 / 16.67) = 5
    assert caps.base_cap == 5
    # M_agent = 90 * 60/100 = 54 -> K = floor(54/30) = 1; M_rlvr = 36 -> K = floor(36/10) = 3
    assert caps.class_quota_blocks == pytest.approx({"agent": 54.0, "rlvr": 36.0})
    assert caps.class_caps == {"agent": 1, "rlvr": 3}
    assert caps.floor_classes == ()


def test_misa_admits_only_with_both_global_and_class_headroom() -> None:
    policy = make_policy("misa", {"class_k_prior_blocks": {"agent": 30, "rlvr": 10}})
    _held_demand(policy, agents=2, rlvrs=4)
    up = cluster("w0")
    assert admitted(policy.decide(req("a0", "agent"), up, 1.0)) == "w0"
    assert isinstance(policy.decide(req("a1", "agent"), up, 1.0), Hold)  # K_agent = 1 used
    assert [isinstance(policy.decide(req(f"r{i}", "rlvr"), up, 1.0), Admit) for i in range(4)] == [
        True, True, True, False,
    ]  # fmt: skip


def _misa_t_with_residencies():
    """misa_t with k_agent = 30, k_rlvr = 10 blocks and completed residencies T_agent = 100 s, T_rlvr = 10 s."""
    policy = make_policy(
        "misa_t", {"class_k_prior_blocks": {"agent": 30, "rlvr": 10}, "t_min_samples": 2, "t_prior_s": 60}
    )
    up = cluster("w0")
    for i, (cls, residency_s) in enumerate([("agent", 100), ("agent", 100), ("rlvr", 10), ("rlvr", 10)]):
        run_session(policy, up, f"done{i}", cls, 0.0, float(residency_s))
    return policy, up


def test_misa_t_class_caps_match_eqs_11_to_13() -> None:
    policy, _ = _misa_t_with_residencies()
    assert (policy.class_residency_s("agent"), policy.class_residency_s("rlvr")) == (100.0, 10.0)
    _held_demand(policy, agents=2, rlvrs=4)
    caps = policy.instance_caps(InstanceView("w0", metrics=METRICS, metrics_age_s=0.0))
    # R_agent = 2*30*100 = 6000, R_rlvr = 4*10*10 = 400; k_mix = 6400 / (200 + 40); K_base = floor(3.375) = 3
    assert caps.base_cap == 3
    # M_agent = 90 * 6000/6400 = 84.375 -> K = 2; M_rlvr = 5.625 -> floor(0.5625) = 0 -> max(1, 0) = 1 (floor)
    assert caps.class_quota_blocks == pytest.approx({"agent": 84.375, "rlvr": 5.625})
    assert caps.class_caps == {"agent": 2, "rlvr": 1}
    assert caps.floor_classes == ("rlvr",)


def test_misa_t_uses_the_shared_neutral_prior_before_enough_samples() -> None:
    policy = make_policy("misa_t", {"t_min_samples": 8, "t_prior_s": 60})
    run_session(policy, cluster("w0"), "done", "agent", 0.0, 500.0)
    assert policy.class_residency_s("agent") == policy.class_residency_s("rlvr") == 60.0


def test_floor_admits_one_session_of_a_class_whose_quota_is_below_its_footprint() -> None:
    policy, up = _misa_t_with_residencies()
    _held_demand(policy, agents=2, rlvrs=4)
    assert policy.decide(req("r0", "rlvr"), up, 200.0) == Admit("w0", reason="floor new")
    assert isinstance(policy.decide(req("r1", "rlvr"), up, 200.0), Hold)  # K_rlvr = 1: one floor session
    state = policy.state()
    assert (state["floor_admissions"], state["floor_sessions"]) == (1, 1)
    assert state["caps"]["w0"]["rlvr"] == 1


def test_global_floor_admits_one_session_larger_than_protected_capacity() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 500})  # floor(90 / 500) = 0 -> K = 1
    view = cluster("w0")
    assert policy.decide(req("a"), view, 0.0) == Admit("w0", reason="floor new")
    assert isinstance(policy.decide(req("b"), view, 0.0), Hold)


def test_state_reports_long_holds_and_oldest_hold_age() -> None:
    policy = make_policy("session_admission", {"k_prior_blocks": 90}, long_hold_s=30)
    view = cluster("w0")
    policy.decide(req("a"), view, 0.0)
    policy.decide(req("b"), view, 1.0)
    policy.decide(req("b"), view, 40.0)
    state = policy.state()
    assert (state["held_count"], state["long_holds"], state["oldest_hold_age_s"]) == (1, 1, 39.0)
    later = make_policy("session_admission", {"k_prior_blocks": 90}, long_hold_s=45)
    later.decide(req("a"), view, 0.0)
    later.decide(req("b"), view, 1.0)
    later.decide(req("b"), view, 40.0)
    assert later.state()["long_holds"] == 0  # 39 s < 45 s


def test_long_hold_s_is_the_transports_knob_not_a_policy_option() -> None:
    with pytest.raises(UnknownOptionError, match=r"give server.long_hold_s=\.\.\. instead"):
        make_policy("misa_t", {"long_hold_s": 5})
    assert "long_hold_s" not in policy_config_fields("misa_t")
    assert make_policy("misa_t", long_hold_s=7).config.long_hold_s == 7.0


# --------------------------------------------------------------------------- placement


def test_admitted_session_goes_to_longest_prefix_match_among_instances_with_headroom() -> None:
    policy = make_policy("misa_t")
    policy.observe(BlocksStored("w1", (5, 6, 7), 0.0))
    r = req("a", block_hashes=(5, 6, 7, 8))
    assert admitted(policy.decide(r, cluster("w0", "w1", "w2"), 1.0)) == "w1"


def _waiting(n: int) -> InstanceMetrics:
    return InstanceMetrics(num_blocks=100, block_size=16, num_requests_waiting=n)


def test_cost_placement_follows_eq_1() -> None:
    # c_w = d_w + (L_r - H_r,w) / mu_w with d_w = waiting * 512 (prompt prior) / 1000 tokens/s (F prior)
    r = req("a", prompt_tokens=1000, block_hashes=tuple(range(1, 51)))  # 50 blocks = 800 tokens cached on w0
    for waiting_w0, expected in ((4, "w1"), (1, "w0")):
        policy = make_policy("session_admission", {"placement": "cost"})
        policy.observe(BlocksStored("w0", tuple(range(1, 51)), 0.0))
        view = ClusterView(
            (
                InstanceView("w0", metrics=_waiting(waiting_w0), metrics_age_s=0.0),
                InstanceView("w1", metrics=_waiting(0), metrics_age_s=0.0),
            )
        )
        # waiting 4: c_w0 = 2.048 + 0.2 = 2.248 > c_w1 = 0 + 1.0; waiting 1: c_w0 = 0.512 + 0.2 < 1.0
        assert admitted(policy.decide(r, view, 1.0)) == expected


@pytest.mark.parametrize("name", ["session_admission", "misa", "misa_t"])
def test_an_unknown_option_message_does_not_offer_the_transports_long_hold_s(name: str) -> None:
    with pytest.raises(UnknownOptionError, match="valid options") as err:
        make_policy(name, {"no_such_option": 1})
    assert "long_hold_s" not in str(err.value)
    assert "idle_timeout_s" in str(err.value)


def test_a_held_session_is_not_forgotten_before_its_recheck() -> None:
    with pytest.raises(ValueError, match=r"held_forget_s must be >= recheck_max_s \(1.0\), got 0.5: raise "
                                         r"held_forget_s or lower recheck_max_s; held_forget_s must be >= "
                                         r"no_healthy_recheck_s \(1.0\), got 0.5"):
        SessionAdmissionConfig(held_forget_s=0.5)
    with pytest.raises(ValueError, match=r"got 300.0: raise held_forget_s or lower recheck_max_s"):
        SessionAdmissionConfig(recheck_max_s=400.0)  # the user raised the recheck, not lowered the forget
    assert SessionAdmissionConfig(held_forget_s=1.0).held_forget_s == 1.0
