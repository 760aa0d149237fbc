"""``python -m rl.compare recipe=mixed_step routers=[vllm,misa-t] seed=0``: router A/B on the main job.

Runs ``python -m rl.train`` once per router, one after the other, with the same recipe,
seed and data (each in ``<run_dir>/<router>/``), then prints the paper's Table 4 for
them: iteration time, requests/min, samples/min, prefill and decode tok/s as changes
relative to the first router, prefix hit rate and the consumed mixture. The table is
also written to ``<run_dir>/comparison.md`` and a plot of the consumed mixture over
iterations per router to ``<run_dir>/mixture.png``.

``seed=[3,4,5]`` (a list, even of one seed) runs every router on each seed, seed by seed
(the routers side by side, so a drift in the machine's speed over the hours falls on all of
them), each seed in ``<run_dir>/seed-<n>/`` as above, then writes ``summary.md`` / ``summary.json`` /
``summary.png``: each change against the first router as mean ± spread (sample standard
deviation) over the seeds with its per-seed values, the last iteration's TV distance and
the first iteration's time per router. A router named twice (``routers=[vllm,vllm]``) runs
twice, the repeat labelled ``vllm-2`` (its folder too): an A/A control of how far two runs
of one router differ on the machine. ``train_overrides`` may not set what ``rl.compare`` sets
per run (``recipe``, ``router``, ``seed``, ``run_dir``).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig
from rich.table import Table

from common.config import (REPO_ROOT, ConfigError, RunFailedError, compose, group_options, hydra_entry, is_seed,
                           nearest_options)
from common.console import output_console
from rl.report import SUMMARY_FIGURES, run_summary

PER_RUN_KEYS = {"recipe": "give it to rl.compare itself (recipe=...)",
                "router": "list the routers in routers=[...]",
                "seed": "give the seeds as seed=[...]",
                "run_dir": "give rl.compare's run_dir=... (each run gets a folder in it)"}
"""Keys ``rl.compare`` sets for each ``rl.train`` run, with what to do instead."""

OWN_KEYS = ("routers", "seed", "train_overrides", "run_dir", "recipe")
"""What ``rl.compare``'s own command line may set; every other key (``trainer.*``,
``engine=``, ``model.path``, ...) belongs to the runs and goes in ``train_overrides``."""


def refuse_run_keys(cli_overrides: list[str]) -> None:
    """Refuse a command-line override that each run would not see.

    ``rl.compare`` composes the recipe only to check it; each ``rl.train`` run composes its
    own from ``recipe=``, the router, the seed, its run folder and ``train_overrides``, so
    ``rl.compare trainer.iterations=3`` would be dropped without a word.

    Raises:
        ConfigError: the first such override, with the ``train_overrides`` form that passes it on.
    """
    for o in cli_overrides:
        key = o.split("=", 1)[0].lstrip("+~").strip()
        if key.split(".")[0] in OWN_KEYS or key.startswith("hydra"):
            continue
        passed = o.replace('"', '\\"')
        raise ConfigError(f"{o}: rl.compare does not pass this to its runs; give it to every run as "
                          f"'train_overrides=[\"{passed}\"]' (rl.compare's own keys: {', '.join(OWN_KEYS)})")


RELATIVE = (("iteration_s", "Iter. time"), ("requests_per_min", "RPM"),
            ("samples_per_min", "Sample rate"), ("prefill_tok_s", "Prefill TPS"),
            ("decode_tok_s", "Decode TPS"))


def comparison_rows(summaries: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """Table 4 rows: per router, changes vs the first router (%), prefix hit and mixture."""
    base_name = next(iter(summaries))
    base = summaries[base_name]
    classes = sorted({b for s in summaries.values() for b in (s.get("consumed_mixture") or {})})
    header = ["Router"] + [label for _, label in RELATIVE] + ["Prefix hit"] + classes
    rows = []
    for name, s in summaries.items():
        row = [name]
        for key, _ in RELATIVE:
            v, b = s.get(key), base.get(key)
            row.append(f"{(v / b - 1) * 100:+.1f}%" if v is not None and b else "n/a")
        hit = s.get("prefix_hit_rate")
        row.append(f"{hit:.1%}" if hit is not None else "n/a")
        mix = s.get("consumed_mixture") or {}
        row += [f"{mix.get(b, 0.0) * 100:.1f}" for b in classes]
        rows.append(row)
    return header, rows


def check_train_runs(runs: dict[str, list[str]]) -> None:
    """Run ``rl.train``'s pre-start checks (``compose`` and ``rl.train.validate_job_cfg``)
    on each run's overrides (a name of the run -> its ``rl.train`` overrides), so a bad
    ``train_overrides`` entry is refused before the first run starts.

    Raises:
        ConfigError (and the other errors ``validate_job_cfg`` names): the first bad value
            (the runs differ only in ``router=`` and ``seed=``, which ``main`` checked already).
    """
    from rl.train import validate_job_cfg

    for overrides in runs.values():
        validate_job_cfg(compose("train", overrides))


def run_labels(routers: list[str]) -> list[str]:
    """One label (and run folder name) per entry of ``routers``: the router's name, with
    ``-2``, ``-3``, ... on its repeats (``[vllm, vllm]`` -> ``[vllm, vllm-2]``)."""
    seen: dict[str, int] = {}
    labels = []
    for r in routers:
        seen[r] = seen.get(r, 0) + 1
        labels.append(r if seen[r] == 1 else f"{r}-{seen[r]}")
    return labels


def seed_list(value) -> list[int]:
    """``seed``: one seed or a list of them, as a list of ints.

    Raises:
        ConfigError: a value that is not a whole number >= 0, an empty list, or a seed given
            twice (its runs would only repeat the same data); the message shows both forms.
    """
    values = list(value) if isinstance(value, ListConfig | list | tuple) else [value]
    bad = [v for v in values if not is_seed(v)]
    if bad or not values or len(set(values)) != len(values):
        why = (f"{bad[0]!r} is not a whole number >= 0" if bad else "the list is empty" if not values
               else "a seed is given twice")
        shown = f"[{','.join(str(v) for v in values)}]" if isinstance(value, ListConfig | list | tuple) else value
        raise ConfigError(f"seed={shown}: {why}; give one seed (seed=0) or a list of different ones (seed=[3,4,5])")
    return [int(v) for v in values]


TIME_FIGURES = ("generation_wait_s", "update_s", "loss/num_tokens", "update_s_per_1k_tokens", "cpu_update/job",
                "cpu_update/engines")
"""Where an iteration's time goes, per router (means of ``run_summary``'s figures over the
seeds, labelled and formatted as in ``rl.report.SUMMARY_FIGURES``): the wait for rollouts,
the learner's update, the update over the tokens it forwarded (which tells a learner slowed
beside the rollouts, on shared CPUs, from one that trained longer sequences), and the cores
the trainer's process and the engines used during the updates."""


def first_iteration_s(history: list[dict]) -> float | None:
    """The first iteration's time (s): the one that starts on cold engines and a cold router."""
    its = [h for h in history if "iteration_s" in h]
    return its[0]["iteration_s"] if its else None


def seeds_summary(per_seed: dict[int, dict[str, dict]], first_iterations: dict[int, dict[str, float | None]]) -> dict:
    """Over the seeds: per router (after the first) and Table-4 figure, the change against the
    first router in % per seed, its mean and spread (sample standard deviation; 0 for one
    seed); per router the mean TV distance of the last iteration (points), prefix hit and
    first iteration time (s).

    Args:
        per_seed: ``{seed: {label: run_summary(...)}}``, every seed with the same labels in order.
        first_iterations: ``{seed: {label: first_iteration_s(...)}}``.

    Returns:
        ``{"seeds": [...], "baseline": label, "changes": {label: {figure: {"per_seed": [...],
        "mean": x, "spread": y}}}, "routers": {label: {"tv_pp": ..., "prefix_hit": ...,
        "first_iteration_s": ..., "iteration_s": ..., and each key of ``TIME_FIGURES``}}}``;
        a figure that is missing or not finite in a seed's run of the router, or missing, not
        finite or 0 in the first router's, is left out of that router's changes (``n/a`` in
        the table) and means.
    """
    seeds = list(per_seed)
    labels = list(per_seed[seeds[0]])
    base = labels[0]

    def value(label: str, seed: int, key: str) -> float | None:
        v = per_seed[seed][label].get(key)
        return v if isinstance(v, int | float) and math.isfinite(v) else None

    def mean_of(label: str, key: str, scale: float = 1.0) -> float | None:
        vals = [value(label, s, key) for s in seeds]
        return None if None in vals else statistics.mean(vals) * scale

    changes: dict[str, dict] = {}
    for label in labels[1:]:
        changes[label] = {}
        for key, _ in RELATIVE:
            pairs = [(value(label, s, key), value(base, s, key)) for s in seeds]
            if any(v is None or not b for v, b in pairs):
                continue
            rel = [(v / b - 1) * 100 for v, b in pairs]
            changes[label][key] = {"per_seed": rel, "mean": statistics.mean(rel),
                                   "spread": statistics.stdev(rel) if len(rel) > 1 else 0.0}
    routers = {}
    for label in labels:
        firsts = [first_iterations[s][label] for s in seeds]
        firsts = [f if f is not None and math.isfinite(f) else None for f in firsts]
        routers[label] = {"tv_pp": mean_of(label, "tv_distance", 100.0),
                          "prefix_hit": mean_of(label, "prefix_hit_rate"),
                          "iteration_s": mean_of(label, "iteration_s"),
                          "first_iteration_s": None if None in firsts else statistics.mean(firsts),
                          **{key: mean_of(label, key) for key in TIME_FIGURES}}
    return {"seeds": seeds, "baseline": base, "changes": changes, "routers": routers}


def seeds_markdown(summary: dict, title: str) -> str:
    """``seeds_summary`` as markdown: the changes table (mean ± spread, per seed), then the
    per-router figures, then where each router's iteration time went (``TIME_FIGURES``)."""
    seeds, base = summary["seeds"], summary["baseline"]
    out = [f"# {title}", "", f"Change against {base}, mean ± spread over seeds {seeds} (per seed in brackets; "
           "iteration time: lower is better, the rest: higher is better).", "",
           "| Router | " + " | ".join(label for _, label in RELATIVE) + " |", "|---|" + "---|" * len(RELATIVE)]
    for label, figs in summary["changes"].items():
        cells = []
        for key, _ in RELATIVE:
            f = figs.get(key)
            cells.append("n/a" if f is None else f"{f['mean']:+.1f}% ± {f['spread']:.1f} ("
                         + ", ".join(f"{x:+.1f}" for x in f["per_seed"]) + ")")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", "| Router | iteration (s) | first iteration (s) | TV, last iteration (pp) | prefix hit |",
            "|---|---|---|---|---|"]

    def fmt(v, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    for label, r in summary["routers"].items():
        out.append(f"| {label} | {fmt(r['iteration_s'], '.1f')} | {fmt(r['first_iteration_s'], '.1f')} | "
                   f"{fmt(r['tv_pp'], '.2f')} | {fmt(r['prefix_hit'], '.1%')} |")
    shown = {key: (label, spec) for key, label, spec in SUMMARY_FIGURES}
    out += ["", "Where an iteration's time goes (means over the seeds):", "",
            "| Router | " + " | ".join(shown[key][0] for key in TIME_FIGURES) + " |",
            "|---|" + "---|" * len(TIME_FIGURES)]
    for label, r in summary["routers"].items():
        cells = ["n/a" if r.get(key) is None else shown[key][1].format(r[key]) for key in TIME_FIGURES]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def list_option(cfg: DictConfig, key: str, example: str) -> list[str]:
    """``cfg[key]`` as a list of strings.

    Raises:
        ConfigError: the command line gave one value where a list belongs (``routers=misa-t``
            would otherwise be read letter by letter); the message shows the list form ``example``.
    """
    value = cfg[key]
    if not isinstance(value, ListConfig):
        raise ConfigError(f"{key}={value}: give a list in brackets, e.g. {example}")
    return [str(v) for v in value]


@hydra_entry("compare")
def main(cfg: DictConfig) -> None:
    console = output_console()
    refuse_run_keys(list(HydraConfig.get().overrides.task))
    routers = list_option(cfg, "routers", "'routers=[vllm,misa-t]'")
    options = group_options("router")
    unknown = [r for r in routers if r not in options]
    if unknown:  # before the count: routers=[vlm] is a misspelling first
        near = {r: nearest_options(r, options) for r in unknown}
        guess = ", ".join(f"{r} -> {' or '.join(c)}" for r, c in near.items() if c)
        named = ", ".join(unknown) + (" is not a router option" if len(unknown) == 1 else " are not router options")
        raise ConfigError(f"routers: {named}" + (f" (did you mean {guess}?)" if guess else "")
                          + f"; valid: {', '.join(options)}")
    if len(routers) < 2:
        raise ConfigError(f"routers={routers}: give two or more router options, e.g. [vllm,misa-t] "
                          "(the same one twice, [vllm,vllm], for an A/A control)")
    seeds = seed_list(cfg.seed)
    labels = run_labels(routers)
    recipe = HydraConfig.get().runtime.choices["recipe"]
    run_dir = Path(cfg.run_dir)
    overrides = list_option(cfg, "train_overrides", "'train_overrides=[\"trainer.iterations=4\"]'")
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~").strip()
        if key in PER_RUN_KEYS:
            raise ConfigError(f"train_overrides: {o!r} would replace the {key} rl.compare sets for each run; "
                              + PER_RUN_KEYS[key])

    several = isinstance(cfg.seed, ListConfig)  # seed=[3]: the layout and summary of a list

    def seed_dir(seed: int) -> Path:
        return run_dir / f"seed-{seed}" if several else run_dir

    runs = {(seed, label): [f"recipe={recipe}", f"router={router}", f"seed={seed}",
                            f"run_dir={seed_dir(seed) / label}", *overrides]
            for seed in seeds for label, router in zip(labels, routers)}
    # the seeds only change seed= and run_dir=, both checked above: one composition per router
    check_train_runs({label: runs[(seeds[0], label)] for label in labels})
    per_seed: dict[int, dict[str, dict]] = {}
    firsts: dict[int, dict[str, float | None]] = {}
    for seed in seeds:
        histories = {}
        for label in labels:
            out = seed_dir(seed) / label
            argv = [sys.executable, "-m", "rl.train", *runs[(seed, label)]]
            console.print(f"[bold]{label}[/bold]: {' '.join(argv[1:])}")
            if subprocess.run(argv, cwd=REPO_ROOT).returncode != 0:
                raise RunFailedError(f"the run {label} (seed {seed}) failed; its logs are in "
                                     f"{out / 'logs'}" + (f"; the seeds before it are in {run_dir}" if seed != seeds[0]
                                                            else ""))
            histories[label] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        per_seed[seed] = {label: run_summary(h) for label, h in histories.items()}
        firsts[seed] = {label: first_iteration_s(h) for label, h in histories.items()}
        _write_seed(console, per_seed[seed], histories, seed_dir(seed), f"{recipe}, seed {seed}", labels[0])
    if several:
        summary = seeds_summary(per_seed, firsts)
        md = seeds_markdown(summary, f"{recipe}: {', '.join(labels)} over seeds {seeds}")
        (run_dir / "summary.md").write_text(md)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        _plot_seeds(summary, run_dir / "summary.png")
        console.print(md)
        console.print(f"written: {run_dir / 'summary.md'}, {run_dir / 'summary.png'}")


def _write_seed(console, summaries: dict[str, dict], histories: dict[str, list[dict]], folder: Path, title: str,
                base: str) -> None:
    """One seed's Table 4 on the console and its comparison.md / .json and mixture.png in ``folder``."""
    header, rows = comparison_rows(summaries)
    table = Table(title=f"{title}: change vs {base} (mixture in %)")
    for h in header:
        table.add_column(h, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    (folder / "comparison.md").write_text("\n".join(md) + "\n")
    (folder / "comparison.json").write_text(json.dumps(summaries, indent=1))
    _plot_mixture(histories, folder / "mixture.png")
    console.print(f"written: {folder / 'comparison.md'}, {folder / 'mixture.png'}")


def _plot_seeds(summary: dict, path: Path) -> list[str]:
    """Each Table-4 change against the first router: mean over the seeds as a bar with its
    spread, every seed as a dot; one bar per router after the first. Returns the legend's
    labels (the routers with at least one figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(summary["changes"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        named = False
        for j, (key, _) in enumerate(RELATIVE):
            f = summary["changes"][label].get(key)
            if f is None:
                continue
            x = j + (i - (len(labels) - 1) / 2) * width
            ax.bar(x, f["mean"], width, yerr=f["spread"], color=f"C{i}", alpha=0.6, capsize=3,
                   label=None if named else label)
            named = True
            ax.scatter([x] * len(f["per_seed"]), f["per_seed"], color=f"C{i}", s=10, zorder=3)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(RELATIVE)), [name for _, name in RELATIVE])
    ax.set_ylabel(f"change vs {summary['baseline']} (%)")
    ax.set_title(f"mean ± spread over seeds {summary['seeds']} (dots: seeds)", fontsize=9)
    legend = ax.get_legend_handles_labels()[1]
    if legend:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return legend


def _plot_mixture(histories: dict[str, list[dict]], path: Path) -> None:
    """Consumed mixture per class over iterations, one line style per router (paper Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    styles = ["-", "--", ":", "-."]
    for i, (router, hist) in enumerate(histories.items()):
        classes = sorted({b for h in hist for b in (h.get("consumed_mixture") or {})})
        for j, b in enumerate(classes):
            ax.plot([h["iteration"] for h in hist],
                    [(h.get("consumed_mixture") or {}).get(b, 0.0) for h in hist],
                    color=f"C{j}", linestyle=styles[i % len(styles)], label=f"{b} ({router})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("consumed share")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
