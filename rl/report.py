"""Run summaries people read: a table of the run's figures and its plots (paper Figure 3)."""

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
    ("tv_distance", "TV to target (end)", "{:.3f}"),
)


def run_summary(history: Sequence[Mapping]) -> dict[str, float | None]:
    """Means over iterations of each figure (TV distance and mixture: the last iteration's).

    Returns an empty dict for an empty history.
    """
    if not history:
        return {}
    out: dict[str, float | None] = {}
    for key, _, _ in SUMMARY_FIGURES:
        vals = [h[key] for h in history if h.get(key) is not None]
        out[key] = (vals[-1] if key == "tv_distance" else mean(vals)) if vals else None
    out["consumed_mixture"] = history[-1].get("consumed_mixture")
    out["iterations"] = len(history)
    return out


def summary_table(history: Sequence[Mapping], title: str = "run summary") -> Table:
    """A rich table of ``run_summary``; also lists the consumed mixture."""
    s = run_summary(history)
    t = Table(title=f"{title} ({s.get('iterations', 0)} iterations)")
    t.add_column("figure")
    t.add_column("mean over iterations", justify="right")
    for key, label, fmt in SUMMARY_FIGURES:
        v = s.get(key)
        t.add_row(label, fmt.format(v) if v is not None else "n/a")
    mix = s.get("consumed_mixture") or {}
    t.add_row("consumed mixture", " / ".join(f"{b} {v:.1%}" for b, v in mix.items()) or "n/a")
    return t


def plot_run(history: Sequence[Mapping], rho: Mapping[str, float], out_dir: Path) -> list[Path]:
    """Iteration time, and consumed mixture against the target, over iterations.

    Writes ``iteration_time.png`` and ``mixture.png`` to ``out_dir``; returns their paths
    (none for an empty history).
    """
    if not history:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    its = [h["iteration"] for h in history]
    paths = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(its, [h["iteration_s"] for h in history], marker="o")
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration time (s)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / "iteration_time.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    total = sum(rho.values())
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (b, w) in enumerate(rho.items()):
        color = f"C{i}"
        ax.plot(its, [(h.get("consumed_mixture") or {}).get(b, 0.0) for h in history],
                color=color, marker="o", label=f"{b} consumed")
        ax.axhline(w / total, color=color, linestyle=":", label=f"{b} target")
    ax.set_xlabel("iteration")
    ax.set_ylabel("share of completed units")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / "mixture.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
