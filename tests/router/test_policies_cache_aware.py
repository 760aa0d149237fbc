"""cache_aware (vLLM Router's policy): imbalance and match-threshold branches, tree eviction."""

from __future__ import annotations

from router.policies import make_policy
from router.policies.approx_tree import ApproxPrefixTree
from router.policies.base import Admit, AllBlocksCleared, BlocksStored, ClusterView, InstanceView, Request

TEXT = "system: you are a careful agent. user: fix the failing test in utils.py"


def loads(**in_flight: int) -> ClusterView:
    return ClusterView(tuple(InstanceView(w, in_flight=n) for w, n in in_flight.items()))


def req(text: str = TEXT, hashes: tuple[int, ...] = ()) -> Request:
    return Request(request_id=text[:8], session_id=text[:8], prompt_text=text, block_hashes=hashes)


def test_imbalanced_load_goes_to_least_loaded_despite_cache_match() -> None:
    policy = make_policy("cache_aware")
    assert policy.decide(req(), loads(w0=0, w1=0), 0.0).instance == "w0"  # tree learns TEXT -> w0
    # 40 - 5 = 35 > 32 and 40 > 5 * 1.1: imbalanced
    assert policy.decide(req(), loads(w0=40, w1=5), 1.0) == Admit("w1", reason="load_balance")


def test_gap_within_absolute_threshold_is_not_imbalance() -> None:
    policy = make_policy("cache_aware")
    policy.decide(req(), loads(w0=0, w1=0), 0.0)
    # 32 - 0 = 32 is not > 32: balanced, and the full match (rate 1.0 > 0.5) wins
    assert policy.decide(req(), loads(w0=32, w1=0), 1.0) == Admit("w0", reason="cache_affinity")


def test_match_rate_above_threshold_follows_cache_below_goes_least_loaded() -> None:
    policy = make_policy("cache_aware")
    policy.decide(req(), loads(w0=0, w1=0), 0.0)
    half = TEXT[:30] + "x" * 40  # 30 of 70 chars match: rate 0.43 <= 0.5
    assert policy.decide(req(half), loads(w0=3, w1=1), 1.0) == Admit("w1", reason="low_match_min_load")
    most = TEXT[:60] + "y" * 10  # 60 of 70: rate 0.86 > 0.5
    assert policy.decide(req(most), loads(w0=3, w1=1), 2.0) == Admit("w0", reason="cache_affinity")


def test_prefix_index_matching_uses_kv_events() -> None:
    policy = make_policy("cache_aware", {"match_from": "prefix_index"})
    policy.observe(BlocksStored("w1", (11, 12, 13), 0.0))
    assert policy.decide(req(hashes=(11, 12, 13, 14)), loads(w0=0, w1=2), 1.0).instance == "w1"  # 3/4 > 0.5
    policy.observe(AllBlocksCleared("w1", 2.0))
    assert policy.decide(req(hashes=(11, 12, 13, 14)), loads(w0=0, w1=2), 3.0).instance == "w0"


def test_an_unhealthy_idle_instance_does_not_make_a_balanced_pool_look_imbalanced() -> None:
    """vllm-project/router#254: load imbalance is over the healthy instances only."""
    policy = make_policy("cache_aware")
    policy.decide(req(), loads(w0=0, w1=0, w2=0), 0.0)  # tree learns TEXT -> w0
    # Healthy w0=40, w1=38: 40 - 38 = 2 <= 32, balanced, so the full match wins. Counting
    # the dead w2 at 0 would give 40 - 0 = 40 > 32 and 40 > 0: "imbalanced" -> w1.
    view = ClusterView((InstanceView("w0", in_flight=40), InstanceView("w1", in_flight=38),
                        InstanceView("w2", healthy=False, in_flight=0)))
    assert policy.decide(req(), view, 1.0) == Admit("w0", reason="cache_affinity")


def test_tree_is_evicted_to_max_size_on_the_eviction_timer() -> None:
    policy = make_policy("cache_aware", {"max_tree_size": 10, "eviction_interval_s": 60})
    policy.decide(req(), loads(w0=0, w1=0), 0.0)
    policy.decide(req(), loads(w0=0, w1=0), 59.0)  # before the timer: still tagged in full
    assert policy.tree.size_chars("w0") == len(TEXT)
    policy.decide(req("z"), loads(w0=0, w1=1), 61.0)
    assert policy.tree.size_chars("w0") <= 10


def test_unhealthy_instance_is_never_chosen() -> None:
    policy = make_policy("cache_aware")
    policy.decide(req(), loads(w0=0, w1=0), 0.0)
    view = ClusterView((InstanceView("w0", healthy=False), InstanceView("w1", in_flight=9)))
    assert policy.decide(req(), view, 1.0).instance == "w1"


def test_approx_tree_matches_per_tenant_and_evicts_lru_leaves_first() -> None:
    tree = ApproxPrefixTree()
    tree.insert("hello world", "a", 0.0)
    tree.insert("hello there", "b", 1.0)
    tree.insert("help", "a", 2.0)
    assert tree.match("hello world!") == {"a": 11, "b": 6}
    assert (tree.size_chars("a"), tree.size_chars("b")) == (12, 11)  # hel + lo_ + world + p
    tree.evict(max_size_chars=7)
    assert tree.match("help") == {"a": 4, "b": 3}  # "p" (t=2) kept, "world" (t=0) evicted
    assert tree.match("hello world") == {"a": 6, "b": 6}  # 12 - 5 = 7 chars fit: "lo " stays
