"""``python -m rl.compare recipe=mixed_step routers=[vllm,misa-t] seed=0``: router A/B on the main job.

Runs ``python -m rl.train`` once per router, one after the other, with the same recipe,
seed and data (each in ``<run_dir>/<router>/``), then prints the paper's Table 4 for
them: iteration time, requests/min, samples/min, prefill and decode tok/s as changes
relative to the first router, prefix hit rate and the consumed mixture. The table is
also written to ``<run_dir>/comparison.md`` and a plot of the consumed mixture over
iterations per router to ``<run_dir>/mixture.png``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig
from rich.table import Table

from common.config import REPO_ROOT, ConfigError, RunFailedError, compose, group_options, hydra_entry
from common.console import output_console
from rl.report import run_summary

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
    on each run's overrides (router -> its ``rl.train`` overrides), so a bad
    ``train_overrides`` entry is refused before the first run starts.

    Raises:
        ConfigError (and the other errors ``validate_job_cfg`` names): the first bad value
            (the runs differ only in ``router=``, which ``main`` checked already).
    """
    from rl.train import validate_job_cfg

    for overrides in runs.values():
        validate_job_cfg(compose("train", overrides))


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
    routers = list_option(cfg, "routers", "'routers=[vllm,misa-t]'")
    if len(routers) < 2 or len(set(routers)) != len(routers):
        raise ConfigError(f"routers={routers}: give two or more different router options, e.g. [vllm,misa-t]")
    unknown = [r for r in routers if r not in group_options("router")]
    if unknown:
        raise ConfigError(f"routers: {unknown} are not router options; valid: {', '.join(group_options('router'))}")
    recipe = HydraConfig.get().runtime.choices["recipe"]
    run_dir = Path(cfg.run_dir)
    runs = {r: [f"recipe={recipe}", f"router={r}", f"seed={cfg.seed}", f"run_dir={run_dir / r}",
                *list_option(cfg, "train_overrides", "'train_overrides=[\"trainer.iterations=4\"]'")] for r in routers}
    check_train_runs(runs)
    summaries, histories = {}, {}
    for r in routers:
        out = run_dir / r
        argv = [sys.executable, "-m", "rl.train", *runs[r]]
        console.print(f"[bold]router={r}[/bold]: {' '.join(argv[1:])}")
        if subprocess.run(argv, cwd=REPO_ROOT).returncode != 0:
            raise RunFailedError(f"the run with router={r} failed; its logs are in {out / 'logs'}")
        histories[r] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        summaries[r] = run_summary(histories[r])
    header, rows = comparison_rows(summaries)
    table = Table(title=f"{recipe}, seed {cfg.seed}: change vs {routers[0]} (mixture in %)")
    for h in header:
        table.add_column(h, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    (run_dir / "comparison.md").write_text("\n".join(md) + "\n")
    (run_dir / "comparison.json").write_text(json.dumps(summaries, indent=1))
    _plot_mixture(histories, run_dir / "mixture.png")
    console.print(f"written: {run_dir / 'comparison.md'}, {run_dir / 'mixture.png'}")


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
