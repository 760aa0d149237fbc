"""The trace generator against Table 2's quantiles, group structure and the context limit."""

from __future__ import annotations

import numpy as np
import pytest

from router.sim.errors import SimError
from router.sim.workload import WorkloadConfig, generate_trace, lognormal_from_quantiles, request_quantiles


@pytest.fixture(scope="module")
def paper_trace():
    return generate_trace(WorkloadConfig(seed=3))


def _close(value: float, target: float, rel: float) -> bool:
    return abs(value / target - 1) <= rel


def test_paper_sized_trace_has_about_75000_requests_in_2466_sessions(paper_trace):
    n_requests = sum(len(s.requests) for s in paper_trace)
    assert abs(len(paper_trace) - 2466) <= 12  # rounding to whole GRPO groups
    assert 65_000 <= n_requests <= 85_000


def test_agent_prompt_and_output_quantiles_match_table2(paper_trace):
    q = request_quantiles(paper_trace, "agent")
    assert _close(q["input"][0], 37757, 0.10)
    assert _close(q["input"][1], 103209, 0.10)
    assert _close(q["output"][0], 148, 0.10)
    assert _close(q["output"][1], 1612, 0.15)


def test_rlvr_has_short_prompts_and_long_decode_tails(paper_trace):
    q = request_quantiles(paper_trace, "rlvr")
    assert _close(q["output"][0], 47583, 0.15)
    assert q["output"][1] > 100_000  # the tail runs into the 128K limit
    assert q["input"][0] < 400


def test_rlhf_output_median_matches_table2(paper_trace):
    q = request_quantiles(paper_trace, "rlhf")
    assert _close(q["output"][0], 7344, 0.20)


def test_agent_sessions_average_table2_turns_and_grow_append_only(paper_trace):
    agents = [s for s in paper_trace if s.workload_class == "agent"]
    assert _close(np.mean([len(s.requests) for s in agents]), 73659 / 1058, 0.12)
    for s in agents[:50]:
        for prev, nxt in zip(s.requests, s.requests[1:]):
            assert nxt.prompt_tokens >= prev.prompt_tokens + prev.output_tokens
        assert s.requests[-1].session_end and not any(r.session_end for r in s.requests[:-1])


def test_no_request_exceeds_the_context_limit(paper_trace):
    assert max(r.prompt_tokens + r.output_tokens for s in paper_trace for r in s.requests) <= 131072


def test_group_siblings_share_the_group_prompt(paper_trace):
    groups = {}
    for s in paper_trace:
        groups.setdefault(s.group_id, []).append(s)
    rlvr = [g for gid, g in groups.items() if gid.startswith("rlvr")]
    assert all(len(g) == 8 for g in rlvr)
    assert all(len({s.requests[0].prompt_tokens for s in g}) == 1 for g in rlvr)


def test_tool_gap_share_is_near_the_table3_target_for_the_turn_time_hint(paper_trace):
    agents = [s for s in paper_trace if s.workload_class == "agent"]
    gaps = [r.tool_gap_s for s in agents for r in s.requests[:-1]]
    # mean gap = hint * share / (1 - share) = 8 s * 0.066 / 0.934
    assert _close(float(np.mean(gaps)), 8.0 * 0.066 / 0.934, 0.1)


def test_lognormal_fit_rejects_inverted_quantiles():
    with pytest.raises(SimError, match="p50 <= p95"):
        lognormal_from_quantiles(100, 10)
