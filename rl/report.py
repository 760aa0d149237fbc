"""Run summaries people read: a table of the run's figures and its plots (paper Figure 3).

The history is the trainer's list of iteration lines (``rl.trainer``); a line without
``iteration_s`` is the step-0 evaluation (``baseline``), which enters the learning curve
but no mean of the table.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Mapping, Sequence

from rich.table import Table

SUMMARY_FIGURES = (
    ("iteration_s", "iteration time (s)", "{:.1f}"),
    ("requests_per_min", "requests/min", "{:.1f}"),
    ("samples_per_min", "samples/min", "{:.1f}"),
    ("prefill_tok_s", "prefill tok/s", "{:.0f}"),
    ("decode_tok_s", "decode tok/s", "{:.0f}"),
    ("prefix_hit_rate", "prefix hit", "{:.1%}"),
    ("sync_s", "weight sync (s)", "{:.2f}"),
    ("generation_wait_s", "generation wait (s)", "{:.1f}"),
    ("update_s", "update (s)", "{:.1f}"),
    ("loss/num_tokens", "tokens per update", "{:.0f}"),
    ("update_s_per_1k_tokens", "update s per 1k tokens", "{:.2f}"),
    ("cpu_update/job", "trainer cores in update", "{:.2f}"),
    ("cpu_update/engines", "engine cores in update", "{:.2f}"),
    ("tv_distance", "TV to target (end)", "{:.3f}"),
)
"""Figures of ``run_summary``. The update's time over the tokens it forwarded
(``update_s_per_1k_tokens``) separates a learner that ran slower (on shared CPUs: beside
the engines' rollouts) from one that had longer sequences to train; the cores the trainer's
process and the engines used during the updates (``cpu_update/...``, ``rl.trainer.update_cores``)
say where the machine went meanwhile."""


def iteration_lines(history: Sequence[Mapping]) -> list[Mapping]:
    """The lines of ``history`` that are iterations (the step-0 evaluation line is not)."""
    return [h for h in history if h.get("iteration_s") is not None]


def progress_line(m: Mapping) -> str:
    """One iteration's progress text (beside the bar, or the log line ``rl.train`` prints
    per iteration): its time, samples/min, prefix hit rate, TV distance and the mean reward
    per class of the rollouts that finished in it (``rollout_reward_by_class``, classes in
    name order), and the held-out scores where the iteration ended with an evaluation
    (``eval_scores_text``); an iteration in which no rollout finished (its step trained groups
    collected during the previous update) says so instead of the rates it does not have."""
    tv = m.get("tv_distance")
    tail = f"  TV {tv:.3f}" if tv is not None else ""
    scores = eval_scores_text(m)
    evaluated = f"  held-out {scores}" if scores else ""
    hit = m.get("prefix_hit_rate")
    if hit is None:
        return f"iter {m['iteration_s']:.0f}s  update only (no rollout finished during it){tail}{evaluated}"
    rewards = m.get("rollout_reward_by_class") or {}
    if rewards:
        tail += "  reward " + " ".join(f"{b} {v:.2f}" for b, v in sorted(rewards.items()))
    return f"iter {m['iteration_s']:.0f}s  samples/min {m['samples_per_min']:.1f}  hit {hit:.0%}{tail}{evaluated}"


def eval_scores_text(m: Mapping) -> str:
    """The held-out scores of one metrics line (its ``eval/<benchmark>/<metric>`` keys, in
    the order written) as ``"<benchmark>/<metric> 0.240, ..."``; ``""`` where it has none."""
    return ", ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in m.items()
                     if k.startswith("eval/") and isinstance(v, (int, float)) and not isinstance(v, bool))


def rollout_progress_line(p: Mapping) -> str:
    """The rollout progress of an iteration (``Trainer``'s ``on_rollout`` dict) as one line:
    groups ready of the step's (while the iteration's update runs: for the next step; none
    after the last iteration), units back since the iteration began by class (name order),
    seconds since it began."""
    by_class = ", ".join(f"{b} {n}" for b, n in sorted((p.get("units_back_by_class") or {}).items()))
    units = f"{p['units_back']} units back" + (f" ({by_class})" if by_class else "") + f", {p['elapsed_s']:.0f} s"
    if p.get("updating") and p.get("last"):
        return f"iteration {p['iteration']} updating (the last), {units}"
    if p.get("updating"):
        return (f"iteration {p['iteration']} updating: {p['groups_ready']}/{p['groups_per_step']} groups "
                f"ready for the next step, {units}")
    return f"rollouts for iteration {p['iteration']}: {p['groups_ready']}/{p['groups_per_step']} groups ready, {units}"


# Rates over an iteration's window: their run figure weighs each iteration by its length
# (total samples / total time), so a 1-second iteration that completed nothing (its step
# trained groups an earlier iteration collected) does not halve the run's samples/min.
TIME_WEIGHTED = frozenset({"requests_per_min", "samples_per_min", "prefill_tok_s", "decode_tok_s"})
# Cores used during the update: weighed by the update's length (CPU seconds over seconds).
UPDATE_WEIGHTED = frozenset({"cpu_update/job", "cpu_update/engines"})


def run_summary(history: Sequence[Mapping]) -> dict[str, float | None]:
    """Each figure over the run's iterations: the rates (``TIME_WEIGHTED``) as their
    time-weighted mean (sum of rate x ``iteration_s`` over the sum of ``iteration_s``:
    what the whole run delivered per unit of time), the cores used during the updates
    (``UPDATE_WEIGHTED``) weighed by ``update_s`` alike, the other figures as plain means, TV
    distance and mixture as the last iteration's, ``update_s_per_1k_tokens`` as the sum of
    ``update_s`` over the sum of ``loss/num_tokens`` (thousands; the iterations whose update
    forwarded tokens); under ``counts`` how many iterations each covers (those that have
    the figure).

    Returns an empty dict for a history without iterations.
    """
    its = iteration_lines(history)
    if not its:
        return {}
    out: dict = {}
    counts: dict[str, int] = {}
    for key, _, _ in SUMMARY_FIGURES:
        if key == "update_s_per_1k_tokens":
            continue
        have = [h for h in its if h.get(key) is not None]
        if not have:
            out[key] = None
        elif key == "tv_distance":
            out[key] = have[-1][key]
        elif key in TIME_WEIGHTED and (span := sum(h["iteration_s"] for h in have)) > 0:
            out[key] = sum(h[key] * h["iteration_s"] for h in have) / span
        elif key in UPDATE_WEIGHTED and (span := sum(h.get("update_s") or 0 for h in have)) > 0:
            out[key] = sum(h[key] * (h.get("update_s") or 0) for h in have) / span
        else:
            out[key] = mean(h[key] for h in have)
        counts[key] = len(have)
    # the updates that trained something: seconds over thousands of tokens forwarded, summed
    trained = [h for h in its if h.get("update_s") is not None and (h.get("loss/num_tokens") or 0) > 0]
    out["update_s_per_1k_tokens"] = (1000 * sum(h["update_s"] for h in trained)
                                     / sum(h["loss/num_tokens"] for h in trained)) if trained else None
    counts["update_s_per_1k_tokens"] = len(trained)
    out["consumed_mixture"] = its[-1].get("consumed_mixture")
    out["iterations"] = len(its)
    out["counts"] = counts
    return out


def eval_curves(history: Sequence[Mapping]) -> dict[str, list[tuple[int, float]]]:
    """Each held-out figure of the run (``eval/<benchmark>/pass@k`` and ``pass^k`` lines,
    written by ``trainer.eval_every`` from step 0), as ``{"<benchmark>/pass@k": [(iteration,
    value), ...]}`` in run order, keys sorted. pass^1 is left out: with one sample "all
    correct" and "any correct" are the same, so it is pass@1."""
    keys = sorted({k for h in history for k in h if k.startswith("eval/")
                   and ("/pass@" in k or "/pass^" in k) and not k.endswith("/pass^1")})
    return {k.removeprefix("eval/"): [(h["iteration"], h[k]) for h in history
                                      if h.get(k) is not None] for k in keys}


def summary_table(history: Sequence[Mapping], title: str = "run summary") -> Table:
    """A rich table of ``run_summary``: each figure with the number of iterations it covers
    (skipped updates have no sync time, so fewer); each held-out pass@k with its value at
    every evaluation (``eval_curves``, iteration in brackets); the consumed mixture."""
    s = run_summary(history)
    n = s.get("iterations", 0)
    t = Table(title=f"{title} ({n} iterations)")
    t.add_column("figure")
    t.add_column("over the run", justify="right")
    t.add_column("iterations", justify="right")
    for key, label, fmt in SUMMARY_FIGURES:
        v = s.get(key)
        covered = (s.get("counts") or {}).get(key, 0)
        t.add_row(label, fmt.format(v) if v is not None else "n/a",
                  ("last" if key == "tv_distance" else str(covered)) if covered else "0")
    for key, pts in eval_curves(history).items():
        if "/pass@" in key:  # the learning curve in one line: value (iteration) -> ...
            t.add_row(f"held-out {key}", " -> ".join(f"{v:.3f} ({i})" for i, v in pts),
                      str(len(pts)))
    mix = s.get("consumed_mixture") or {}
    t.add_row("consumed mixture", " / ".join(f"{b} {v:.1%}" for b, v in mix.items()) or "n/a",
              "last" if mix else "0")
    return t


def rlvr_settings(tcfg: Mapping) -> list[tuple[str, str, str]]:
    """What the rlvr training units and the in-run evaluation (``trainer.eval_every``) each
    use, side by side: rows of (setting, training, evaluation) from the ``trainer`` config.

    Both render the question with the model's chat template and grade with math-verify
    (``rl.rewards.MathVerifyReward``; ``tests/rl/test_report.py`` checks it). By design
    they differ in the split (the evaluation draws only held-out problems), in top_p
    (training samples the whole distribution, whose log-probs the learner computes; the
    evaluation keeps ``rl.eval``'s 0.95) and in samples per prompt.
    """
    doms = {name: dict(opts or {}) for name, opts in (tcfg["domains"].get("rlvr") or {}).items()}
    used = [f"{name}" + (f" levels {', '.join(map(str, o['levels']))}" if "levels" in o else "")
            for name, o in doms.items() if float(o.get("weight", 1.0)) > 0]
    ev, smp = tcfg["eval"], tcfg["sampling"]
    grader = "math-verify, boxed answer (MathVerifyReward)"
    return [
        ("prompts", " + ".join(used) + " (training split)",
         f"arithmetic levels {', '.join(map(str, ev['levels']))} (held-out split), "
         f"{ev['problems']} problems"),
        ("prompt template", "chat template, question + \\boxed{} instruction", "the same"),
        ("temperature", f"{float(smp['temperature']):g}", f"{float(ev['temperature']):g}"),
        ("top_p", f"{float(smp.get('top_p', 1.0)):g}", f"{float(ev['top_p']):g}"),
        ("max tokens", str(tcfg["max_tokens"]["rlvr"]), str(ev["max_tokens"])),
        ("samples per prompt", f"{tcfg['group_size']['rlvr']} (GRPO group)",
         f"{ev['n']} (pass@{', '.join(map(str, ev['ks']))})"),
        ("grader", grader, "the same"),
    ]


def rlvr_settings_table(tcfg: Mapping) -> Table:
    """``rlvr_settings`` as a rich table (printed with the run's summary)."""
    t = Table(title="rlvr: training and evaluation settings")
    for col in ("setting", "training", "evaluation"):
        t.add_column(col)
    for row in rlvr_settings(tcfg):
        t.add_row(*row)
    return t


def rlvr_settings_markdown(tcfg: Mapping) -> str:
    """``rlvr_settings`` as a Markdown table (README's learning section shows the default
    recipe's; a test keeps it current)."""
    lines = ["| setting | training | evaluation |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rlvr_settings(tcfg)]
    return "\n".join(lines)


TIME_PARTS = (("generation_wait_s", "generation wait"), ("update_s", "update"),
              ("sync_s", "weight sync"), ("eval_s", "evaluation"))
"""The parts of an iteration's time, stacked in ``iteration_time.png``."""


def run_figures(history: Sequence[Mapping], rho: Mapping[str, float]) -> dict:
    """The run's figures by file name, against the iteration (whole-number ticks), each
    axis with a title: ``iteration_time.png`` (each iteration's time split into generation
    wait, update, weight sync, evaluation and the rest), ``mixture.png`` (consumed mixture
    against the target), ``learning.png`` (reward per class, of all rollouts and of the trained groups, and each eval pass@k
    with step 0 when the history has it). Empty for a history without iterations; the
    caller closes the figures (``plot_run`` saves and closes them).
    """
    its_lines = iteration_lines(history)
    if not its_lines:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    its = [h["iteration"] for h in its_lines]
    figs: dict = {}

    def finish(ax, title: str, ylabel: str) -> None:
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    bottom = [0.0] * len(its)
    for i, (key, label) in enumerate(TIME_PARTS):
        part = [float(h.get(key) or 0.0) for h in its_lines]
        ax.bar(its, part, bottom=bottom, color=f"C{i}", label=label)
        bottom = [b + v for b, v in zip(bottom, part)]
    # iteration_s excludes the evaluation that follows the step (eval_s), so it is added
    rest = [max(float(h["iteration_s"]) + float(h.get("eval_s") or 0.0) - b, 0.0)
            for h, b in zip(its_lines, bottom)]
    ax.bar(its, rest, bottom=bottom, color="0.75", label="other")
    ax.legend(fontsize=7)
    finish(ax, "Iteration time and its parts", "seconds")
    figs["iteration_time.png"] = fig

    total = sum(rho.values())
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (b, w) in enumerate(rho.items()):
        color = f"C{i}"
        ax.plot(its, [(h.get("consumed_mixture") or {}).get(b, 0.0) for h in its_lines],
                color=color, marker="o", label=f"{b} consumed")
        ax.axhline(w / total, color=color, linestyle=":", label=f"{b} target")
    ax.legend(fontsize=7, ncol=2)
    finish(ax, "Consumed mixture against the target", "share of completed units")
    figs["mixture.png"] = fig

    fig, (ax_r, ax_e) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, b in enumerate(rho):
        for key, style, label in (("rollout_reward_by_class", "-", f"{b}, all rollouts"),
                                  ("reward_by_class", ":", f"{b}, trained groups")):
            pts = [(h["iteration"], h[key][b]) for h in its_lines if b in (h.get(key) or {})]
            if pts:
                ax_r.plot(*zip(*pts), color=f"C{i}", linestyle=style, marker="o", label=label)
    ax_r.legend(fontsize=7)
    finish(ax_r, "Reward per class", "mean reward")
    curves = eval_curves(history)
    for i, (k, pts) in enumerate(curves.items()):
        ax_e.plot(*zip(*pts), color=f"C{i}", marker="o", label=k)
    if curves:
        ax_e.legend(fontsize=7)
    else:
        ax_e.text(0.5, 0.5, "no evaluation (trainer.eval_every=0)", ha="center",
                  transform=ax_e.transAxes)
    finish(ax_e, "Held-out evaluation", "pass@k")
    figs["learning.png"] = fig
    for fig in figs.values():
        fig.tight_layout()
    return figs


def plot_run(history: Sequence[Mapping], rho: Mapping[str, float], out_dir: Path) -> list[Path]:
    """Save ``run_figures`` into ``out_dir`` (made when needed); returns their paths (none
    for a history without iterations)."""
    figs = run_figures(history, rho)  # (selects the Agg backend before pyplot is used)
    import matplotlib.pyplot as plt

    if figs:
        out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figs.items():
        paths.append(out_dir / name)
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths
