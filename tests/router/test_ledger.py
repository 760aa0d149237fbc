"""The session ledger: transitions, idle expiry, histories, held queues."""

from __future__ import annotations

from router.ledger import ACTIVE, HOLD_CACHE, HOLD_CAP, PENDING, REBOUND, SessionLedger


def test_session_moves_pending_to_active_and_ends_into_class_histories() -> None:
    ledger = SessionLedger(history_len=4)
    rec = ledger.open("s", "agent", "g", 0.0)
    ledger.admit(rec, "w0", 1.0)
    assert (rec.state, ledger.protected_count("w0"), ledger.class_counts("w0")) == (PENDING, 1, {"agent": 1})
    ledger.request_started("s", 2.0, prompt_blocks=3)
    assert list(rec.turn_starts_s) == [2.0]
    ledger.mark_visible("w0", 2.5)
    assert rec.state == ACTIVE and ledger.visible_siblings("g") == 1
    done = ledger.request_finished("s", 5.0, blocks=7, session_end=True)
    assert (done.reason, done.observed_blocks, done.residency_s) == ("end", 7, 4.0)
    assert ledger.protected_count("w0") == 0 and ledger.visible_siblings("g") == 0
    # Eq. 2 time average, piecewise linear: 0 at admission (t=1), 3 at start (t=2), 7 at
    # the end (t=5): (0.5*(0+3)*1 + 0.5*(3+7)*3) / 4 = 16.5 / 4.
    assert done.time_averaged_blocks == 4.125
    assert ledger.blocks_history["agent"].quantile(1.0) == 4.125
    assert ledger.residency_history["agent"].mean() == 4.0


def test_time_averaged_footprint_counts_tool_gaps_and_the_tail_to_the_end() -> None:
    """Two turns with a tool gap between, then an idle tail until the session ends."""
    ledger = SessionLedger()
    rec = ledger.open("s", "agent", None, 0.0)
    ledger.admit(rec, "w0", 0.0)
    ledger.request_started("s", 0.0, prompt_blocks=2)
    ledger.request_finished("s", 2.0, blocks=4, session_end=False)  # 0.5*(2+4)*2 = 6
    ledger.request_started("s", 6.0, prompt_blocks=5)  # tool gap: 0.5*(4+5)*4 = 18
    ledger.request_finished("s", 8.0, blocks=8, session_end=False)  # 0.5*(5+8)*2 = 13
    assert rec.time_averaged_blocks(8.0) == 37 / 8
    assert rec.time_averaged_blocks(10.0) == (37 + 8 * 2) / 10  # resident until it ends
    done = ledger.end("s", 10.0, "idle_timeout")
    assert done.time_averaged_blocks == 5.3 and done.observed_blocks == 8
    assert ledger.blocks_history["agent"].quantile(1.0) == 5.3


def test_final_footprint_option_keeps_peak_blocks() -> None:
    ledger = SessionLedger(footprint="final")
    rec = ledger.open("s", "rlvr", None, 0.0)
    ledger.admit(rec, "w0", 0.0)
    ledger.request_started("s", 0.0, prompt_blocks=1)
    ledger.request_finished("s", 4.0, blocks=9, session_end=True)
    assert ledger.blocks_history["rlvr"].quantile(0.5) == 9 and ledger.blocks_history_all.quantile(0.5) == 9


def test_unknown_footprint_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="footprint must be 'time_averaged' or 'final'"):
        SessionLedger(footprint="peak")


def test_idle_expiry_closes_oldest_idle_sessions_only() -> None:
    ledger = SessionLedger()
    for i, t in enumerate([0.0, 5.0]):
        ledger.admit(ledger.open(f"s{i}", "rlvr", None, t), "w0", t)
    busy = ledger.open("busy", "rlvr", None, 0.0)
    ledger.admit(busy, "w0", 0.0)
    ledger.request_started("busy", 0.0, 1)
    expired = ledger.expire_idle(now=12.0, idle_timeout_s=10.0)
    assert [f.session_id for f in expired] == ["s0"]
    assert ledger.finished("s0").reason == "idle_timeout"
    assert ledger.session("busy") is not None and ledger.session("s1") is not None


def test_held_sessions_keep_arrival_order_and_cache_holds_do_not_block() -> None:
    ledger = SessionLedger()
    first, second, third = (ledger.open(s, "agent", None, 0.0) for s in ("a", "b", "c"))
    ledger.hold(first, HOLD_CACHE, 0.0)
    ledger.hold(second, HOLD_CAP, 1.0)
    ledger.hold(third, HOLD_CAP, 2.0)
    assert ledger.earlier_cap_hold(first) is second  # "a" waits for its cache, not for a cap
    assert ledger.earlier_cap_hold(second) is None
    assert ledger.earlier_cap_hold(third) is second
    assert ledger.held_counts() == {"agent": 3}


def test_abandoned_hold_at_queue_head_is_forgotten() -> None:
    ledger = SessionLedger()
    gone, alive = ledger.open("gone", "rlvr", None, 0.0), ledger.open("alive", "rlvr", None, 0.0)
    ledger.hold(gone, HOLD_CAP, 0.0)
    ledger.hold(alive, HOLD_CAP, 0.0)
    ledger.hold(alive, HOLD_CAP, 250.0)  # re-decided
    assert ledger.forget_abandoned_holds(now=301.0, bound_s=300.0) == 1
    assert ledger.session("gone") is None and ledger.earlier_cap_hold(alive) is None


def test_unbinding_an_instance_rebinds_its_sessions() -> None:
    ledger = SessionLedger()
    rec = ledger.open("s", "agent", None, 0.0)
    ledger.admit(rec, "w0", 0.0)
    assert ledger.unbind_instance("w0") == 1
    assert (rec.state, rec.cached_instance, ledger.protected_count("w0")) == (REBOUND, "w0", 0)


def test_ten_thousand_sessions_fit_and_expire_in_one_pass() -> None:
    ledger = SessionLedger()
    for i in range(10_000):
        ledger.admit(ledger.open(f"s{i}", ("agent", "rlvr", "rlhf")[i % 3], f"g{i // 8}", 0.0), f"w{i % 4}", 0.0)
    assert len(ledger) == 10_000 and ledger.protected_count("w0") == 2_500
    assert len(ledger.expire_idle(now=1_000.0, idle_timeout_s=120.0)) == 10_000
    assert len(ledger) == 0


def test_rebound_session_nobody_continues_idles_out() -> None:
    ledger = SessionLedger()
    rec = ledger.open("s", "agent", None, 0.0)
    ledger.admit(rec, "w0", 0.0)
    ledger.request_started("s", 1.0, 2)
    ledger.unbind_instance("w0")
    ledger.request_finished("s", 2.0, blocks=2, session_end=False)
    assert [f.reason for f in ledger.expire_idle(now=200.0, idle_timeout_s=120.0)] == ["idle_timeout"]
    assert len(ledger) == 0


def test_ended_rebound_session_leaves_the_idle_order() -> None:
    ledger = SessionLedger()
    rec = ledger.open("s", "agent", None, 0.0)
    ledger.admit(rec, "w0", 0.0)
    ledger.unbind_instance("w0")
    ledger.end("s", 1.0, "end")
    assert ledger.expire_idle(now=500.0, idle_timeout_s=120.0) == []


def test_held_session_whose_request_was_dropped_is_closed_at_once_unless_another_runs() -> None:
    ledger = SessionLedger()
    alone = ledger.open("alone", "agent", None, 0.0)
    ledger.hold(alone, HOLD_CAP, 0.0)
    behind = ledger.open("behind", "agent", None, 1.0)
    ledger.hold(behind, HOLD_CAP, 1.0)
    assert ledger.earlier_cap_hold(behind) is alone
    done = ledger.abandon_hold("alone", 2.0)
    assert done.reason == "abandoned_hold" and ledger.session("alone") is None
    assert ledger.earlier_cap_hold(behind) is None and ledger.held_counts() == {"agent": 1}
    # A session with another request in flight only leaves the held queue.
    busy = ledger.open("busy", "agent", None, 0.0)
    ledger.admit(busy, "w0", 0.0)
    ledger.request_started("busy", 0.5, prompt_blocks=2)
    ledger.unbind(busy)
    ledger.hold(busy, HOLD_CAP, 3.0)
    assert ledger.abandon_hold("busy", 4.0) is None
    assert busy.state == REBOUND and ledger.held_counts() == {"agent": 1} and ledger.session("busy") is busy
    assert ledger.abandon_hold("busy", 4.0) is None and ledger.abandoned_holds == 1  # not held: unchanged
