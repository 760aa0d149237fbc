"""Does the default run learn? The eval gain of `make run` over seeds, as a ratio to step 0.

    python -m bench.learning_curve [--seeds 0 1 2] [--metric eval/arithmetic/pass@1]
                                   [--out runs/learning-curve] [--runs DIR ...] [-- OVERRIDES]

Runs the default recipe (``python -m rl.train``, every process it starts included) once per
seed, one after the other, each in ``<out>/seed<s>/``; extra Hydra overrides after ``--``
go to every run. Then reads each run's ``metrics.jsonl`` and prints, per seed and as mean
+- standard deviation over seeds: the metric at step 0 (the trainer's baseline evaluation)
and at the last evaluated step, the gain in points, the ratio end / step 0, the rlvr
reward of all rollouts (``rollout_reward_by_class``, filtered groups included: the
policy's reward on what it generated) over the first and the second half of the
iterations that completed rlvr rollouts, the rlvr units that entered a gradient over the
run and the gain per 100 of them (learning per trained sample, which a loaded
machine does not change, unlike the wall time), the agent class's reward of all rollouts
(first half -> second half, the same way) and agent units trained, and the run's wall
time; before that, one table per run: the metric at each evaluated step, and per
iteration the rlvr reward of all rollouts and of the trained groups, the rlvr units and
informative groups trained, the agent reward of all rollouts and agent units trained, all
units trained and the update time. ``--runs`` reads finished run folders instead of
training (no engine needed); one without a step-0
evaluation is refused with one ``error:`` line, exit code 2, before anything is printed,
and one that stopped before ``trainer.iterations`` (its ``config.yaml``) is read but named
"stopped i/N" in the tables, with a note line.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common.config import usage_error, CommandParser

REPO = Path(__file__).resolve().parent.parent


class RunFolderError(ValueError):
    """A run folder whose metrics cannot give the curve; the message names the folder."""


def curve(run_dir: Path, metric: str) -> dict:
    """Step-0 and last value of ``metric``, the per-iteration rlvr figures and the mean rlvr
    reward of all rollouts over the first and second half of the iterations, of one run folder.

    Raises:
        RunFolderError: the folder has no metrics.jsonl, a line that is not JSON, or no
            step-0 evaluation line with ``metric``.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise RunFolderError(f"{run_dir}: no metrics.jsonl (did the run finish?); give rl.train run folders")
    try:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path}: line {e.lineno} is not JSON ({e.msg})") from None
    evals = [(h["iteration"], h[metric]) for h in lines if h.get(metric) is not None]
    if not evals or evals[0][0] != 0:
        raise RunFolderError(f"{run_dir}: no step-0 value of {metric}; the run needs "
                             "trainer.eval_every > 0 (or give --metric)")
    steps = [{"iteration": h["iteration"], "eval": h.get(metric),
              "rlvr_reward": (h.get("reward_by_class") or {}).get("rlvr"),
              "rlvr_rollout_reward": (h.get("rollout_reward_by_class") or {}).get("rlvr"),
              "rlvr_units": _class_count(h, "trained_units_by_class", "rlvr"),
              "rlvr_groups": _class_count(h, "trained_groups_by_class", "rlvr"),
              "agent_rollout_reward": (h.get("rollout_reward_by_class") or {}).get("agent"),
              "agent_units": _class_count(h, "trained_units_by_class", "agent"),
              "trained_units": h.get("trained_units"), "update_s": h.get("update_s")}
             for h in lines if not h.get("baseline")]
    planned = _planned_iterations(run_dir)
    done = max((h["iteration"] for h in lines), default=0)
    counted = [s["rlvr_units"] for s in steps if s["rlvr_units"] is not None]
    agent_counted = [s["agent_units"] for s in steps if s["agent_units"] is not None]
    return {"start": evals[0][1], "end": evals[-1][1], "end_step": evals[-1][0],
            "points": evals, "steps": steps, "iterations_done": done, "iterations_planned": planned,
            "stopped": planned is not None and done < planned,
            "rlvr_trained": sum(counted) if counted else None,
            "agent_trained": sum(agent_counted) if agent_counted else None,
            "rlvr_rollout_halves": _halves([s["rlvr_rollout_reward"] for s in steps]),
            "agent_rollout_halves": _halves([s["agent_rollout_reward"] for s in steps])}


def _class_count(line: dict, key: str, workload_class: str) -> int | None:
    """A per-class count of one metrics line (0 for a class not in it), or None when the
    line has no ``key`` (a run written before that metric was logged: blank, not 0)."""
    return (line.get(key) or {}).get(workload_class, 0) if key in line else None


def _halves(values: list[float | None]) -> tuple[float, float] | None:
    """Mean of the first and of the second half of the values, over the iterations that
    have one (an iteration that completed no rollout of the class has none: the halves are
    of those iterations, not of the run's); None under 2 values."""
    xs = [x for x in values if x is not None]
    half = len(xs) // 2
    return (statistics.mean(xs[:half]), statistics.mean(xs[half:])) if half else None


def _planned_iterations(run_dir: Path) -> int | None:
    """``trainer.iterations`` of the run's resolved ``config.yaml`` (None: no such file or key)."""
    import yaml
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.is_file():  # an older or hand-made folder: nothing to compare with
        return None
    try:
        return int(OmegaConf.select(OmegaConf.load(path), "trainer.iterations"))
    except (OSError, TypeError, ValueError, yaml.YAMLError):  # unreadable, or no such key
        return None


def _fmt(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


def step_table(name: str, c: dict) -> Table:
    """One run's iterations: the metric where evaluated, the rlvr reward of all rollouts and
    of the trained groups, the rlvr units and groups that entered the gradient (informative
    ones), the agent reward of all rollouts and agent units trained, all trained units and
    the update time (runs written before those metrics existed show blanks)."""
    t = Table(title=f"{name}: per iteration (eval at step 0: {c['start']:.3f})")
    for col in ("iteration", "eval", "rlvr reward, all rollouts", "rlvr reward, trained groups",
                "rlvr units trained", "rlvr groups trained", "agent reward, all rollouts",
                "agent units trained", "units trained", "update s"):
        t.add_column(col, justify="right")
    for s in c["steps"]:
        t.add_row(str(s["iteration"]), _fmt(s["eval"], ".3f"), _fmt(s["rlvr_rollout_reward"], ".3f"),
                  _fmt(s["rlvr_reward"], ".3f"),
                  _fmt(s["rlvr_units"], "d"), _fmt(s["rlvr_groups"], "d"),
                  _fmt(s["agent_rollout_reward"], ".3f"), _fmt(s["agent_units"], "d"),
                  _fmt(s["trained_units"], "d"), _fmt(s["update_s"], ".0f"))
    return t


def _mean_sd(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} +- {sd:.3f}"


def main() -> None:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = CommandParser(prog="python -m bench.learning_curve", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--metric", default="eval/arithmetic/pass@1")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "learning-curve")
    ap.add_argument("--runs", type=Path, nargs="+", default=None,
                    help="finished run folders to read instead of training")
    args = ap.parse_args(argv)
    console = Console()
    runs: list[tuple[str, Path, float | None]] = []
    if args.runs:
        runs = [(p.name, p, None) for p in args.runs]
    else:
        for s in args.seeds:
            run_dir = args.out / f"seed{s}"
            cmd = [sys.executable, "-m", "rl.train", f"seed={s}", f"run_dir={run_dir}", *overrides]
            console.print(f"seed {s}: {' '.join(cmd[1:])}")
            t0 = time.monotonic()
            rc = subprocess.call(cmd, cwd=REPO)
            if rc != 0:
                raise SystemExit(f"seed {s}: rl.train exited with {rc}; its logs are in {run_dir}/logs")
            runs.append((f"seed {s}", run_dir, time.monotonic() - t0))
    table = Table(title=f"{args.metric}: step 0 -> last evaluated step")
    for col in ("run", "step 0", "end (step)", "gain (points)", "ratio to step 0",
                "rlvr reward, all rollouts: 1st half -> 2nd half", "rlvr units trained",
                "points per 100 rlvr units", "agent reward, all rollouts: 1st half -> 2nd half",
                "agent units trained", "wall (min)"):
        table.add_column(col, justify="right")
    try:  # every folder read before anything is printed
        curves = [(name, curve(run_dir, args.metric), wall) for name, run_dir, wall in runs]
    except RunFolderError as e:
        if args.runs:  # the folders the command named: a mistake in it
            raise usage_error(f"--runs {e}") from None
        raise SystemExit(str(e)) from None  # a run this command trained: a failure (exit 1)
    starts, ends, gains, ratios = [], [], [], []
    for name, c, wall in curves:
        if c["stopped"]:  # a run stopped early (killed, timed out): its end is its last evaluation
            console.print(f"note: {name} stopped at iteration {c['iterations_done']} of "
                          f"{c['iterations_planned']} (not a finished run); its end is step {c['end_step']}")
            name = f"{name} (stopped {c['iterations_done']}/{c['iterations_planned']})"
        ratio = c["end"] / c["start"] if c["start"] > 0 else float("inf")
        starts.append(c["start"])
        ends.append(c["end"])
        gains.append(100 * (c["end"] - c["start"]))
        ratios.append(ratio)
        rl, ag = (f"{h[0]:.3f} -> {h[1]:.3f}" if h else "n/a"
                  for h in (c["rlvr_rollout_halves"], c["agent_rollout_halves"]))
        n = c["rlvr_trained"]
        console.print(step_table(name, c))
        table.add_row(name, f"{c['start']:.3f}", f"{c['end']:.3f} ({c['end_step']})",
                      f"{gains[-1]:+.1f}", f"{ratio:.2f}", rl, _fmt(n, "d"),
                      f"{100 * gains[-1] / n:+.2f}" if n else "", ag, _fmt(c["agent_trained"], "d"),
                      f"{wall / 60:.1f}" if wall is not None else "")
    finite = [r for r in ratios if r != float("inf")]
    table.add_row("mean +- sd", _mean_sd(starts), _mean_sd(ends), _mean_sd(gains), _mean_sd(finite),
                  "", "", "", "", "", "")
    console.print(table)


if __name__ == "__main__":
    main()
