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
    rows = dict(zip(table.columns[0].cells, table.columns[1].cells))
    assert rows["held-out arithmetic/pass@1"] == "0.200 (0) -> 0.350 (3)"
    assert [c.header for c in table.columns] == ["figure", "over the run", "iterations"]


def test_run_rates_weigh_iterations_by_their_length():
    # a 58 s iteration at 30 samples/min, then a 2 s one that completed nothing (its step
    # trained groups the first collected): the run delivered 29 samples in 60 s
    its = [{"iteration": 1, "iteration_s": 58.0, "samples_per_min": 30.0, "decode_tok_s": 100.0},
           {"iteration": 2, "iteration_s": 2.0, "samples_per_min": 0.0, "decode_tok_s": 0.0}]
    s = run_summary(its)
    assert abs(s["samples_per_min"] - 29.0) < 1e-9  # not (30 + 0) / 2
    assert abs(s["decode_tok_s"] - 100.0 * 58 / 60) < 1e-9
    assert s["iteration_s"] == 30.0  # plain mean


def test_update_seconds_per_1k_tokens_is_the_ratio_of_sums_over_updates_that_trained():
    # 30 s for 2,000 tokens and 10 s for 6,000: 40 s / 8k = 5 s per 1k (not the mean of 15 and 1.67);
    # the skipped update (no tokens) and a line written before the learner counted tokens are left out
    its = [{"iteration": 1, "iteration_s": 40.0, "update_s": 30.0, "loss/num_tokens": 2000.0},
           {"iteration": 2, "iteration_s": 15.0, "update_s": 10.0, "loss/num_tokens": 6000.0},
           {"iteration": 3, "iteration_s": 1.0, "update_s": 0.5, "skipped_update": True},
           {"iteration": 4, "iteration_s": 9.0, "update_s": 8.0, "loss/num_tokens": 0.0}]
    s = run_summary(its)
    assert s["update_s_per_1k_tokens"] == 5.0 and s["counts"]["update_s_per_1k_tokens"] == 2
    assert s["update_s"] == 12.125 and s["loss/num_tokens"] == 8000.0 / 3
    rows = dict(zip(summary_table(its).columns[0].cells, summary_table(its).columns[1].cells))
    assert rows["update s per 1k tokens"] == "5.00" and rows["tokens per update"] == "2667"
    assert run_summary([{"iteration": 1, "iteration_s": 3.0, "update_s": 2.0}])["update_s_per_1k_tokens"] is None


def test_cores_used_during_the_updates_are_weighed_by_the_updates_length():
    # 1.5 cores for 30 s and 0.5 for 10 s: 50 CPU seconds over 40 s
    its = [{"iteration": 1, "iteration_s": 40.0, "update_s": 30.0, "cpu_update/engines": 1.5},
           {"iteration": 2, "iteration_s": 15.0, "update_s": 10.0, "cpu_update/engines": 0.5},
           {"iteration": 3, "iteration_s": 1.0, "update_s": 0.5}]  # skipped update: no reading
    s = run_summary(its)
    assert s["cpu_update/engines"] == 1.25 and s["counts"]["cpu_update/engines"] == 2
    assert s["cpu_update/job"] is None


def test_plots_include_the_learning_curve_from_step_0(tmp_path):
    paths = plot_run(_history(), RHO, tmp_path)
    assert sorted(p.name for p in paths) == ["iteration_time.png", "learning.png", "mixture.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert plot_run([_history()[0]], RHO, tmp_path / "none") == []


def test_every_figure_has_titles_whole_iteration_ticks_and_the_time_parts(tmp_path):
    import matplotlib.pyplot as plt

    from rl.report import TIME_PARTS, run_figures

    history = _history()
    history.append({**history[-1], "iteration": 12})  # a long run: ticks must stay whole
    figs = run_figures(history, RHO)
    try:
        assert sorted(figs) == ["iteration_time.png", "learning.png", "mixture.png"]
        for name, fig in figs.items():
            fig.canvas.draw()
            for ax in fig.axes:
                assert ax.get_title(), name
                assert ax.get_xlabel() == "iteration", name
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
        (ax,) = figs["iteration_time.png"].axes
        labels = ax.get_legend_handles_labels()[1]
        assert labels == [label for _, label in TIME_PARTS] + ["other"]
        assert labels[:4] == ["generation wait", "update", "weight sync", "evaluation"]
        # iteration 3: 30 s plus its 2 s evaluation = 4 + 3 + 1.5 + 2 + 21.5 (other)
        heights = [c.patches[2].get_height() for c in ax.containers]
        assert heights == [4.0, 3.0, 1.5, 2.0, 21.5]
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_the_eval_panel_leaves_out_pass_hat_1_which_is_pass_at_1(tmp_path):
    import matplotlib.pyplot as plt

    from rl.report import run_figures

    history = _history()
    for h in history:
        if "eval/arithmetic/pass@1" in h:
            h.update({"eval/arithmetic/pass^1": h["eval/arithmetic/pass@1"],
                      "eval/arithmetic/pass@2": 0.5, "eval/arithmetic/pass^2": 0.1})
    figs = run_figures(history, RHO)
    try:
        labels = figs["learning.png"].axes[1].get_legend_handles_labels()[1]
        assert labels == ["arithmetic/pass@1", "arithmetic/pass@2", "arithmetic/pass^2"]
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_summary_table_text_names_the_iteration_count_of_each_mean():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(summary_table(_history()))
    text = console.export_text()
    assert "(3 iterations)" in text and "over the run" in text

    def last_cell(label):
        line = next(line for line in text.splitlines() if label in line)
        return [c.strip() for c in line.split("│") if c.strip()][-1]
    assert last_cell("weight sync") == "2"  # the skipped update has no sync: 2 of 3
    assert last_cell("iteration time") == "3"


def test_learning_curve_reads_the_eval_points_and_the_rlvr_units_trained_per_step(tmp_path):
    import json

    from bench.learning_curve import curve, step_table

    lines = _history()
    for h, units, groups in zip(lines[1:], (8, 0, 16), (1, 0, 2)):
        h["trained_units"] = units + 4
        h["trained_units_by_class"] = {"rlhf": 4, **({"rlvr": units} if units else {})}
        h["trained_groups_by_class"] = {"rlhf": 1, **({"rlvr": groups} if groups else {})}
        h["trained_units_by_class"]["agent"] = 4 * h["iteration"]
        h["rollout_reward_by_class"] = {"rlvr": 0.1 * h["iteration"], "agent": 0.25 * (h["iteration"] > 1)}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in lines))
    c = curve(tmp_path, "eval/arithmetic/pass@1")
    assert c["points"] == [(0, 0.2), (3, 0.35)] and (c["start"], c["end"], c["end_step"]) == (0.2, 0.35, 3)
    assert [s["rlvr_units"] for s in c["steps"]] == [8, 0, 16]
    assert [s["rlvr_groups"] for s in c["steps"]] == [1, 0, 2]
    assert [s["eval"] for s in c["steps"]] == [None, None, 0.35]
    assert c["rlvr_trained"] == 24
    # the reward of all rollouts: iteration 1 against iterations 2 and 3
    assert [s["rlvr_rollout_reward"] for s in c["steps"]] == [0.1, 0.2, 0.1 * 3]
    first, second = c["rlvr_rollout_halves"]
    assert abs(first - 0.1) < 1e-9 and abs(second - 0.25) < 1e-9
    # the agent class: its rollouts' reward, halves the same way, and its units trained
    assert [s["agent_rollout_reward"] for s in c["steps"]] == [0.0, 0.25, 0.25]
    assert c["agent_rollout_halves"] == (0.0, 0.25) and c["agent_trained"] == 4 + 8 + 12
    assert step_table("seed 0", c).row_count == 3
    assert c["iterations_planned"] is None and not c["stopped"]  # no config.yaml: nothing to compare
    (tmp_path / "config.yaml").write_text("trainer:\n  iterations: 8\n")
    c = curve(tmp_path, "eval/arithmetic/pass@1")
    assert (c["iterations_done"], c["iterations_planned"], c["stopped"]) == (3, 8, True)
    (tmp_path / "config.yaml").write_text("trainer:\n  iterations: 3\n")
    assert not curve(tmp_path, "eval/arithmetic/pass@1")["stopped"]
    (tmp_path / "config.yaml").unlink()
    # a run written before the per-class counts were logged: blanks, not zeros
    old = [{k: v for k, v in h.items() if not k.startswith("trained_")} for h in lines]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in old))
    c = curve(tmp_path, "eval/arithmetic/pass@1")
    assert c["rlvr_trained"] is None and {s["rlvr_units"] for s in c["steps"]} == {None}


def test_the_progress_line_says_when_an_iteration_only_updated():
    from rl.report import progress_line

    full = {"iteration_s": 180.4, "samples_per_min": 29.44, "prefix_hit_rate": 0.75, "tv_distance": 0.0721}
    assert progress_line(full) == "iter 180s  samples/min 29.4  hit 75%  TV 0.072"
    # no rollout finished: no rates, not an empty line
    update_only = {"iteration_s": 44.2, "samples_per_min": 0.0, "prefix_hit_rate": None, "tv_distance": 0.058}
    assert progress_line(update_only) == "iter 44s  update only (no rollout finished during it)  TV 0.058"
    # the mean reward per class of the rollouts that finished in the iteration, in class order
    rewarded = dict(full, rollout_reward_by_class={"rlvr": 0.25, "agent": 0.875})
    assert progress_line(rewarded) == "iter 180s  samples/min 29.4  hit 75%  TV 0.072  reward agent 0.88 rlvr 0.25"


def test_the_progress_line_gives_the_held_out_scores_of_an_iteration_that_ended_with_an_evaluation():
    from rl.report import eval_scores_text, progress_line

    evaluated = {"iteration_s": 96.0, "samples_per_min": 0.0, "prefix_hit_rate": None, "tv_distance": 0.015,
                 "eval/arithmetic/pass@1": 0.26, "eval/arithmetic/pass@2": 0.4375, "eval_s": 61.0}
    assert eval_scores_text(evaluated) == "arithmetic/pass@1 0.260, arithmetic/pass@2 0.438"
    assert progress_line(evaluated) == ("iter 96s  update only (no rollout finished during it)  TV 0.015"
                                        "  held-out arithmetic/pass@1 0.260, arithmetic/pass@2 0.438")
    rolled = dict(evaluated, samples_per_min=35.8, prefix_hit_rate=0.71, rollout_reward_by_class={"rlvr": 0.16})
    assert progress_line(rolled).endswith("reward rlvr 0.16  held-out arithmetic/pass@1 0.260, arithmetic/pass@2 0.438")
    assert eval_scores_text({"iteration_s": 1.0}) == ""


def test_the_training_bar_shows_the_rollout_line_in_brackets_as_typed():
    # a fresh user's terminal showed "GRPO ━━ 0/1" and never the rollouts: rich read
    # "[rollouts for iteration 1: ...]" as a style tag and dropped it
    import io

    from rich.console import Console

    from rl.report import rollout_progress_line
    from rl.train import iteration_progress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    progress = iteration_progress(console)
    line = rollout_progress_line({"iteration": 1, "groups_ready": 0, "groups_per_step": 6, "units_back": 3,
                                  "units_back_by_class": {"agent": 1, "rlhf": 2}, "elapsed_s": 31.0})
    bar = progress.add_task(f"  [{line}]", total=1)
    progress.refresh()
    console.print(progress.get_renderable())
    assert f"[{line}]" in out.getvalue() and "groups ready" in line
    assert bar == 0 and iteration_progress(Console(file=io.StringIO())).disable  # off into a log file
