"""One GRPO update step with OpenMP's waiting threads spinning (``ACTIVE``) or sleeping
(``PASSIVE``, what ``rl`` sets), on an idle machine and beside busy one-thread processes
pinned one per usable core (as the CPU recipe's engines are), side by side.

    python -m bench.omp_wait_policy [--batch 8] [--prompt-tokens 160] [--completion-tokens 64]
                                    [--repeats 2] [--plot runs/bench/omp_wait_policy.png]

The policy is read when torch loads its OpenMP runtime, so each (policy, load) pair runs
in a child process started with ``OMP_WAIT_POLICY`` set: it loads the packaged policy
model, takes one warm-up step, then ``--repeats`` timed steps on the same synthetic batch
(``bench.grpo_step.synthetic_samples``), with torch's default thread count. Prints the
median step per pair and the ratio PASSIVE / ACTIVE per load. About 6 minutes on the
2-core machine; no disk beyond the model.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common.config import CommandParser, check_plot_path

POLICIES = ("ACTIVE", "PASSIVE")
LOADS = ("idle", "busy cores")


def _busy(core: int, stop, parent: int) -> None:
    """A one-thread torch loop pinned to ``core`` (an engine's model thread) until ``stop`` is
    set or its parent ``parent`` is gone (a killed benchmark leaves no loop behind)."""
    import torch

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set() and os.getppid() == parent:
        for _ in range(50):
            a = torch.tanh(a @ a)


def child(args) -> None:
    """Time the steps in this process (its ``OMP_WAIT_POLICY`` set by the parent); print JSON."""
    from bench.grpo_step import synthetic_samples
    from common.config import compose
    from rl.learner import Learner, LearnerConfig
    from rollout.model import resolve_model_path

    learner = Learner(resolve_model_path(compose("train", ["run_dir=runs/bench"]).model), LearnerConfig(lr=1e-6))
    samples = synthetic_samples(learner, args.batch, args.prompt_tokens, args.completion_tokens)
    learner.step(samples)  # warm-up: allocates optimizer state
    stop = mp.get_context("fork").Event()
    procs = []
    if args.load == "busy cores":
        procs = [mp.get_context("fork").Process(target=_busy, args=(c, stop, os.getpid()), daemon=True)
                 for c in sorted(os.sched_getaffinity(0))]
        for p in procs:
            p.start()
        time.sleep(2)
    try:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            learner.step(samples)
            times.append(time.perf_counter() - t0)
    finally:
        stop.set()
        for p in procs:
            p.join()
    print(json.dumps({"times": times}))


def plot(medians: dict[tuple[str, str], float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    for i, policy in enumerate(POLICIES):
        ax.bar([j + (i - 0.5) * 0.4 for j in range(len(LOADS))], [medians[(policy, load)] for load in LOADS],
               0.4, label=f"OMP_WAIT_POLICY={policy}")
    ax.set_xticks(range(len(LOADS)), LOADS)
    ax.set_ylabel("seconds per GRPO step (median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # its folder: made by main before the timing
    plt.close(fig)


def main() -> None:
    ap = CommandParser(prog="python -m bench.omp_wait_policy", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--completion-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--plot", type=Path, default=Path("runs/bench/omp_wait_policy.png"),
                    help="the chart (.png, .pdf or .svg); its folder is made before the timing")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--load", choices=LOADS, default="idle", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("batch", "prompt_tokens", "completion_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.child:
        child(args)
        return
    check_plot_path(args.plot, "omp_wait_policy.png")  # before minutes of timing, not after
    from rich.console import Console
    from rich.table import Table

    medians: dict[tuple[str, str], float] = {}
    for load in LOADS:
        for policy in POLICIES:
            argv = [sys.executable, "-m", "bench.omp_wait_policy", "--child", "--load", load,
                    "--batch", str(args.batch), "--prompt-tokens", str(args.prompt_tokens),
                    "--completion-tokens", str(args.completion_tokens), "--repeats", str(args.repeats)]
            print(f"{load}, OMP_WAIT_POLICY={policy} ...", flush=True)
            try:
                r = subprocess.run(argv, env={**os.environ, "OMP_WAIT_POLICY": policy}, capture_output=True,
                                   text=True)
            except KeyboardInterrupt:  # subprocess.run has killed the child; its busy loops follow it
                print("bench.omp_wait_policy: interrupted", file=sys.stderr)
                sys.exit(130)
            if r.returncode != 0:
                sys.exit(f"bench.omp_wait_policy: the {load} / {policy} run failed:\n{r.stderr[-2000:]}")
            medians[(policy, load)] = statistics.median(json.loads(r.stdout.strip().splitlines()[-1])["times"])
    table = Table(title=f"GRPO step, batch {args.batch} x ({args.prompt_tokens} + {args.completion_tokens}) tokens, "
                        f"{len(os.sched_getaffinity(0))} cores; median of {args.repeats}")
    for col in ("load", "ACTIVE (s)", "PASSIVE (s)", "PASSIVE / ACTIVE"):
        table.add_column(col, justify="right")
    for load in LOADS:
        a, p = medians[("ACTIVE", load)], medians[("PASSIVE", load)]
        table.add_row(load, f"{a:.1f}", f"{p:.1f}", f"{p / a:.2f}x")
    Console().print(table)
    plot(medians, args.plot)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
