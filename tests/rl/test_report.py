"""Run summary and plots (rl.report) on a hand-made history."""

from rl.report import plot_run, run_summary, summary_table

RHO = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}


def _history():
    base = {"iteration": 0, "policy_version": 0, "baseline": True, "eval/arithmetic/pass@1": 0.2}
    lines = [base]
    for i, sync in ((1, 0.5), (2, None), (3, 1.5)):  # iteration 2: a skipped update, no sync
        lines.append({"iteration": i, "iteration_s": 10.0 * i, "generation_wait_s": 4.0,
                      "update_s": 3.0, "sync_s": sync, "eval_s": 2.0 if i == 3 else None,
                      "tv_distance": 0.1 / i, "consumed_mixture": {"agent": 0.5, "rlvr": 0.3, "rlhf": 0.2},
                      "reward_by_class": {"rlvr": 0.1 * i, "rlhf": 0.4},
                      **({"eval/arithmetic/pass@1": 0.35} if i == 3 else {})})
    return lines


def test_summary_means_cover_iterations_only_and_say_how_many():
    s = run_summary(_history())
    assert s["iterations"] == 3  # the step-0 evaluation line is no iteration
    assert s["iteration_s"] == 20.0  # (10 + 20 + 30) / 3
    assert s["sync_s"] == 1.0 and s["counts"]["sync_s"] == 2  # the skipped update has none
    assert s["tv_distance"] == 0.1 / 3  # the last one
    table = summary_table(_history())
    assert table.title.endswith("(3 iterations)")
    assert [c.header for c in table.columns] == ["figure", "mean over iterations", "iterations"]


def test_plots_include_the_learning_curve_from_step_0(tmp_path):
    paths = plot_run(_history(), RHO, tmp_path)
    assert sorted(p.name for p in paths) == ["iteration_time.png", "learning.png", "mixture.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert plot_run([_history()[0]], RHO, tmp_path / "none") == []
