"""The composition check: decode tokens per completed sample, completed vs released lengths,
length-adjusted throughput; and the synthetic prompt text a text-matching router sees."""

from __future__ import annotations

import pytest

from router.sim.metrics import composition, unit_output_tokens
from router.sim.prompt_text import PromptTexts
from router.sim.trainer import UnitRecord
from router.sim.trace import TraceRecord, TraceSession
from router.sim.errors import SimError
from router.sim.experiments import scale_counts


def test_composition_figures_on_a_hand_computed_trace() -> None:
    # Four rlvr units released with 100, 200, 300, 1000 output tokens; in the window
    # [0, 120] s (2 min) only the two short ones complete (the 300 one completes after the
    # window, the 1000 one never).
    #   completed: [100, 200] -> 150 decode tokens/sample, 300 tokens / 2 min = 150 tok/min
    #   released mean: (100 + 200 + 300 + 1000) / 4 = 400 tokens/sample
    #   length-adjusted samples/min: 150 / 400 = 0.375 (raw samples/min would be 2 / 2 = 1.0)
    #   completed p50 = 150; released p50 = 250 (numpy's linear percentile)
    units = [UnitRecord("a", "rlvr", 0.0, 30.0), UnitRecord("b", "rlvr", 0.0, 90.0),
             UnitRecord("c", "rlvr", 0.0, 150.0), UnitRecord("d", "rlvr", 0.0, None)]
    out = {"a": 100, "b": 200, "c": 300, "d": 1000}
    comp = composition(units, out, 0.0, 120.0)
    r = comp["rlvr"]
    assert r["samples"] == 2
    assert r["decode_tokens_per_sample"] == 150
    assert r["released_decode_tokens_per_sample"] == 400
    assert r["output_tokens_per_min"] == pytest.approx(150)
    assert r["length_adjusted_samples_per_min"] == pytest.approx(0.375)
    assert (r["completed_p50"], r["released_p50"]) == (150, 250)
    assert comp["total"]["length_adjusted_samples_per_min"] == pytest.approx(0.375)


def test_length_adjusted_total_sums_classes_in_their_own_released_means() -> None:
    # agent: released [10, 30] (mean 20), completes 30 -> 30 tok/min / 20 = 1.5
    # rlvr: released [1000] (mean 1000), completes 1000 -> 1.0; total 2.5 in 1 minute
    units = [UnitRecord("x", "agent", 0, 10), UnitRecord("y", "agent", 0, None), UnitRecord("z", "rlvr", 0, 20)]
    comp = composition(units, {"x": 30, "y": 10, "z": 1000}, 0.0, 60.0)
    assert comp["agent"]["length_adjusted_samples_per_min"] == pytest.approx(1.5)
    assert comp["total"]["length_adjusted_samples_per_min"] == pytest.approx(2.5)
    assert comp["total"]["decode_tokens_per_sample"] == pytest.approx(515)  # (30 + 1000) / 2


def test_unit_output_is_clipped_at_the_context_limit() -> None:
    s = TraceSession("s", "rlvr", "s", None, [TraceRecord("s", "rlvr", 0, 100, 5000)])
    assert unit_output_tokens(s, 1000) == 900


def _agent(sid: str, gid: str, prompts: list[int]) -> TraceSession:
    recs = [TraceRecord(sid, "agent", k, p, 10, group_id=gid, session_end=(k == len(prompts) - 1),
                        group_prefix_tokens=prompts[0], class_prefix_tokens=20) for k, p in enumerate(prompts)]
    return TraceSession(sid, "agent", sid, gid, recs)


def test_prompt_text_keeps_the_system_group_and_history_structure() -> None:
    texts = PromptTexts(chars_per_token=4, seed=0)
    a0, b0 = _agent("a0", "g0", [30, 50, 80]), _agent("b0", "g0", [30, 60])
    c0 = _agent("c0", "g1", [30, 40])
    a = [texts.prompt(a0, r) for r in a0.requests]
    b = texts.prompt(b0, b0.requests[1])
    c = texts.prompt(c0, c0.requests[1])
    assert [len(t) for t in a] == [120, 200, 320]  # 4 chars per token
    assert a[1].startswith(a[0]) and a[2].startswith(a[1])  # history grows append-only
    assert b[:120] == a[0] and b[120:200] != a[1][120:200]  # siblings share the group prompt, then differ
    assert c[:80] == a[0][:80] and c[:120] != a[0]  # another group shares only the system prompt
    assert PromptTexts(4, seed=0).prompt(a0, a0.requests[2]) == a[2]  # reproducible


def test_prompt_text_refuses_a_nonpositive_ratio() -> None:
    with pytest.raises(SimError, match="chars_per_token must be > 0"):
        PromptTexts(chars_per_token=0)


def test_absolute_count_options_scale_with_the_system_and_ratios_do_not() -> None:
    assert scale_counts("vllm_router", {}, 0.25) == {"balance_abs_threshold": 16}  # 64 x 0.25
    assert scale_counts("cache_aware", {"balance_abs_threshold": 40, "cache_threshold": 0.5}, 0.5) == {
        "balance_abs_threshold": 20, "cache_threshold": 0.5}
    assert scale_counts("vllm_router", {"cache_threshold": 0.3}, 1.0) == {"cache_threshold": 0.3}
    assert scale_counts("misa_t", {"k_quantile": 0.9}, 0.1) == {"k_quantile": 0.9}
