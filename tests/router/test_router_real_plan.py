"""bench.router_real's plan: which routers run, with which configs, on which workload (no engines)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.router_real import MIXTURE, cpu_classes, plan_runs
from rl.config import REPO_ROOT
from router.sim.workload import WorkloadConfig, generate_trace, request_quantiles


def test_plan_sweeps_the_vllm_router_then_runs_every_router_at_the_permissive_ceiling():
    runs = plan_runs([4, 8, 16], 32, ["round_robin", "session_admission", "misa", "misa_t"])
    assert [(r.impl, r.policy, r.ceiling, r.sweep) for r in runs] == [
        ("vllm", "cache_aware", 4, True), ("vllm", "cache_aware", 8, True), ("vllm", "cache_aware", 16, True),
        ("vllm", "cache_aware", 32, False), ("ours", "round_robin", 32, False),
        ("ours", "session_admission", 32, False), ("ours", "misa", 32, False), ("ours", "misa_t", 32, False)]
    assert runs[0].router_cfg()["impl"] == "vllm"
    assert runs[-1].router_cfg()["policy"] == "misa_t"
    # The simulator gets the same policies (the vLLM Router as cache_aware on the exact index).
    assert [r.sim_policy().name for r in runs] == ["cache_aware"] * 4 + ["round_robin", "session_admission",
                                                                        "misa", "misa_t"]
    # The permissive ceiling already swept is not run twice.
    assert len(plan_runs([8, 32], 32, ["misa_t"])) == 3


def test_cpu_workload_keeps_the_paper_shape():
    trace = generate_trace(WorkloadConfig(units=600, pool_mixture=dict(MIXTURE), context_limit_tokens=1984,
                                          classes=cpu_classes(1984, 0.25), seed=0))
    agent, rlvr, rlhf = (request_quantiles(trace, c) for c in ("agent", "rlvr", "rlhf"))
    # agent: long prompts, short outputs; rlvr: short prompts, long decodes; rlhf in between.
    assert agent["input"][0] > 3 * rlhf["input"][0] and agent["output"][0] < rlhf["output"][0] < rlvr["output"][0]
    sessions = [s for s in trace if s.workload_class == "agent"]
    assert sum(len(s.requests) for s in sessions) / len(sessions) > 3
    assert all(r.prompt_tokens + r.output_tokens <= 1984 for s in trace for r in s.requests)
    assert any(r.tool_gap_s > 0 for s in sessions for r in s.requests)


@pytest.mark.parametrize("args, message", [
    (["--sweep", "8,x"], "--sweep: expected comma-separated integers"),
    (["--policies", "misa_t,nope"], "--policies"),
    (["--minutes", "0"], "--minutes must be a positive number"),
    (["--minutes", "nan"], "--minutes must be a positive number"),
    (["--kv-tokens", "1024"], "--kv-tokens 1024 is below --max-model-len 2048"),
])
def test_bad_arguments_are_refused_before_any_engine_starts(args, message):
    p = subprocess.run([sys.executable, "-m", "bench.router_real", *args], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0
    assert message in p.stderr
    assert "Traceback" not in p.stderr
