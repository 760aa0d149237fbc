"""``experiment=ceilings``: the policies against the sweep-tuned baseline as the trainer's
ceiling moves, and the per-class completion ratios its table and headlines are made of."""

from __future__ import annotations

import json
import math
import os

import pytest

from router.sim.experiments import ceilings_headline, ceilings_markdown, ceilings_points, completion_ratios
from router.sim.plots import factor_labels, plot_ceilings, ratio_ticks
from tests.sim.test_cli import run_cli


def _row(policy: str, ceiling: int, spm: float, p50: dict[str, float], spm_std: float = 0.0) -> dict:
    return {"policy": policy, "ceiling": ceiling,
            "samples_per_min": {"mean": spm, "std": spm_std},
            "output_tokens_per_min": {"mean": 1000 * spm, "std": 0.0},
            "tv_distance": {"mean": 0.004, "std": 0.0}, "prefix_hit_rate": {"mean": 0.9, "std": 0.0},
            "completion_s": {b: {"p50": v, "p95": 2 * v} for b, v in p50.items()}}


AGG = {
    "vllm_router@128": _row("vllm_router", 128, 5.0, {"rlhf": 100.0, "agent": 400.0, "rlvr": 300.0}),
    "kv_horizon@160": _row("kv_horizon", 160, 5.5, {"agent": 480.0, "rlvr": 330.0, "rlhf": 150.0}, 0.5),
    "kv_horizon@512": _row("kv_horizon", 512, 6.0, {"agent": 1600.0, "rlvr": 900.0}),  # no rlhf completed
}


def test_completion_ratios_are_per_class_p50_over_the_baselines_in_the_papers_order():
    r = completion_ratios(AGG["kv_horizon@160"], AGG["vllm_router@128"])
    assert list(r) == ["agent", "rlvr", "rlhf"]
    assert r == pytest.approx({"agent": 1.2, "rlvr": 1.1, "rlhf": 1.5})
    # a class the baseline completed and the run did not is starved: it fails the goal
    assert completion_ratios(AGG["kv_horizon@512"], AGG["vllm_router@128"]) == pytest.approx(
        {"agent": 4.0, "rlvr": 3.0, "rlhf": math.inf})


def test_the_headline_names_the_factor_the_change_and_the_largest_ratio_against_2x():
    h = ceilings_headline(AGG, "kv_horizon@160", 1.25, "vllm_router@128")
    assert h == ("kv_horizon@160 (1.25x) vs vllm_router@128 (sweep-tuned): +10.0% ± 10.0 samples/min, "
                 "largest p50 completion ratio 1.50x (rlhf; within 2x)")
    h = ceilings_headline(AGG, "kv_horizon@512", 4, "vllm_router@128")
    assert h.endswith("+20.0% ± 0.0 samples/min, largest p50 completion ratio none completed (rlhf; over 2x)")
    starved = {**AGG, "kv_horizon@140": _row("kv_horizon", 140, 5.2, {"agent": 400.0, "rlvr": 300.0})}
    assert ceilings_headline(starved, "kv_horizon@140", 140 / 128, "vllm_router@128").startswith(
        "kv_horizon@140 (1.09x) vs")  # the factor in three digits, as run
    assert "(rlhf; over 2x)" in ceilings_headline(starved, "kv_horizon@140", 1.09, "vllm_router@128")
    assert ceilings_headline(AGG, "misa_t@128", 1, "vllm_router@128").endswith(": not measured")


def test_the_table_and_the_plot_points_hold_every_run():
    rows = [("kv_horizon@160", 1.25), ("kv_horizon@512", 4.0)]
    md = ceilings_markdown(AGG, "vllm_router@128", rows, "t")
    assert "| vllm_router@128 | 128 (1x) | 5.00 | +0.0% ± 0.0 | +0.0% | 1.00x / 1.00x / 1.00x | 0.40 | 90.0% |" in md
    assert "| kv_horizon@512 | 512 (4x) | 6.00 | +20.0% ± 0.0 | +20.0% | 4.00x / 3.00x / none completed |" in md
    pts = ceilings_points(AGG, "vllm_router@128", rows)
    assert list(pts) == ["kv_horizon"]
    (f1, d1, s1, w1), (f2, d2, _, w2) = pts["kv_horizon"]
    assert (f1, f2) == (1.25, 4.0) and d1 == pytest.approx(10.0) and s1 == pytest.approx(10.0)
    assert w1 == pytest.approx(1.5) and math.isinf(w2)
    empty_base = {"b": _row("b", 1, 1.0, {}), "x": _row("x", 1, 1.0, {"agent": 1.0})}  # nothing to compare with
    assert math.isnan(ceilings_points(empty_base, "b", [("x", 1)])["x"][0][3])


def test_close_ceilings_keep_their_ticks_but_not_overlapping_labels():
    # the real-engine sweep's 12, 14, 16, 18 over 16: 0.875x and 1.12x sit 0.19 log2 units from 1x
    assert factor_labels([0.75, 0.875, 1, 1.125, 1.25, 6]) == ["0.75x", "0.875x", "1x", "1.12x", "1.25x", "6x"]
    assert factor_labels([0.9, 1, 1.05, 1.3]) == ["0.9x", "1x", "", "1.3x"]
    assert factor_labels([0.95, 1]) == ["", "1x"]  # 1x is always labelled
    assert factor_labels([1]) == ["1x"] and factor_labels([]) == []


def test_the_ratio_axis_is_labelled_between_two_powers_of_ten(tmp_path):
    # a fresh user's plot had ratios 1.26x-6.07x and a log axis with no labelled tick
    assert ratio_ticks([1.26, 1.41, 6.07], 2.0) == [1, 1.25, 1.5, 2, 3, 5]
    assert ratio_ticks([float("nan"), 30.0], 2.0) == [1.5, 2, 3, 5, 10, 20]
    assert ratio_ticks([1.2, math.inf], 2.0) == [1, 1.25, 1.5, 2, 3]  # a starved class: off the scale
    assert ratio_ticks([0.3, 0.46, 1.0], 2.0) == [0.2, 0.3, 0.5, 0.75, 1, 1.25, 1.5, 2, 3]  # a whole run's 0.3x
    plot_ceilings({"kv_horizon": [(1, 2.4, 0.0, 1.26), (1.33, 10.7, 0.0, 1.41), (4, 29.9, 0.0, math.inf)]}, 2.0,
                  str(tmp_path / "c.png"), "t")
    assert (tmp_path / "c.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_experiment_sweeps_the_baseline_runs_each_factor_and_ends_with_one_headline_each(tmp_path):
    # 2 sweep runs + 2 policy runs at scale 0.05: seconds on an idle core
    p = run_cli("experiment=ceilings", "seeds=[0]", "scale=0.05", "workers=1", "sim.sweep_ceilings=[64,128]",
                "ceilings.factors=[1,2]", "ceilings.policies=[kv-horizon]", tmp_path=tmp_path, timeout_s=900)
    assert p.returncode == 0, p.stderr
    heads = p.stdout.strip().splitlines()[-2:]
    assert heads[0].startswith("kv_horizon@") and " (1x) vs vllm_router@" in heads[0]
    assert " (2x) vs vllm_router@" in heads[1] and "largest p50 completion ratio" in heads[1]
    assert all(p.stdout.count(h) == 1 for h in heads)
    out = next(line for line in p.stdout.splitlines() if line.startswith("results: ")).removeprefix("results: ")
    results = json.load(open(f"{out}/results.json"))
    base = results["baseline"]
    assert base.startswith("vllm_router@") and sorted(results["ceiling_factors"].values()) == [1.0, 2.0]
    ceilings = {r["label"]: r["ceiling"] for r in results["runs"]}
    assert {ceilings[lb] for lb in results["ceiling_factors"]} == {ceilings[base], 2 * ceilings[base]}
    assert "| p50 completion vs baseline (agent / rlvr / rlhf) |" in p.stdout
    assert f"(2x) vs {base} (sweep-tuned)" in heads[1]  # the factor after rounding to whole units
    assert os.path.getsize(f"{out}/ceilings.png") > 10_000


@pytest.mark.slow
@pytest.mark.parametrize("override, expected", [
    ("ceilings.policies=[bogus]", "ceilings.policies: unknown router policy 'bogus'"),
    ("ceilings.baseline=nope", "ceilings.baseline: unknown router policy 'nope'"),
    ("ceilings.factors=[0]", "ceilings.factors=[0] is invalid: give a non-empty list of factors in (0, 100]"),
    ("ceilings.factors=[inf]", "ceilings.factors=[inf] is invalid"),
    ("+policy_params.kv_horizon.backfil_share=0.1", "router policy 'kv_horizon': unknown option(s) 'backfil_share' "
     "(did you mean 'backfill_share'?)"),
])
def test_a_bad_ceilings_option_is_refused_before_any_run(tmp_path, override, expected):
    p = run_cli("experiment=ceilings", "seeds=[0]", "scale=0.05", "workers=1", override, tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "runs done" not in p.stderr
    assert not any(tmp_path.iterdir())  # nothing simulated, no run folder left


@pytest.mark.slow
def test_the_baselines_own_policy_at_its_swept_ceiling_reuses_that_run(tmp_path):
    p = run_cli("experiment=ceilings", "seeds=[0]", "scale=0.05", "workers=1", "sim.sweep_ceilings=[64,128]",
                "ceilings.factors=[1]", "ceilings.policies=[vllm_router]", tmp_path=tmp_path, timeout_s=600)
    assert p.returncode == 0, p.stderr
    out = next(line for line in p.stdout.splitlines() if line.startswith("results: ")).removeprefix("results: ")
    runs = [json.loads(line)["label"] for line in open(f"{out}/runs.jsonl")]
    assert len(runs) == 2 and len(set(runs)) == 2  # the sweep's two runs, none repeated (its seeds not doubled)
    assert p.stdout.strip().splitlines()[-1].endswith("+0.0% ± 0.0 samples/min, largest p50 completion ratio "
                                                      "1.00x (agent; within 2x)")


def test_a_caps_plot_of_a_policy_without_caps_says_so(tmp_path, monkeypatch):
    import matplotlib.axes

    from router.sim.plots import plot_caps

    said = []
    text = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, *a, **k: said.append(a[2]) or text(self, *a, **k))
    timeline = [{"t_s": 60.0 * i, "caps": {}, "hit_rate": 0.5} for i in range(3)]
    plot_caps(timeline, str(tmp_path / "caps.png"), "progress_ttl caps")
    assert said == ["this policy reports no caps"] and (tmp_path / "caps.png").stat().st_size > 5_000
    plot_caps([{**p, "caps": {"cap.a": 3}} for p in timeline], str(tmp_path / "caps2.png"), "misa_t caps")
    assert said == ["this policy reports no caps"]  # a policy with caps draws them, no note
