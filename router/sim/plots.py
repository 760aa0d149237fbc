"""Plots of a simulator experiment (matplotlib, Agg): caps, hit rate and consumed mixture over time.

Like the paper's Figure 4 (admission caps under prefix-cache pressure) and Figure 3
(cumulative consumed mixture against the trainer's target).
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

CLASS_COLORS = {"agent": "tab:blue", "rlvr": "tab:orange", "rlhf": "tab:green"}


def plot_caps(timeline: list[dict], path: str, title: str) -> None:
    """Every cap a policy reports (``timeline[i]["caps"]``) over simulated time, and its hit rate."""
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    keys = sorted({k for p in timeline for k in p["caps"]})
    t = [p["t_s"] / 60 for p in timeline]
    for k in keys:
        ax.step(t, [p["caps"].get(k) for p in timeline], where="post", label=k, lw=1)
    ax.set_ylabel("cap (sessions)")
    ax.set_title(title)
    if keys:
        ax.legend(fontsize=6, ncol=3)
    else:  # a policy that admits by other means (progress_ttl: the KV its programs own) reports none
        ax.text(0.5, 0.5, "this policy reports no caps", transform=ax.transAxes, ha="center", va="center")
        ax.set_yticks([])
    ax2.plot(t, [p["hit_rate"] for p in timeline], lw=1, color="k")
    ax2.set_ylabel("prefix hit rate")
    ax2.set_xlabel("simulated time (min)")
    ax2.set_ylim(0, 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_hit_rate(timelines: dict[str, list[dict]], path: str, title: str) -> None:
    """Prefix hit rate per timeline period, one line per run."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for label, tl in timelines.items():
        ax.plot([p["t_s"] / 60 for p in tl], [p["hit_rate"] for p in tl], lw=1, label=label)
    ax.set_xlabel("simulated time (min)")
    ax.set_ylabel("prefix hit rate")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_mixture(timelines: dict[str, list[dict]], target: dict[str, float], path: str, title: str) -> None:
    """Cumulative consumed mixture per class (solid / dashed per run) and the target (dotted)."""
    fig, ax = plt.subplots(figsize=(9, 4))
    total = sum(target.values())
    styles = ["-", "--", "-.", ":"]
    for i, (label, tl) in enumerate(timelines.items()):
        for b, color in CLASS_COLORS.items():
            pts = [(p["t_s"] / 60, p["mixture"].get(b)) for p in tl if p["mixture"]]
            if pts:
                ax.plot(*zip(*pts), styles[i % len(styles)], color=color, lw=1, label=f"{label} {b}")
    for b, color in CLASS_COLORS.items():
        if b in target:
            ax.axhline(target[b] / total, color=color, ls=":", lw=0.8)
    ax.set_xlabel("simulated time (min)")
    ax.set_ylabel("consumed share")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


RATIO_TICKS = (0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100, 200)


def ratio_ticks(ratios: list[float], limit: float) -> list[float]:
    """Labelled ticks for a log axis of ratios: those of :data:`RATIO_TICKS` within the
    ratios' range and ``limit`` (NaN and inf left out), widened by 1.5x each way; a range between two
    powers of ten still gets labels."""
    values = [r for r in ratios if math.isfinite(r)] + [limit]
    return [t for t in RATIO_TICKS if min(values) / 1.5 <= t <= max(values) * 1.5]


def factor_labels(factors: list[float], min_gap: float = 0.14) -> list[str]:
    """Tick labels for sorted ceiling factors on a log2 axis: ``"1.12x"``, blank for a factor
    closer than ``min_gap`` (in log2 units, about 10% apart) to the last labelled one, so close
    sweep points (16 and 18 over 16) keep their ticks without overlapping labels (drawn upright:
    a label's width is then its font's height); 1x is always labelled (its left neighbour gives
    way)."""
    labels: list[str] = []
    last = None  # index of the last labelled factor
    for i, f in enumerate(factors):
        near = last is not None and math.log2(f) - math.log2(factors[last]) < min_gap
        if near and f == 1:
            labels[last], near = "", False
        labels.append("" if near else f"{f:.3g}x")
        if not near:
            last = i
    return labels


def plot_ceilings(points: dict[str, list[tuple[float, float, float, float]]], limit: float, path: str,
                  title: str) -> None:
    """``experiment=ceilings``: per policy, samples/min against the baseline (%, ± std over
    seeds) and the largest class p50 completion ratio, over the ceiling as a multiple of the
    baseline's; the ratio's limit dashed.

    Args:
        points: policy -> ``(ceiling factor, samples/min change %, its std %, largest p50 ratio)``.
    """
    entries = len(points) + 1 + sum(any(math.isinf(p[3]) for p in pts) for pts in points.values())
    rows = math.ceil(entries / 2)  # one legend under both panels, two columns: long option labels
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.4 + 0.22 * rows))
    for policy, pts in points.items():
        pts = sorted(pts)
        x = [p[0] for p in pts]
        ax.errorbar(x, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=policy)
        ax2.plot(x, [p[3] if math.isfinite(p[3]) else math.nan for p in pts], marker="o", label=policy)
        starved = [p[0] for p in pts if math.isinf(p[3])]
        if starved:  # a class the run did not complete: marked at the top, off the scale
            ax2.plot(starved, [max(ratio_ticks([p[3] for p in pts], limit))] * len(starved), "x", color="r",
                     label=f"{policy}: a class none completed")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("ceiling / the baseline's best ceiling")
    ax.set_ylabel("samples/min vs baseline (%)")
    ax2.axhline(limit, color="k", lw=0.8, ls="--", label=f"{limit:g}x")
    ax2.set_xlabel("ceiling / the baseline's best ceiling")
    ax2.set_ylabel("largest class p50 completion / baseline's")
    ax2.set_yscale("log")
    ratios = [p[3] for pts in points.values() for p in pts]
    ax2.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ratio_ticks(ratios, limit)))
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax2.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    factors = sorted({p[0] for pts in points.values() for p in pts})
    for a in (ax, ax2):
        a.set_xscale("log", base=2)  # 1x, 1.25x, 1.5x apart, 2x and 4x in reach
        a.set_xticks(factors, factor_labels(factors), rotation=90, fontsize=8)
        a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    fig.legend(*ax2.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.22 * rows / (4.4 + 0.22 * rows) + 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
