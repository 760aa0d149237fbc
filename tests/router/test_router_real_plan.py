"""bench.router_real's plan: which routers run, with which configs, on which workload (no engines)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.router_real import MIXTURE, cpu_classes, plan_runs
from common.config import REPO_ROOT
from router.sim.workload import WorkloadConfig, generate_trace, request_quantiles


def test_plan_sweeps_the_vllm_router_then_runs_every_router_at_the_permissive_ceiling():
    runs = plan_runs([4, 8, 16], 32, ["round_robin", "session_admission", "misa", "misa_t"])
    assert [(r.impl, r.policy, r.ceiling, r.sweep) for r in runs] == [
        ("vllm", "cache_aware", 4, True), ("vllm", "cache_aware", 8, True), ("vllm", "cache_aware", 16, True),
        ("vllm", "cache_aware", 32, False), ("ours", "round_robin", 32, False),
        ("ours", "session_admission", 32, False), ("ours", "misa", 32, False), ("ours", "misa_t", 32, False)]
    assert runs[0].router_cfg()["impl"] == "vllm"
    assert runs[-1].router_cfg()["policy"] == "misa_t"
    # The simulator gets the same policies: the vLLM Router as its mimic on synthetic text,
    # with the thresholds the real one was launched with.
    assert [r.sim_policy().name for r in runs] == ["vllm_router"] * 4 + ["round_robin", "session_admission",
                                                                        "misa", "misa_t"]
    mimic, launched = runs[0].sim_policy(), runs[0].router_cfg()
    assert (mimic.config.cache_threshold, mimic.config.balance_abs_threshold, mimic.config.balance_rel_threshold) \
        == (launched["cache_threshold"], launched["balance_abs_threshold"], launched["balance_rel_threshold"])
    # The permissive ceiling already swept is not run twice.
    assert len(plan_runs([8, 32], 32, ["misa_t"])) == 3
    # ... nor, when asked, one another run already swept (to be combined with it).
    assert [r.label for r in plan_runs([12], 20, ["kv_horizon"], baseline_at_ceiling=False)] \
        == ["vllm-router c=12", "kv_horizon c=20"]
    # --policy-param options go to the live router and the simulator alike, named in the label
    over = plan_runs([8], 32, ["kv_horizon"], {"kv_horizon": {"target_usage": 1.25, "min_target_usage": 1.25}})[-1]
    assert over.label == "kv_horizon(target_usage=1.25,min_target_usage=1.25) c=32"
    assert over.router_cfg()["params"] == {"request_bound": False, "target_usage": 1.25, "min_target_usage": 1.25}
    assert over.sim_policy().config.target_usage == 1.25 and over.sim_policy().config.request_bound is False


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


def test_engine_args_reach_both_engines_after_the_recipes_own():
    import argparse

    from bench.router_real import engine_config

    args = argparse.Namespace(kv_tokens=8192, max_num_batched_tokens=2048,
                              engine_arg=["--enable-scale-out", "--max-num-partial-prefills=2"])
    ecfg = engine_config(args, kv_bytes_per_token=2**17)
    assert list(ecfg.extra_args)[-2:] == ["--enable-scale-out", "--max-num-partial-prefills=2"]
    assert ecfg.kv_cache_space_gib == pytest.approx(1.0) and ecfg.max_num_batched_tokens == 2048
    assert list(engine_config(argparse.Namespace(kv_tokens=8192, max_num_batched_tokens=2048, engine_arg=[]),
                              2**17).extra_args) == []


@pytest.mark.parametrize("args, message", [
    (["--sweep", "8,x"], "--sweep: expected comma-separated integers"),
    (["--policies", "misa_t,nope"], "--policies"),
    (["--policies", "aimd"], "--policies: unknown ['aimd']; valid: round_robin, vllm_router"),
    (["--minutes", "0"], "--minutes must be a positive number"),
    (["--minutes", "nan"], "--minutes must be a positive number"),
    (["--warmup-minutes", "3"], "--warmup-minutes must be >= 0 and below --minutes 3"),
    (["--minutes", "1"], "--warmup-minutes must be >= 0 and below --minutes 1, got 1 (its default); give "
                         "--warmup-minutes 0 or a longer --minutes"),
    (["--policy-param", "kv_horizon.interference_blocks=-1", "--policies", "kv_horizon"],
     "--policy-param / --policies: router policy 'kv_horizon': interference_blocks must be >= 0"),
    (["--warmup-minutes", "-1"], "--warmup-minutes must be >= 0"),
    (["--kv-tokens", "1024"], "--kv-tokens 1024 is below --max-model-len 2048"),
    (["--seeds", "0,x"], "--seeds: expected comma-separated integers"),
    (["--seeds", "1,1"], "--seeds: each seed once"),
    (["--seeds", "-1"], "--seeds: expected integers >= 0 like 0,1,2"),
    (["--engine-arg=enable-scale-out"], "--engine-arg 'enable-scale-out': give a `vllm serve` option with its dashes"),
    (["--policy-param", "kv_horizon"], "--policy-param 'kv_horizon': give POLICY.KEY=VALUE"),
    (["--sweep", "16,16"], "--sweep: each value once, got '16,16'"),
    (["--policies", "kv_horizon,kv_horizon"], "--policies: each value once"),
    (["--policies", "kv_horizon", "--policy-param", "misa_t.k_quantile=0.5"], "'misa_t' is not in --policies"),
    (["--policies", "kv_horizon", "--policy-param", "kv_horizon.nosuch=1"], "--policies: "),
    (["--policies", "kv_horizon", "--policy-param", "kv_horizon.target_usage=2.5"],
     "need 0 < min_target_usage <= target_usage <= 2"),
])
def test_bad_arguments_are_refused_before_any_engine_starts(args, message):
    p = subprocess.run([sys.executable, "-m", "bench.router_real", *args], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def _finished_run(folder) -> tuple[list[dict], dict, dict, dict]:
    """A hand-made finished run in ``folder`` (its trace.jsonl; the caller writes results.json):
    (runs, calibration, args, real figures), a vLLM Router run at c=4 and a misa_t one at c=8."""
    from router.sim.trace import write_trace

    tmp_path = folder
    trace = generate_trace(WorkloadConfig(units=60, pool_mixture=dict(MIXTURE), context_limit_tokens=1984,
                                          classes=cpu_classes(1984, 0.25), seed=0))
    write_trace(trace, tmp_path / "trace.jsonl")
    real = {"samples_per_min": 10.0, "requests_per_min": 40.0, "prefix_hit_rate": 0.5, "prefill_tok_s": 400.0,
            "decode_tok_s": 40.0, "consumed_mixture": dict.fromkeys(MIXTURE, 1 / 3), "tv_distance": 0.1,
            "completion_s": {}, "preemptions": 0, "output_tokens_per_min": 900.0,
            "length_adjusted_samples_per_min": 9.0, "decode_tokens_per_sample": 90.0, "window_s": [0.0, 30.0]}
    # the engines' counters, sampled every 100 steps of a changing mix (40 ms + 1 ms per prefill
    # token + 0.5 ms per sequence a step)
    timeline, t, steps, prompt, gen = [], 0.0, 0.0, 0.0, 0.0
    for i in range(12):
        timeline.append({"t_s": t, "running": [4, 4], "waiting": [0, 0], "kv_usage": [0.3 + 0.05 * (i % 5)] * 2,
                         "in_flight_units": 8, "completed": {"agent": i}, "prefix_queries": 100.0 * i,
                         "prefix_hits": 50.0 * i, "steps": [steps] * 2, "computed_prompt": [prompt] * 2,
                         "generated": [gen] * 2})
        p, d = 20 * (i % 3), 4 + i % 4
        t, steps, prompt, gen = t + 100 * (0.040 + 0.001 * p + 0.0005 * d), steps + 100, prompt + 100 * p, gen + 100 * d
    runs = [{"label": "vllm-router c=4", "impl": "vllm", "policy": "cache_aware", "ceiling": 4, "sweep": True,
             "real": real, "errors": [], "timeline": timeline, "sim": {"samples_per_min": -1.0},
             "cpu_cores": {"engine_worker": 1.5, "engine_core": 0.3, "router": 0.05}},
            {"label": "misa_t c=8", "impl": "ours", "policy": "misa_t", "ceiling": 8, "sweep": False,
             "real": real, "errors": [], "timeline": timeline, "sim": {"samples_per_min": -1.0}}]
    calibration = {"engines": {"num_blocks": 32, "block_size": 128}, "profile": {}, "cpu_cores": {"engine_worker": 1.8},
                   "samples": [
        {"prefill_tokens": 0, "decode_seqs": 1, "context_tokens": 80, "step_time_s": 0.035},
        {"prefill_tokens": 0, "decode_seqs": 16, "context_tokens": 1280, "step_time_s": 0.078},
        {"prefill_tokens": 1024, "decode_seqs": 0, "context_tokens": 1024, "step_time_s": 1.9},
        {"prefill_tokens": 256, "decode_seqs": 0, "context_tokens": 1280, "step_time_s": 0.39}]}
    args = {"minutes": "0.5", "seed": "0", "max_model_len": "2048", "max_num_batched_tokens": "2048"}
    return runs, calibration, args, real


def test_resimulate_redoes_the_simulator_half_of_a_finished_run(tmp_path):
    """A finished run folder (real figures, trace, measured steps) gets fresh simulator
    figures and its tables without starting an engine; a folder that is none is refused."""
    import json

    runs, calibration, args, real = _finished_run(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"calibration": calibration, "args": args, "runs": runs}))
    run = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "\r" not in run.stderr  # into a pipe or log: no progress-bar redraws
    assert "No artists with labels" not in run.stderr  # no held requests to plot: no empty legend
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["baseline"] == "vllm-router c=4" and saved["calibration"]["profile"]["c0_s"] > 0
    assert all(r["sim"]["samples_per_min"] > 0 for r in saved["runs"])
    # and a second replay with step costs fitted to the other run's engine counters
    for r in saved["runs"]:
        assert r["sim_insitu"]["samples_per_min"] > 0 and r["insitu_profile"]["c0_s"] > 0
    assert "Simulator vs real" in (tmp_path / "table.md").read_text()
    assert "step costs in situ" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "router_real.png").exists()

    # A run of several seeds: each seed folder is redone, then the table over seeds.
    import shutil

    for seed in (0, 1):
        (tmp_path / "multi" / f"seed-{seed}").mkdir(parents=True)
        for name in ("results.json", "trace.jsonl"):
            shutil.copy(tmp_path / name, tmp_path / "multi" / f"seed-{seed}" / name)
    multi = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "multi")],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert multi.returncode == 0, multi.stderr
    summary = (tmp_path / "multi" / "summary.md").read_text()
    # the calibration's CPU joins the CPU table when its calibration.json is beside the seeds
    assert "| calibration" not in summary
    (tmp_path / "multi" / "calibration.json").write_text(json.dumps(calibration))
    with_cal = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "multi")],
                              capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert with_cal.returncode == 0, with_cal.stderr
    assert "| calibration (idle engines, before the runs) | 1.80 | 0.00 |" in (
        tmp_path / "multi" / "summary.md").read_text()
    # a backup folder beside the seeds is not a seed; a seed without its trace is refused
    # before any folder is rewritten
    shutil.copytree(tmp_path / "multi" / "seed-1", tmp_path / "multi" / "seed-1-old")
    (tmp_path / "multi" / "seed-1-old" / "trace.jsonl").unlink()
    again = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "multi")],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert again.returncode == 0, again.stderr
    (tmp_path / "multi" / "seed-1" / "trace.jsonl").unlink()
    before = (tmp_path / "multi" / "seed-0" / "results.json").stat().st_mtime_ns
    broken = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "multi")],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert broken.returncode == 2 and "seed-1: no trace.jsonl there" in broken.stderr, broken.stderr
    assert (tmp_path / "multi" / "seed-0" / "results.json").stat().st_mtime_ns == before
    assert "2 seed(s) [0, 1]" in summary and "vllm-router c=4 | " in summary
    assert "misa_t c=8 vs vllm-router (sweep-tuned, real): +0.0% ± 0.0 samples/min" in summary
    assert json.loads((tmp_path / "multi" / "summary.json").read_text())["baseline"] == "vllm-router c=4"
    assert "mimic against the real vLLM Router, per sweep point (step costs in situ" in summary
    # the calibration's profile scaled to the model threads' CPU in the run: 1.8 / 1.5 = 1.2
    # times every step (a run saved without cpu_cores gets no such replay)
    for seed in (0, 1):
        r0, r1 = json.loads((tmp_path / "multi" / f"seed-{seed}" / "results.json").read_text())["runs"]
        assert r0["cpu_profile"]["factor"] == pytest.approx(1.2) and "sim_cpu" not in r1
        assert r0["cpu_profile"]["c0_s"] == pytest.approx(1.2 * saved["calibration"]["profile"]["c0_s"])
        assert 0 < r0["sim_cpu"]["samples_per_min"] < r0["sim"]["samples_per_min"]
    assert "step costs from the calibration, scaled to the CPU the engines' model threads had in the run" in summary
    # real against simulated engine steps, both runs (their timelines carry the counters)
    steps_table = summary.split("### Engine steps, real vs simulator")[1].split("###")[0]
    assert "| vllm-router c=4 | " in steps_table and "| misa_t c=8 | " in steps_table
    # the CPU each role used during a run (a run saved without it is left out of the table)
    assert "| vllm-router c=4 | 1.50 | 0.30 | 0.00 | 0.05 | 0.00 | 0.00 |" in summary
    assert "| misa_t c=8 | " not in summary.split("### CPU used")[1]

    # A run measured with a warm-up: the simulator replays the warm window too (its window
    # starts at the first completion after the warm-up), and both windows are tabled.
    warm = tmp_path / "warm" / "seed-0"
    warm.mkdir(parents=True)
    shutil.copy(tmp_path / "trace.jsonl", warm / "trace.jsonl")
    runs_w = [dict(r, real_after_warmup=dict(real, samples_per_min=12.0)) for r in runs]
    runs_w[1]["real_after_warmup"]["samples_per_min"] = 15.0
    runs_w[0]["router_decisions"] = {"prefix_hit": 5, "prefix_miss": 0, "missing_tokens": 5}
    (warm / "results.json").write_text(json.dumps({"calibration": calibration, "runs": runs_w,
                                                   "args": dict(args, warmup_minutes="0.2")}))
    run_w = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "warm")],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert run_w.returncode == 0, run_w.stderr
    saved_w = json.loads((warm / "results.json").read_text())["runs"]
    for r in saved_w:
        assert r["sim_after_warmup"]["window_s"][0] >= 12.0 > r["sim"]["window_s"][0]
    summary_w = (tmp_path / "warm" / "summary.md").read_text()
    assert "## Window: whole run" in summary_w and "## Window: after the first 0.2 min (warm)" in summary_w
    assert "misa_t c=8 vs vllm-router (sweep-tuned, real): +25.0% ± 0.0 samples/min" in summary_w
    windows = json.loads((tmp_path / "warm" / "summary.json").read_text())["windows"]
    assert set(windows) == {"real", "real_after_warmup"}
    assert "after the first 0.2 min" in (warm / "table.md").read_text()
    # the real router's placements beside the mimic's, which took its 50% missing-tokens share
    assert "How the vLLM Router placed requests" in summary_w and "| vllm-router c=4 | 50 / 0 / 50 / 0 |" in summary_w
    assert sum(saved_w[0]["sim_decisions"].values()) > 0 and saved_w[0]["sim_decisions"].get("missing_tokens", 0) > 0

    bad = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "nope")],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert bad.returncode == 2 and "error: --resimulate" in bad.stderr and "no such folder" in bad.stderr
    (tmp_path / "empty").mkdir()
    empty = subprocess.run([sys.executable, "-m", "bench.router_real", "--resimulate", str(tmp_path / "empty")],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert empty.returncode == 2 and "no results.json there" in empty.stderr and "Traceback" not in empty.stderr
    md = (tmp_path / "table.md").read_text().split("## Simulator vs real")[1].split("\n", 1)[1].strip().splitlines()
    assert len({line.count("|") for line in md}) == 1  # header, separator and rows have the same cells
    assert "Traceback" not in bad.stderr


def test_regime_figures_from_a_hand_made_timeline():
    """Sessions and running requests per engine, KV usage, and the share of samples in which
    every class cap of every instance is above 1 (the 'all' total and other instances' keys
    with dots in their names do not confuse it); a router without class caps gets None."""
    from bench.router_real import regime

    def point(t, in_flight, running, kv, caps=None):
        p = {"t_s": t, "in_flight_units": in_flight, "running": running, "kv_usage": kv}
        if caps is not None:
            p["caps"] = caps
        return p

    w = "http://127.0.0.1:8001"
    ok = {f"caps.{w}.all": 9, f"caps.{w}.agent": 4, f"caps.{w}.rlvr": 3, f"caps.{w}.rlhf": 2}
    floor = {**ok, f"caps.{w}.rlhf": 1}
    timeline = [point(0.0, 100, [50, 50], [1.0, 1.0], ok),  # before the window: left out
                point(10.0, 16, [6, 4], [0.5, 0.7], ok), point(20.0, 24, [8, 6], [0.9, 0.9], floor),
                point(30.0, 20, [7, 5], [0.6, 0.8], ok), point(40.0, 20, [7, 5], [0.6, 0.8], ok)]
    g = regime(timeline, 2, (5.0, 40.0))
    assert g["samples"] == 4
    assert g["sessions_per_engine"] == pytest.approx((16 + 24 + 20 + 20) / 4 / 2)
    assert g["running_per_engine"] == pytest.approx((10 + 14 + 12 + 12) / 4 / 2)
    assert g["kv_usage"] == pytest.approx((0.6 + 0.9 + 0.7 + 0.7) / 4)
    assert g["class_caps_above_1"] == pytest.approx(3 / 4)
    no_caps = regime([point(10.0, 8, [2, 2], [0.1, 0.1])], 2, (0.0, 60.0))
    assert no_caps["class_caps_above_1"] is None and no_caps["sessions_per_engine"] == 4


def test_samples_per_minute_from_a_hand_made_timeline(tmp_path):
    """Units completed per whole minute of wall time, read off the cumulative counts (linear
    between samples, a last partial minute left out); the summary's table gives each
    router's mean and range over seeds minute by minute and draws them."""
    from bench.router_real import _by_minute_section, samples_per_min_over_time

    def point(t, agent, rlvr):
        return {"t_s": t, "completed": {"agent": agent, "rlvr": rlvr, "rlhf": 0}}

    # 30 units by 60 s (15 + 15), 40 by 120 s: the 90 s sample splits minute 2 in halves
    timeline = [point(30.0, 10, 5), point(60.0, 15, 15), point(90.0, 18, 17), point(120.0, 20, 20),
                point(150.0, 30, 20)]
    assert samples_per_min_over_time(timeline) == pytest.approx([30.0, 10.0])
    assert samples_per_min_over_time(timeline, bin_s=30.0) == pytest.approx([30.0, 30.0, 10.0, 10.0, 20.0])
    assert samples_per_min_over_time([]) == [] and samples_per_min_over_time(timeline[:1]) == []
    with pytest.raises(ValueError, match="bin_s must be > 0"):
        samples_per_min_over_time(timeline, bin_s=0)

    other = [point(60.0, 10, 10), point(120.0, 20, 20)]  # 20 and 20 a minute
    per_seed = [(0, [{"label": "a", "timeline": timeline}]), (1, [{"label": "a", "timeline": other}])]
    lines = _by_minute_section(per_seed, ["a"], tmp_path)
    assert "| a | 25.0 [20-30] | 15.0 [10-20] |" in lines
    assert (tmp_path / "rate_over_time.png").stat().st_size > 0
    # a run saved without a timeline: the section says which, and no plot of an earlier summary stays
    left = _by_minute_section([(0, [{"label": "a", "timeline": timeline}, {"label": "b", "timeline": []}])],
                              ["a", "b"], tmp_path)
    assert "Left out: no whole minute of timeline in b of seed 0 (a shorter run, or one saved without a timeline)." in left
    assert not (tmp_path / "rate_over_time.png").exists()


def test_router_decisions_are_read_from_a_vllm_router_metrics_page():
    from bench.router_real import missing_tokens_share
    from router.replay import router_decisions

    page = """# TYPE vllm_router_prefix_routing_decisions_total counter
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_hit"} 30
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="missing_tokens"} 10
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="pd",outcome="missing_tokens"} 5
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_miss"} 5
# TYPE vllm_router_requests_total counter
vllm_router_requests_total{route="/v1/completions"} 50
"""
    decisions = router_decisions(page)
    assert decisions == {"prefix_hit": 30, "missing_tokens": 15, "prefix_miss": 5}
    assert missing_tokens_share(decisions) == pytest.approx(0.3)
    assert missing_tokens_share(None) == 0.0 and missing_tokens_share({}) == 0.0
    assert router_decisions("") == {}
    # the mimic takes the measured share
    run = plan_runs([16], 16, [])[0]
    assert run.sim_policy(0.3).config.missing_tokens_share == 0.3
    # ... or, when the run sampled them, the times it took the branch at (and no share)
    timed = run.sim_policy(0.3, [4.0, 1.5]).config
    assert (timed.missing_tokens_at_s, timed.missing_tokens_share) == ((1.5, 4.0), 0.0)


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("missing_tokens_s", "abc", "runs[0].missing_tokens_s must be a list of times"),
    ("missing_tokens_s", [-1], "runs[0].missing_tokens_s must be a list of times"),
    ("missing_tokens_s", [True], "runs[0].missing_tokens_s must be a list of times"),
    ("missing_tokens_s", 5, "runs[0].missing_tokens_s must be a list of times"),
    ("missing_tokens_s", {}, "runs[0].missing_tokens_s must be a list of times"),
    ("router_decisions", {"missing_tokens": "x"}, "runs[0].router_decisions must map outcomes to counts"),
    ("cpu_cores", {"engine_worker": -1}, "runs[0].cpu_cores must map roles to cores"),
    ("cpu_cores", [1.6], "runs[0].cpu_cores must map roles to cores"),
    ("cpu_cores", {"router": "x"}, "runs[0].cpu_cores must map roles to cores"),
    ("cpu_cores_by_engine", [{"engine_worker": 0.9}, "x"], "runs[0].cpu_cores_by_engine must be a list of maps"),
    ("cpu_cores_by_engine", {"engine_worker": 0.9}, "runs[0].cpu_cores_by_engine must be a list of maps"),
    ("sample", {"bogus": 1}, "calibration.samples[0] must have exactly prefill_tokens"),
    ("sample", {"step_time_s": None}, "calibration.samples[0] must have exactly prefill_tokens"),
    ("sample", {"step_time_s": "fast"}, "calibration.samples[0] needs finite numbers >= 0"),
    ("sample", {"step_time_s": -1}, "calibration.samples[0] needs finite numbers >= 0"),
    ("sample", {"prefill_tokens": True}, "calibration.samples[0] needs finite numbers >= 0"),
    ("sample", [1, 2], "calibration.samples[0] must be an object"),
    ("timeline", [{"t_s": 5.0}], "runs[0].timeline[0] must be a sample with t_s (s) and completed"),
    ("timeline", [{"t_s": 5.0, "completed": {"agent": 1}}, {"t_s": "x", "completed": {}}],
     "runs[0].timeline[1] must be a sample with t_s (s) and completed"),
    ("timeline", [{"t_s": 5.0, "completed": {"agent": "one"}}], "runs[0].timeline[0] must be a sample"),
    ("timeline", [7], "runs[0].timeline[0] must be a sample"),
    ("timeline", {"t_s": 5.0}, "runs[0].timeline[0] must be a sample"),
])
def test_resimulate_refuses_a_saved_run_with_malformed_router_inputs(tmp_path, capsys, field, value, expected):
    """A hand-edited results.json: one error line (exit 2) naming the run and field, before
    any folder is rewritten; well-formed and absent values pass."""
    from bench.router_real import check_run_folder

    (tmp_path / "trace.jsonl").write_text("")
    good = {"label": "vllm-router c=4", "missing_tokens_s": [1.5, 2.0], "router_decisions": {"prefix_hit": 3},
            "timeline": [{"t_s": 5.0, "completed": {"agent": 1, "rlvr": 0}}],
            "cpu_cores": {"engine_worker": 1.6, "router": 0.0},
            "cpu_cores_by_engine": [{"engine_worker": 0.8}, {"engine_worker": 0.8, "engine_core": 0.1}]}
    (tmp_path / "results.json").write_text(json.dumps({"runs": [good, {"label": "old run"}]}))
    check_run_folder(tmp_path)  # passes
    (tmp_path / "results.json").write_text(json.dumps({"runs": [good], "calibration": {"cpu_cores": {"job": -2}}}))
    with pytest.raises(SystemExit):
        check_run_folder(tmp_path)
    assert "calibration.cpu_cores must map roles to cores" in capsys.readouterr().err
    if field == "sample":  # a calibration sample, hand-edited
        sample = {"prefill_tokens": 0, "decode_seqs": 1, "context_tokens": 80, "step_time_s": 0.035}
        if isinstance(value, dict):
            sample = {k: v for k, v in {**sample, **value}.items() if v is not None}
        else:
            sample = value
        (tmp_path / "results.json").write_text(json.dumps({"runs": [good], "calibration": {"samples": [sample]}}))
    else:
        (tmp_path / "results.json").write_text(json.dumps({"runs": [{**good, field: value}]}))
    with pytest.raises(SystemExit) as refused:
        check_run_folder(tmp_path)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err


def test_real_step_figures_from_a_hand_made_timeline():
    """Both engines' steps between the first and last samples with counters in the window;
    none without two such samples."""
    from bench.router_real import real_step_figures

    def point(t, steps, prompt, gen):
        return {"t_s": t, "steps": steps, "computed_prompt": prompt, "generated": gen}

    timeline = [point(0.0, [0, 0], [0, 0], [0, 0]),  # before the window
                point(10.0, [100, 50], [1000, 0], [400, 100]),
                {"t_s": 15.0},  # no counters: skipped
                point(20.0, [300, 150], [3000, 1000], [1400, 300]),
                point(99.0, [900, 900], [0, 0], [0, 0])]  # after the window
    f = real_step_figures(timeline, (5.0, 30.0))
    # 300 steps in 10 s, 2 engines x 10 s = 20 s of engine time; 3,000 prompt and 1,200 generated tokens
    assert f == {"steps_per_s": pytest.approx(30.0), "ms_per_step": pytest.approx(20_000 / 300),
                 "prefill_tokens_per_step": pytest.approx(10.0), "decode_seqs_per_step": pytest.approx(4.0)}
    assert real_step_figures(timeline[:2], (5.0, 30.0)) is None
    assert real_step_figures([{"t_s": 10.0, "running": [1]}, {"t_s": 20.0, "running": [1]}], (0.0, 30.0)) is None


def test_calibrations_before_and_after_the_runs_are_pooled_and_their_drift_reported(tmp_path):
    from bench.router_real import _drift_section, pooled_calibration

    def cal(scale, worker):
        return {"samples": [
            {"prefill_tokens": 0, "decode_seqs": 1, "context_tokens": 80, "step_time_s": 0.030 * scale,
             "attention_pairs": None, "mixed_steps": 0.0},
            {"prefill_tokens": 0, "decode_seqs": 16, "context_tokens": 1280, "step_time_s": 0.060 * scale,
             "attention_pairs": None, "mixed_steps": 0.0},
            {"prefill_tokens": 0, "decode_seqs": 32, "context_tokens": 2560, "step_time_s": 0.090 * scale,
             "attention_pairs": None, "mixed_steps": 0.0},
            {"prefill_tokens": 1024, "decode_seqs": 0, "context_tokens": 1024, "step_time_s": 1.0 * scale,
             "attention_pairs": 524800.0, "mixed_steps": 0.0}], "cpu_cores": {"engine_worker": worker}}

    before, after = cal(1.0, 1.8), cal(1.5, 1.6)
    pooled = pooled_calibration(before, after, {"num_blocks": 64, "block_size": 128})
    assert pooled["samples"] == before["samples"] + after["samples"]
    assert pooled["samples_before_runs"] == before["samples"] and pooled["samples_after_runs"] == after["samples"]
    assert pooled["drift"] == pytest.approx([1.5] * 4)
    assert pooled["cpu_cores"] == {"engine_worker": pytest.approx(1.7)}
    # the profile is fitted to both: between the two calibrations' own profiles
    one = pooled_calibration(before, before, {})["profile"]["c_decode_s"]
    assert one < pooled["profile"]["c_decode_s"] < pooled_calibration(after, after, {})["profile"]["c_decode_s"]
    (tmp_path / "calibration.json").write_text(json.dumps(pooled))
    [line, _] = _drift_section(tmp_path)
    assert line.startswith("Calibrated steps after the runs / before, per shape (4 shapes): median 1.50x, range 1.50-1.50x")
    (tmp_path / "calibration.json").write_text(json.dumps(before))  # calibrated once: no line
    assert _drift_section(tmp_path) == []


def test_added_overhead_is_the_time_outside_the_engine_core_less_the_step_wait():
    """The simulator adds the time outside the engines plus the API server's part of vLLM's
    e2e, less the wait for a running step (which the simulated engine counts as queue time):
    0.1 + 0.5 - 0.25 here (one engine, 10 steps of 0.5 s, 4 requests finished). Behind our
    router (overhead None) the API part alone; without the engine core's split the outside
    time alone; a negative outside reading is summed before the floor, not dropped."""
    from bench.router_real import added_request_overhead_s

    timeline = [{"t_s": 0.0, "steps": [0], "running": [2], "e2e_n": [0]},
                {"t_s": 5.0, "steps": [10], "running": [2], "e2e_n": [4]}]
    assert added_request_overhead_s({"overhead_s": 0.1, "api_s": 0.5}, timeline) == pytest.approx(0.35)
    assert added_request_overhead_s({"overhead_s": None, "api_s": 0.5}, timeline) == pytest.approx(0.25)
    assert added_request_overhead_s({"overhead_s": 0.1}, timeline) == pytest.approx(0.1)
    assert added_request_overhead_s({"overhead_s": -0.3, "api_s": 0.5}, timeline) == 0.0
    assert added_request_overhead_s({"overhead_s": -0.1, "api_s": 0.5}, timeline) == pytest.approx(0.15)
    assert added_request_overhead_s({}, timeline) == 0.0
    assert added_request_overhead_s({"overhead_s": 0.2, "api_s": 0.5}, []) == pytest.approx(0.7)  # no step counters


def test_resimulate_adds_the_vllm_routers_time_outside_the_engines(tmp_path):
    """A run's measured time outside the engines delays each simulated request (fewer samples
    than without it) and the summary tables where the time went; behind our router (held
    seconds in its timeline) it is not separable and nothing is added."""
    from bench.router_real import resimulate, summarize_seeds

    runs, calibration, args, _ = _finished_run(tmp_path)
    runs[0]["request_times"] = {"overhead_s": 2.0, "client_s": 3.0, "engine_s": 1.0, "hold_s": 0.0, "requests": 40,
                                "queue_s": 0.1, "prefill_s": 0.3, "decode_s": 0.5, "api_s": 0.1, "between_s": 0.5}
    # behind our router request_times leaves the time outside the engines out
    runs[1]["request_times"] = {"overhead_s": None, "client_s": 3.0, "engine_s": 1.0, "hold_s": 1.5, "requests": 40}
    (tmp_path / "results.json").write_text(json.dumps({"calibration": calibration, "args": args, "runs": runs}))
    plain, _, _ = resimulate(tmp_path, request_overhead=False)
    with_overhead, _, _ = resimulate(tmp_path)
    assert [r["sim_request_overhead_s"] for r in plain] == [0.0, 0.0]
    # 2.0 outside + 0.1 of the API server (this timeline has no finished-request counts: no step wait)
    assert [r["sim_request_overhead_s"] for r in with_overhead] == [pytest.approx(2.1), 0.0]
    assert [r["sim_continuation_delay_s"] for r in with_overhead] == [0.5, 0.0]
    assert with_overhead[1]["request_times"]["overhead_s"] is None
    assert with_overhead[0]["sim"]["samples_per_min"] < plain[0]["sim"]["samples_per_min"]
    sim = with_overhead[0]["sim"]
    assert sim["request_queue_s"] >= 0 and sim["request_prefill_s"] > 0 and sim["request_decode_s"] > 0
    text = summarize_seeds([(0, with_overhead)], tmp_path, 0.5)
    table = text.split("### Where a request's time went")[1].split("###")[0]
    assert "| vllm-router c=4 | 3.00 | 0.50 | 2.00 | 0.00 | 0.10 | 0.10 / " in table and "| 2.10 + 0.50 |" in table
    assert table.count("| misa_t c=8 | 3.00 | n/a | n/a |") == 1


def test_summary_sets_each_router_against_the_goal_over_the_ceiling(tmp_path):
    """Per window, each run's samples/min against the sweep-tuned baseline and its largest
    class p50 completion ratio, marked against the goal's 2x, in lines and in a plot with one
    line per router (a label without its ceiling); a window the runs lack has no plot."""
    from bench.router_real import resimulate, router_family, summarize_seeds

    runs, calibration, args, real = _finished_run(tmp_path)
    runs[0]["real"] = {**real, "completion_s": {"rlvr": {"p50": 10.0, "p95": 20.0}, "rlhf": {"p50": 4.0, "p95": 6.0}}}
    runs[1]["real"] = {**real, "samples_per_min": 13.0,
                       "completion_s": {"rlvr": {"p50": 25.0, "p95": 40.0}, "rlhf": {"p50": 6.0, "p95": 9.0}}}
    (tmp_path / "results.json").write_text(json.dumps({"calibration": calibration, "args": args, "runs": runs}))
    (tmp_path / "ceilings_after_warmup.png").write_bytes(b"an earlier summary's")
    results, _, _ = resimulate(tmp_path)
    text = summarize_seeds([(0, results)], tmp_path, 0.5)
    assert ("misa_t c=8 (2x) vs vllm-router c=4 (sweep-tuned): +30.0% ± 0.0 samples/min, largest p50 completion "
            "ratio 2.50x (rlvr; over 2x)") in text
    assert "Plot: `ceilings.png`" in text and (tmp_path / "ceilings.png").stat().st_size > 10_000
    assert not (tmp_path / "ceilings_after_warmup.png").exists()  # no warm window in these runs
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["windows"]["real"]["ceiling_headlines"] == [line for line in text.splitlines()
                                                            if line.startswith("misa_t c=8 (2x) vs ")]
    assert [router_family(lb) for lb in ("vllm-router c=16", "kv_horizon(interference_blocks=64) c=20", "odd c=x")] \
        == ["vllm-router", "kv_horizon(interference_blocks=64)", "odd c=x"]


def test_each_engine_real_beside_simulated_the_engine_with_more_prefill_first(tmp_path):
    """Per engine: the real one's steps, requests and request split from its counters; the
    simulator's per engine sum to its totals; the table pairs the engines by the prompt tokens
    they computed, not by index; each engine's CPU is read by the port of its URL."""
    from bench.router_real import engine_cpu, real_engine_figures, resimulate, summarize_seeds

    def point(t, steps, prompt, gen, n, split):
        return {"t_s": t, "steps": steps, "computed_prompt": prompt, "generated": gen, "e2e_n": n,
                "queue_s": [split[0]] * 2, "prefill_s": [split[1]] * 2, "decode_s": [split[2]] * 2}

    timeline = [point(0.0, [0, 0], [0, 0], [0, 0], [0, 0], (0, 0, 0)),
                point(10.0, [400, 50], [400, 5000], [1200, 300], [4, 20], (1.0, 4.0, 10.0))]
    light, heavy = real_engine_figures(timeline, (0.0, 30.0))
    assert light["steps_per_s"] == pytest.approx(40.0) and light["ms_per_step"] == pytest.approx(25.0)
    assert heavy["prefill_tokens_per_step"] == pytest.approx(100.0) and heavy["decode_seqs_per_step"] == pytest.approx(6.0)
    assert heavy["requests"] == 20 and heavy["request_decode_s"] == pytest.approx(0.5)
    assert light["request_queue_s"] == pytest.approx(0.25) and light["request_prefill_s"] == pytest.approx(1.0)
    assert real_engine_figures(timeline[:1], (0.0, 30.0)) is None
    # counters of an older run without the engine core's sums: n/a, not an error
    old = [{k: v for k, v in p.items() if not k.endswith("_s") or k == "t_s"} for p in timeline]
    assert math.isnan(real_engine_figures(old, (0.0, 30.0))[1]["request_queue_s"])

    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002/"]
    cores = {"engine_worker@8002": 0.6, "engine_worker@8001": 0.9, "engine_core@8002": 0.3, "router": 0.1}
    assert engine_cpu(cores, urls) == ({"engine_worker": 1.5, "engine_core": 0.3, "router": 0.1},
                                       [{"engine_worker": 0.9}, {"engine_worker": 0.6, "engine_core": 0.3}])
    assert engine_cpu({"engine_worker@8001": 0.9}, urls)[1] is None  # one engine not found: none

    runs, calibration, args, _ = _finished_run(tmp_path)
    base = runs[0]["timeline"]
    runs[0]["timeline"] = [dict(base[i], **{k: v[::-1] for k, v in p.items() if k != "t_s"}, t_s=p["t_s"])
                           for i, p in zip((0, -1), timeline)]
    runs[0]["real"]["window_s"] = [0.0, 30.0]
    runs[0]["cpu_cores_by_engine"] = [{"engine_worker": 0.6}, {"engine_worker": 0.9}]
    calibration["cpu_cores_by_engine"] = [{"engine_worker": 0.9}, {"engine_worker": 0.9}]
    (tmp_path / "results.json").write_text(json.dumps({"calibration": calibration, "args": args, "runs": runs}))
    results, _, _ = resimulate(tmp_path)
    # each simulated engine is scaled by the CPU of the real engine of its rank: the one with more
    # prefill had 0.6 of the calibration's 0.9 cores (1.5x longer steps), the other all of it
    factors = results[0]["cpu_profile"]["engine_factors"]
    heavy = max(range(2), key=lambda i: results[0]["sim_cpu"]["engines"][i]["prefill_tokens_per_step"]
                * results[0]["sim_cpu"]["engines"][i]["steps_per_s"])
    assert factors[heavy] == pytest.approx(1.5) and factors[1 - heavy] == pytest.approx(1.0)
    assert results[0]["cpu_profile"]["engine_ranks"] == [heavy, 1 - heavy]
    assert "engine_factors" not in (results[1].get("cpu_profile") or {})  # no per-engine CPU: the pooled factor
    sim = results[0]["sim"]
    assert len(sim["engines"]) == 2 and sum(e["requests"] for e in sim["engines"]) == sim["requests_finished"]
    assert sum(e["steps_per_s"] for e in sim["engines"]) == pytest.approx(sim["engine_steps"]["steps_per_s"])
    table = summarize_seeds([(0, results)], tmp_path, 0.5).split("### Per engine")[1].split("###")[0]
    rows = [line for line in table.splitlines() if line.startswith("| vllm-router c=4 |")]
    # the real engine 0 (reversed above) is the one with more prefill: it comes first, with its worker's 0.6 cores
    assert rows[0].startswith("| vllm-router c=4 | more prefill | 20 / ") and rows[0].endswith("| 0.60 |")
    assert rows[1].startswith("| vllm-router c=4 | less prefill | 4 / ") and rows[1].endswith("| 0.90 |")


def _finished_seeds(run: Path, labels: list[tuple[str, str, str, int, float]], seeds=(0, 1)) -> None:
    """A hand-made finished run of ``seeds`` in ``run`` (``seed-<n>/``), resimulated so each
    router has its simulator figures: per router (label, impl, policy, ceiling, real samples/min)."""
    from bench.router_real import resimulate

    for seed in seeds:
        folder = run / f"seed-{seed}"
        folder.mkdir(parents=True)
        runs, calibration, args, real = _finished_run(folder)
        made = [{**runs[0 if impl == "vllm" else 1], "label": label, "impl": impl, "policy": policy,
                 "ceiling": ceiling, "sweep": impl == "vllm", "real": {**real, "samples_per_min": spm}}
                for label, impl, policy, ceiling, spm in labels]
        args = {**args, "warmup_minutes": "0.0", "kv_tokens": "8192", "engine_arg": "[]", "tool_gap_share": "0.25",
                "units": "60"}
        (folder / "results.json").write_text(json.dumps({"calibration": calibration, "args": args, "runs": made}))
        resimulate(folder)


def test_combined_runs_are_ordered_by_router_options_and_ceiling_not_by_folder():
    from bench.router_real import _combined_order

    labels = [("kv_horizon c=24", "ours", 24), ("vllm-router c=16", "vllm", 16), ("kv_horizon(interference_blocks=64) c=20",
              "ours", 20), ("kv_horizon c=16", "ours", 16), ("vllm-router c=12", "vllm", 12), ("misa_t c=96", "ours", 96),
              ("kv_horizon c=20", "ours", 20), ("vllm-router c=96", "vllm", 96),
              ("kv_horizon(interference_blocks=256,target_usage=1.1) c=20", "ours", 20)]
    runs = sorted(({"label": label, "impl": impl, "ceiling": str(c)} for label, impl, c in labels), key=_combined_order)
    assert [r["label"] for r in runs] == [
        "vllm-router c=12", "vllm-router c=16", "vllm-router c=96", "kv_horizon c=16", "kv_horizon c=20",
        "kv_horizon c=24", "kv_horizon(interference_blocks=64) c=20",
        "kv_horizon(interference_blocks=256,target_usage=1.1) c=20", "misa_t c=96"]  # 64 before 256


def test_combine_sets_the_routers_of_two_runs_side_by_side(tmp_path, capsys):
    """Sweep points run later join an earlier run's routers, seed by seed, in one folder and
    summary naming its sources; runs that do not share seeds, traces, options or that ran
    one router twice are refused in one line (exit 2), and the result is neither resimulated
    nor combined again."""
    import shutil

    from bench.router_real import combine_runs

    early, late = tmp_path / "early", tmp_path / "late"
    _finished_seeds(early, [("vllm-router c=4", "vllm", "cache_aware", 4, 10.0), ("misa_t c=8", "ours", "misa_t", 8, 12.0)])
    _finished_seeds(late, [("vllm-router c=2", "vllm", "cache_aware", 2, 14.0),
                           ("kv_horizon c=2", "ours", "kv_horizon", 2, 21.0)])
    out = tmp_path / "both"
    run = subprocess.run([sys.executable, "-m", "bench.router_real", "--combine", str(early), str(late),
                          "--out", str(out)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    for seed in (0, 1):
        saved = json.loads((out / f"seed-{seed}" / "results.json").read_text())
        assert [r["label"] for r in saved["runs"]] == ["vllm-router c=2", "vllm-router c=4", "kv_horizon c=2",
                                                       "misa_t c=8"]  # the vLLM Router by ceiling, then ours by name
        assert [r["source"] for r in saved["runs"]] == [str(late), str(early), str(late), str(early)]
        assert saved["baseline"] == "vllm-router c=2" and saved["args"]["combined_from"] == [str(early), str(late)]
        assert (out / f"seed-{seed}" / "trace.jsonl").read_bytes() == (early / f"seed-{seed}" / "trace.jsonl").read_bytes()
        assert (out / f"seed-{seed}" / "table.md").exists() and (out / f"seed-{seed}" / "router_real.png").exists()
    summary = (out / "summary.md").read_text()
    assert f"Combined (`--combine`) from 2 runs" in summary and f"`{early}`: vllm-router c=4, misa_t c=8" in summary
    # the best sweep point of either run is the baseline: 10 and 21 samples/min against 14
    assert "misa_t c=8 vs vllm-router (sweep-tuned, real): -14.3% ± 0.0 samples/min" in summary
    assert "kv_horizon c=2 vs vllm-router (sweep-tuned, real): +50.0% ± 0.0 samples/min" in summary
    assert "each class's p50 completion time" in summary and "| vllm-router c=4 | 4 (2x) | 10.00 | -28.6% ± 0.0 |" in summary
    assert json.loads((out / "summary.json").read_text())["sources"] == {
        str(late): ["vllm-router c=2", "kv_horizon c=2"], str(early): ["vllm-router c=4", "misa_t c=8"]}
    # what it wrote is not a run to resimulate or combine again: give its sources
    for option in ("--resimulate", "--combine"):
        again = subprocess.run([sys.executable, "-m", "bench.router_real", option, str(out)]
                               + ([str(early), "--out", str(tmp_path / "x")] if option == "--combine" else []),
                               capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
        assert again.returncode == 2 and "a folder written by --combine" in again.stderr, again.stderr
        assert "Traceback" not in again.stderr

    def refused(dirs: list[Path], expected: str, dest: Path = tmp_path / "refused") -> None:
        with pytest.raises(SystemExit) as e:
            combine_runs(dirs, dest)
        err = capsys.readouterr().err
        assert e.value.code == 2 and expected in err and err.count("\n") == 1, err

    refused([early], "give two run folders or more, got 1")
    refused([tmp_path / "nope"], "no such folder")  # what is wrong with the one folder, before the count
    refused([early, tmp_path / "early"], "a run folder is given twice")
    refused([early, late], "one of the runs to combine", dest=late)
    refused([early, late], "a folder inside one", dest=early / "seed-0" / "combined")
    (tmp_path / "a-file").write_text("")
    refused([early, late], "a file, not a folder", dest=tmp_path / "a-file")
    (tmp_path / "seed-file" / "seed-0").mkdir(parents=True)
    (tmp_path / "seed-file" / "seed-1").write_text("")
    refused([early, late], "seed-1 is a file, not a seed's folder", dest=tmp_path / "seed-file")
    assert not any((tmp_path / "seed-file" / "seed-0").iterdir())
    shutil.copytree(early / "seed-0", tmp_path / "a-run" / "seed-0")
    refused([early, late], "holds a run (seed-0/results.json) that --combine did not write", dest=tmp_path / "a-run")
    (tmp_path / "notes" / "seed-7").mkdir(parents=True)
    (tmp_path / "notes" / "seed-7" / "notes.txt").write_text("mine")  # not a run's, not --combine's: kept
    refused([early, late], "holds seed-7/ that --combine did not write", dest=tmp_path / "notes")
    assert (tmp_path / "notes" / "seed-7" / "notes.txt").read_text() == "mine"
    shutil.copytree(out / "seed-1", out / "seed-7")
    combine_runs([early, late], out)  # an earlier combination is written over, its other seeds removed
    assert sorted(p.name for p in out.glob("seed-*")) == ["seed-0", "seed-1"]
    refused([early, tmp_path / "nope"], "no such folder")
    refused([early, tmp_path], "no seed-<n>/ folder", dest=tmp_path / "x")  # not blamed on --out inside it
    (tmp_path / "bare").mkdir()
    refused([early, tmp_path / "bare"], "no seed-<n>/ folder")
    shutil.copytree(early, tmp_path / "twice")
    refused([early, tmp_path / "twice"], "'vllm-router c=4' ran in both")
    shutil.copytree(late, tmp_path / "one-seed")
    shutil.rmtree(tmp_path / "one-seed" / "seed-1")
    refused([early, tmp_path / "one-seed"], "has seeds [0, 1]")
    shutil.copytree(late, tmp_path / "other-trace")
    with open(tmp_path / "other-trace" / "seed-1" / "trace.jsonl", "a") as f:
        f.write("\n")
    refused([early, tmp_path / "other-trace"], "seed 1's trace differs")
    shutil.copytree(late, tmp_path / "other-units")
    saved = json.loads((tmp_path / "other-units" / "seed-0" / "results.json").read_text())
    saved["args"]["units"] = "3000"
    (tmp_path / "other-units" / "seed-0" / "results.json").write_text(json.dumps(saved))
    refused([early, tmp_path / "other-units"], "different options (units 60 vs 3000)")
    del saved["args"]["kv_tokens"]
    (tmp_path / "other-units" / "seed-0" / "results.json").write_text(json.dumps(saved))
    refused([early, tmp_path / "other-units"], "not a finished run's results (missing args.kv_tokens)")
    saved["args"]["kv_tokens"], saved["args"]["minutes"] = "8192", "half"
    (tmp_path / "other-units" / "seed-0" / "results.json").write_text(json.dumps(saved))
    refused([early, tmp_path / "other-units"], "could not convert string to float: 'half'")
    saved["args"]["minutes"], saved["runs"][0]["ceiling"] = "0.5", "2"
    (tmp_path / "other-units" / "seed-0" / "results.json").write_text(json.dumps(saved))
    refused([early, tmp_path / "other-units"], "runs[0].ceiling not a whole number")
    assert not (tmp_path / "refused").exists()  # nothing written before every source passed
    both = subprocess.run([sys.executable, "-m", "bench.router_real", "--combine", str(early), str(late),
                           "--resimulate", str(early)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert both.returncode == 2 and "give one of them" in both.stderr
    # a new run's options are not silently dropped; "10" and "10.0" minutes are the same option
    seeds = subprocess.run([sys.executable, "-m", "bench.router_real", "--combine", str(early), str(late),
                            "--seeds", "0"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert seeds.returncode == 2 and "leave out --seeds" in seeds.stderr, seeds.stderr
    no_flag = subprocess.run([sys.executable, "-m", "bench.router_real", "--combine", str(early), str(late),
                              "--no-calibrate-after"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert no_flag.returncode == 2 and "leave out --no-calibrate-after" in no_flag.stderr, no_flag.stderr
    as_default = subprocess.run([sys.executable, "-m", "bench.router_real", "--combine", str(early), str(late),
                                 "--minutes", "3", "--calibrate-after"], capture_output=True, text=True,
                                cwd=REPO_ROOT, timeout=120)  # typed, though each is its default
    assert as_default.returncode == 2 and "leave out --minutes, --calibrate-after" in as_default.stderr, \
        as_default.stderr
    shutil.rmtree(tmp_path / "other-units")
    shutil.copytree(late, tmp_path / "other-units")
    for seed in (0, 1):
        path = tmp_path / "other-units" / f"seed-{seed}" / "results.json"
        saved = json.loads(path.read_text())
        path.write_text(json.dumps({**saved, "args": {**saved["args"], "minutes": "0.50"}}))
    combine_runs([early, tmp_path / "other-units"], tmp_path / "same-minutes")


def test_request_time_per_class_from_hand_made_requests_and_from_a_recorded_trace(tmp_path):
    """Each class's p50 request time and seconds per output token, in a run's windows; runs
    saved before the figure get it from their recorded trace when combined."""
    from bench.router_real import combine_runs
    from router.replay import class_request_figures
    from router.sim.trace import TraceRecord, TraceSession, write_trace

    def rec(cls: str, arrival: float, took: float, out: int) -> TraceRecord:
        return TraceRecord(f"{cls}-{arrival}", cls, 0, 32, out, arrival_s=arrival, finish_s=arrival + took)

    reqs = [rec("rlvr", 1.0, 20.0, 100), rec("rlvr", 2.0, 10.0, 100), rec("rlvr", 3.0, 30.0, 100),
            rec("agent", 5.0, 4.0, 8), rec("agent", 0.5, 2.0, 8),  # before the window: left out
            rec("rlhf", 20.0, 30.0, 10),  # finishes after it: left out
            TraceRecord("untimed", "rlhf", 0, 32, 10)]
    got = class_request_figures(reqs, (1.0, 40.0))
    assert got == {"agent": {"requests": 1, "p50_s": 4.0, "p90_s": 4.0, "s_per_output_token": 0.5},
                   "rlvr": {"requests": 3, "p50_s": 20.0, "p90_s": pytest.approx(28.0), "s_per_output_token": 0.2}}
    early, late = tmp_path / "early", tmp_path / "late"
    _finished_seeds(early, [("vllm-router c=4", "vllm", "cache_aware", 4, 10.0), ("misa_t c=8", "ours", "misa_t", 8, 12.0)])
    _finished_seeds(late, [("kv_horizon c=2", "ours", "kv_horizon", 2, 21.0)])
    for seed in (0, 1):  # the recorded trace of one router (window 0-30 s of _finished_run)
        (early / f"seed-{seed}" / "misa_t_c8").mkdir()
        write_trace([TraceSession(r.session_id, r.workload_class, r.session_id, None, [r]) for r in reqs],
                    early / f"seed-{seed}" / "misa_t_c8" / "recorded_trace.jsonl")
    combine_runs([early, late], tmp_path / "both")
    saved = json.loads((tmp_path / "both" / "seed-0" / "results.json").read_text())
    by_label = {r["label"]: r.get("class_requests") for r in saved["runs"]}
    assert by_label["vllm-router c=4"] is None and by_label["kv_horizon c=2"] is None
    # in that run's window (0-30 s) the rlvr request finishing at 33 s is out, the agent one of 0.5 s in
    assert by_label["misa_t c=8"]["real"]["rlvr"] == {"requests": 2, "p50_s": 15.0, "p90_s": pytest.approx(19.0),
                                                      "s_per_output_token": pytest.approx(0.15)}
    from bench.router_real import summarize_seeds

    per_seed = [(s, json.loads((tmp_path / "both" / f"seed-{s}" / "results.json").read_text())["runs"]) for s in (0, 1)]
    summary = summarize_seeds(per_seed, tmp_path / "both", 0.5)
    assert "### Request time per class (whole run" in summary
    assert "| misa_t c=8 | 3.0 | 0.375 | 15.0 | 0.150 | n/a | n/a |" in summary
