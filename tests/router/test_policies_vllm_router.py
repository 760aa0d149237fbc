"""vllm_router (vllm-router 0.1.17's cache_aware, point by point) on hand-made cases.

Both selection paths: ``per_worker`` (the HTTP router's, the default: each worker's own
match, the least loaded among the best) and ``tree_owner`` (the legacy path: the imbalance
rule over every worker, the match-threshold fallback, the tie rule of tree.rs, session
keys); the tree bound (LRU over characters on the eviction timer) and blindness to
engine-side evictions.
"""

from __future__ import annotations

import pytest

from router.policies import POLICY_NAMES, make_policy
from router.policies.approx_tree import ApproxPrefixTree
from router.policies.base import AllBlocksCleared, BlocksRemoved, ClusterView, InstanceView, Request

SYS = "system: you are a careful agent with tools. "  # 44 chars, shared by every session


def loads(**in_flight: int) -> ClusterView:
    return ClusterView(tuple(InstanceView(w, in_flight=n) for w, n in in_flight.items()))


def req(text: str, session: str = "") -> Request:
    return Request(request_id=f"{session}:{len(text)}", session_id=session, prompt_text=text)


def text_only(**params):
    """The legacy path's text branch alone (no session key), to test the tree's branches."""
    return make_policy("vllm_router", {"match_rule": "tree_owner", "session_affinity": False, **params})


def legacy(**params):
    """The legacy path with its session key (``tree_owner``, ``session_affinity``)."""
    return make_policy("vllm_router", {"match_rule": "tree_owner", "session_affinity": True, **params})


def test_vllm_router_is_a_builtin_policy_with_the_command_line_defaults() -> None:
    policy = make_policy("vllm-router")
    assert "vllm_router" in POLICY_NAMES
    cfg = policy.config
    assert (cfg.cache_threshold, cfg.balance_abs_threshold, cfg.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (cfg.eviction_interval_s, cfg.max_tree_size) == (120.0, 33_554_432)
    assert (cfg.match_rule, cfg.session_affinity, cfg.missing_tokens_share) == ("per_worker", False, 0.0)


def test_imbalance_needs_both_the_absolute_and_the_relative_gap() -> None:
    policy = text_only()
    assert policy.decide(req(SYS + "task A"), loads(w0=0, w1=0), 0.0).instance == "w0"
    # 100 - 30 = 70 > 64 and 100 > 30 * 1.5 = 45: imbalanced -> least loaded despite the match
    assert policy.decide(req(SYS + "task A"), loads(w0=100, w1=30), 1.0).reason == "load_balance"
    # 100 - 70 = 30 <= 64: balanced, the full match (rate 1 > 0.3) keeps w0 although it is busier
    assert policy.decide(req(SYS + "task A"), loads(w0=100, w1=70), 2.0).instance == "w0"
    # 165 - 100 = 65 > 64 and 165 > 150: imbalanced
    assert policy.decide(req(SYS + "task A"), loads(w0=165, w1=100), 3.0).instance == "w1"
    # 195 - 130 = 65 > 64 but 195 is not > 130 * 1.5 = 195: balanced (the relative rule holds it)
    assert policy.decide(req(SYS + "task A"), loads(w0=195, w1=130), 4.0).instance == "w0"


def test_load_counts_unhealthy_workers_too() -> None:
    policy = text_only()
    policy.decide(req(SYS + "x"), loads(w0=0, w1=0), 0.0)
    view = ClusterView((InstanceView("w0", in_flight=5), InstanceView("w1", in_flight=3),
                        InstanceView("w2", healthy=False, in_flight=80)))
    # 80 - 3 = 77 > 64 and 80 > 4.5: imbalanced because of the unhealthy w2; least-loaded healthy = w1
    assert policy.decide(req(SYS + "x"), view, 1.0).instance == "w1"


def test_match_rate_at_or_below_threshold_goes_least_loaded_not_smallest_tree() -> None:
    policy = text_only()
    policy.decide(req(SYS + "a" * 56), loads(w0=0, w1=0), 0.0)  # w0 learns 100 chars
    # 30 of 100 chars match: rate 0.30 is not > 0.3 -> least loaded (w0 has the bigger tree,
    # w1 is busier: the smallest-tree rule would pick w1, the code picks w0)
    low = (SYS + "a" * 56)[:30] + "z" * 70
    assert policy.decide(req(low), loads(w0=1, w1=2), 1.0).reason == "low_match_min_load"
    assert policy.decide(req(low), loads(w0=1, w1=2), 1.0).instance == "w0"
    # 31 of 100 chars: 0.31 > 0.3 -> the tree's tenant even when it is busier
    hi = (SYS + "a" * 56)[:31] + "y" * 69
    assert policy.decide(req(hi), loads(w0=9, w1=0), 2.0).instance == "w0"


def test_tie_goes_to_the_tenant_that_created_the_deepest_matched_node() -> None:
    tree = ApproxPrefixTree(lru="vllm_router")
    tree.insert(SYS + "task A", "w1")  # w1 creates the node SYS+"task A"
    tree.insert(SYS + "task A", "w0")  # w0 passes through it: tagged, not creator
    assert tree.match(SYS + "task A") == {"w1": 50, "w0": 50}  # a tie
    assert tree.prefix_match(SYS + "task A") == ("w1", 50)
    # the split "SYS + task " keeps the creator of the node it was cut from
    tree.insert(SYS + "task B", "w0")
    assert tree.prefix_match(SYS + "task C") == ("w1", 49)
    # the creator evicted from the node: the first remaining tenant takes over
    tree.remove_tenant("w1")
    assert tree.prefix_match(SYS + "task A") == ("w0", 50)
    assert tree.prefix_match("nothing like it") == (None, 0)


def test_every_new_session_follows_the_worker_that_first_cached_the_system_prompt() -> None:
    # The shared system prompt is 2/3 of a first-turn prompt: match rate 0.67 > 0.3 sends
    # each new session to w0 (the creator) until the load gap trips the imbalance rule.
    policy = legacy(balance_abs_threshold=4)
    sys_prompt = "S" * 200
    chosen = []
    in_flight = {"w0": 0, "w1": 0}
    for k in range(8):
        d = policy.decide(req(sys_prompt + f"task {k:02d}" + "t" * 92, f"s{k}"), loads(**in_flight), float(k))
        in_flight[d.instance] += 1
        chosen.append(d.instance)
    # w0 takes 5; then 5 - 0 > 4 and 5 > 0 * 1.5: imbalanced, the 6th goes to w1
    assert chosen[:6] == ["w0"] * 5 + ["w1"]
    assert policy.decisions["full_history_match"] >= 5


def test_known_session_returns_to_its_worker_and_a_dead_worker_is_forgotten() -> None:
    policy = legacy()
    assert policy.decide(req(SYS + "turn 1", "s1"), loads(w0=0, w1=0), 0.0).instance == "w0"
    # the next turn's text is unrelated (rate 0) but the session key wins
    assert policy.decide(req("zzz" * 30, "s1"), loads(w0=3, w1=0), 1.0).reason == "session_id_match"
    dead = ClusterView((InstanceView("w0", healthy=False), InstanceView("w1")))
    d = policy.decide(req(SYS + "turn 1", "s1"), dead, 2.0)
    # session entry dropped; the history probe matches w0 (stale): it leaves the tree, w1 taken
    assert (d.instance, d.reason) == ("w1", "stale_tenant_fallback")
    assert policy.tree.size_chars("w0") == 0


def test_tree_bound_is_enforced_only_on_the_eviction_timer_lru_leaf_first() -> None:
    policy = text_only(max_tree_size=60, eviction_interval_s=10.0)
    policy.decide(req(SYS + "old task one"), loads(w0=0, w1=0), 0.0)  # timer starts: fires at 10 s
    policy.decide(req(SYS + "new task two"), loads(w0=0, w1=0), 5.0)
    assert policy.tree.size_chars("w0") == 44 + 12 + 12  # SYS, then two 12-char leaves
    policy.decide(req(SYS + "new task two"), loads(w0=0, w1=0), 9.9)  # before the timer: no eviction
    assert policy.tree.size_chars("w0") > 60
    policy.decide(req("unrelated"), loads(w0=0, w1=0), 10.0)  # the timer fires first, then inserts
    # the least-recently stamped leaf ("old task one", tick 0) went; "new task two" stayed
    assert policy.tree.match(SYS + "new task two") == {"w0": 56}
    assert policy.tree.match(SYS + "old task one").get("w0", 0) == 44


def test_engine_evictions_and_cache_resets_do_not_reach_the_tree() -> None:
    policy = text_only()
    policy.decide(req(SYS + "task"), loads(w0=0, w1=0), 0.0)
    policy.observe(BlocksRemoved("w0", (1, 2, 3), 1.0))
    policy.observe(AllBlocksCleared("w0", 2.0))  # e.g. a weight sync reset w0's prefix cache
    # the router still believes w0 holds the text: the full match sends it there
    assert policy.decide(req(SYS + "task"), loads(w0=5, w1=0), 3.0).reason == "cache_affinity"
    assert policy.decide(req(SYS + "task"), loads(w0=5, w1=0), 3.0).instance == "w0"


# ---------------------------------------------------------------- per_worker (0.1.17's HTTP path)


def per_worker(**params):
    return make_policy("vllm_router", params)


def test_each_worker_is_matched_on_its_own_and_the_least_loaded_best_one_wins() -> None:
    policy = per_worker()
    policy.decide(req(SYS + "task A"), loads(w0=0, w1=0), 0.0)  # w0 learns SYS + task A
    policy.decide(req("unrelated text, long enough to miss: " + "q" * 40), loads(w0=1, w1=0), 1.0)  # w1
    policy.decide(req(SYS + "task B"), loads(w0=0, w1=5), 2.0)  # w0 (best rate: 44 / 50 on w0, 0 on w1)
    assert policy.tree.match(SYS + "task A") == {"w0": 50}
    # w1 learns SYS + task C through an imbalance: now both hold SYS
    d = policy.decide(req(SYS + "task C"), loads(w0=100, w1=0), 3.0)
    assert (d.instance, d.reason) == ("w1", "load_imbalance")
    # a new task: both match SYS + "task " (49 of 50): equal best rates -> the least loaded,
    # even though w0 created the shared nodes (the legacy tree_owner rule would pick w0)
    d = policy.decide(req(SYS + "task D"), loads(w0=3, w1=2), 4.0)
    assert (d.instance, d.reason) == ("w1", "prefix_hit")
    # the full history matches only on w0 (50 vs 49): w0 although it is busier
    assert policy.decide(req(SYS + "task A"), loads(w0=9, w1=0), 5.0).instance == "w0"
    # no match above the threshold: the least loaded of all (first in order on ties)
    d = policy.decide(req("z" * 80), loads(w0=4, w1=4), 6.0)
    assert (d.instance, d.reason) == ("w0", "prefix_miss")
    assert policy.decisions == {"prefix_miss": 3, "prefix_hit": 3, "load_imbalance": 1}


def test_per_worker_reads_no_session_key_and_counts_only_healthy_loads() -> None:
    policy = per_worker()
    assert policy.decide(req(SYS + "turn 1", "s1"), loads(w0=0, w1=0), 0.0).instance == "w0"
    # the next turn's text is unrelated: no session key on this path, the least loaded
    assert policy.decide(req("zzz" * 30, "s1"), loads(w0=3, w1=0), 1.0).instance == "w1"
    # an unhealthy worker's 80 in flight do not make the healthy ones imbalanced
    view = ClusterView((InstanceView("w0", in_flight=5), InstanceView("w1", in_flight=3),
                        InstanceView("w2", healthy=False, in_flight=80)))
    d = policy.decide(req(SYS + "turn 1"), view, 2.0)
    assert (d.instance, d.reason) == ("w0", "prefix_hit")


def test_missing_tokens_go_least_loaded_at_the_configured_share() -> None:
    always = per_worker(missing_tokens_share=1.0)
    always.decide(req(SYS + "task A"), loads(w0=0, w1=0), 0.0)
    d = always.decide(req(SYS + "task A"), loads(w0=1, w1=0), 1.0)
    assert (d.instance, d.reason) == ("w1", "missing_tokens")
    half = per_worker(missing_tokens_share=0.5, seed=3)
    for k in range(400):
        half.decide(req(SYS + f"task {k}"), loads(w0=0, w1=0), float(k))
    assert 150 < half.decisions["missing_tokens"] < 250
    with pytest.raises(ValueError, match="missing_tokens_share"):
        per_worker(missing_tokens_share=1.5)


def test_missing_tokens_at_measured_times_take_the_next_request_each() -> None:
    """A measured run's missing_tokens times: the first request decided at or after each
    time goes least loaded, one request per entry; every other request is matched."""
    policy = per_worker(missing_tokens_at_s=[5.0, 2.0, 2.0])  # unsorted on purpose
    policy.decide(req(SYS + "task A"), loads(w0=0, w1=0), 0.0)  # w0 learns SYS
    d = policy.decide(req(SYS + "task B"), loads(w0=1, w1=0), 1.0)
    assert (d.instance, d.reason) == ("w0", "prefix_hit")  # before 2 s: matched
    reasons = [policy.decide(req(SYS + f"task {k}"), loads(w0=3, w1=0), t).reason
               for k, t in enumerate((2.5, 2.6, 3.0, 6.0, 7.0))]
    assert reasons == ["missing_tokens", "missing_tokens", "prefix_hit", "missing_tokens", "prefix_hit"]
    assert policy.decisions["missing_tokens"] == 3
    # a placement without tokens teaches the tree nothing (select_prepared returns before it inserts)
    blind = per_worker(missing_tokens_at_s=[0.0])
    assert blind.decide(req(SYS + "task A"), loads(w0=1, w1=0), 0.0).reason == "missing_tokens"
    assert sum(blind.state()["tree_chars"].values()) == 0
    d = blind.decide(req(SYS + "task A"), loads(w0=0, w1=2), 1.0)
    assert (d.instance, d.reason) == ("w0", "prefix_miss")  # w1 was sent it but never learnt it
    with pytest.raises(ValueError, match="not both"):
        per_worker(missing_tokens_at_s=[1.0], missing_tokens_share=0.1)
    with pytest.raises(ValueError, match="finite times >= 0"):
        per_worker(missing_tokens_at_s=[-1.0])
    with pytest.raises(ValueError, match="match_rule"):
        per_worker(match_rule="nope")
