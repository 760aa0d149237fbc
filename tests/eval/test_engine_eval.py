"""A tiny evaluation of the real model (SmolLM2-135M on one real vLLM engine behind our
router): math + HumanEval, 2 problems each, n=2. Checks the plumbing, not the scores."""

from __future__ import annotations

import json

import pytest

from rl.evaluation import EvalSettings, HumanEvalBenchmark, arithmetic_heldout_benchmark, evaluate
from tests.conftest import SERVED_NAME


@pytest.mark.engine
def test_real_model_eval_grades_every_sample_and_reports_pass_at_k(real_router_url, tmp_path):
    benchmarks = [arithmetic_heldout_benchmark(2, seed=0, levels=(1,)),
                  HumanEvalBenchmark(limit=2)]
    settings = EvalSettings(n=2, ks=(1, 2), max_tokens=48, temperature=0.7, concurrency=4)
    report = evaluate(benchmarks, real_router_url, SERVED_NAME, settings, tmp_path, progress=False)
    for name in ("arithmetic", "humaneval"):
        r = report[name]
        assert r["num_scored"] == 2 and r["num_errors"] == 0, r["problems"]
        m = r["metrics"]
        assert 0.0 <= m["pass@1"]["mean"] <= m["pass@2"]["mean"] <= 1.0
        assert m["pass^2"]["mean"] <= m["pass@1"]["mean"]
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(s["answer"] for s in samples)  # the model wrote something
    print((tmp_path / "report.md").read_text())
