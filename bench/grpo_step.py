"""Time of one GRPO update step (plain torch vs DeepSpeed ZeRO-1 / ZeRO-2 on CPU) and of
one weight sync into a running vLLM engine, side by side.

    python -m bench.grpo_step [--batch 8] [--prompt-tokens 64] [--completion-tokens 64]
                              [--repeats 2] [--backends torch zero1 zero2]
                              [--engine-url URL | --no-sync] [--plot runs/bench/grpo_step.png]

Each backend loads the packaged policy model, takes one warm-up step (optimizer state is
allocated there), then ``--repeats`` timed steps on the same synthetic batch (random
token ids, on-policy old log-probs, advantages +-1); the median is reported with its ratio
to plain torch. The weight sync starts one eager engine (unless ``--engine-url`` names a
running one), then times ``--repeats`` syncs (write safetensors to /dev/shm, pause,
reload_weights, reset prefix cache, resume). All in one run, on the same machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tqdm import tqdm  # noqa: E402

from common.config import CommandParser, check_plot_path, compose  # noqa: E402
from rl.grpo import TrainSample  # noqa: E402
from rl.learner import Learner, LearnerConfig  # noqa: E402
from rollout.model import resolve_model_path  # noqa: E402

BACKENDS = {"torch": ("torch", 1), "zero1": ("deepspeed", 1), "zero2": ("deepspeed", 2)}


def synthetic_samples(learner: Learner, batch: int, prompt_tokens: int,
                      completion_tokens: int, seed: int = 0) -> list[TrainSample]:
    """``batch`` samples of random token ids with on-policy old log-probs."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(learner.tokenizer)
    raw = [TrainSample(torch.randint(vocab, (prompt_tokens,), generator=g).tolist(),
                       torch.randint(vocab, (completion_tokens,), generator=g).tolist(),
                       [0.0] * completion_tokens, 1.0 if i % 2 == 0 else -1.0)
           for i in range(batch)]
    old = learner.log_probs(raw)
    return [TrainSample(s.prompt_ids, s.completion_ids, lp, s.advantage) for s, lp in zip(raw, old)]


def time_steps(model_path: str, name: str, args) -> tuple[list[float], Learner]:
    backend, stage = BACKENDS[name]
    learner = Learner(model_path, LearnerConfig(backend=backend, zero_stage=stage, lr=1e-6,
                                                micro_batch_size=args.micro_batch))
    samples = synthetic_samples(learner, args.batch, args.prompt_tokens, args.completion_tokens)
    learner.step(samples)  # warm-up: allocates optimizer state
    times = []
    for _ in tqdm(range(args.repeats), desc=f"{name} steps", leave=False):
        t0 = time.perf_counter()
        learner.step(samples)
        times.append(time.perf_counter() - t0)
    return times, learner


def time_syncs(learner: Learner, engine_url: str, repeats: int) -> list:
    from rollout.weight_sync import HttpReloadSync, WeightSyncConfig

    sync = HttpReloadSync([engine_url], WeightSyncConfig(shm_dir="/dev/shm/misa-rl-bench-sync"))
    try:
        return [sync.sync(learner, policy_version=i + 1)
                for i in tqdm(range(repeats), desc="weight syncs", leave=False)]
    finally:
        sync.close()


def plot(rows: list[tuple[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color="tab:blue")
    ax.set_xlabel("seconds (median)")
    ax.set_title("GRPO update step and weight sync, CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = CommandParser(prog="python -m bench.grpo_step", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--completion-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    ap.add_argument("--engine-url", default=None, help="use this running engine for the sync")
    ap.add_argument("--no-sync", action="store_true", help="skip the weight-sync timing")
    ap.add_argument("--plot", type=Path, default=Path("runs/bench/grpo_step.png"))
    args = ap.parse_args()
    check_plot_path(args.plot, "grpo_step.png")
    cfg = compose("train", ["run_dir=runs/bench"])
    model_path = resolve_model_path(cfg.model)
    console = Console()

    steps: dict[str, float] = {}
    sync_learner = None
    for name in args.backends:
        times, learner = time_steps(model_path, name, args)
        steps[name] = statistics.median(times)
        if name == "torch":
            sync_learner = learner
        else:
            del learner

    reports = []
    if not args.no_sync:
        if sync_learner is None:
            sync_learner = Learner(model_path)
        if args.engine_url:
            reports = time_syncs(sync_learner, args.engine_url, args.repeats)
        else:
            from rollout.engines import EnginePool

            ecfg = OmegaConf.create(OmegaConf.to_container(cfg.engine))
            ecfg.num_engines = 1
            with tempfile.TemporaryDirectory() as logs:
                with EnginePool.start(ecfg, model_path, cfg.model.name, 2048, "float32",
                                      Path(logs)) as pool:
                    reports = time_syncs(sync_learner, pool.urls[0], args.repeats)

    base = steps.get("torch")
    table = Table(title=f"GRPO step: batch {args.batch} x ({args.prompt_tokens} prompt + "
                        f"{args.completion_tokens} completion) tokens, micro-batch "
                        f"{args.micro_batch}; median of {args.repeats}")
    table.add_column("what")
    table.add_column("seconds", justify="right")
    table.add_column("vs torch step", justify="right")
    rows = []
    for name, s in steps.items():
        table.add_row(f"update step, {name}", f"{s:.2f}", f"{s / base:.2f}x" if base else "-")
        rows.append((f"step {name}", s))
    if reports:
        for label, fn in (("weight sync, total", lambda r: r.total_s),
                          ("  write safetensors", lambda r: r.write_s),
                          ("  pause", lambda r: r.engines[0].pause_s),
                          ("  reload_weights", lambda r: r.engines[0].load_s),
                          ("  reset prefix cache", lambda r: r.engines[0].reset_s),
                          ("  resume", lambda r: r.engines[0].resume_s)):
            s = statistics.median(fn(r) for r in reports)
            table.add_row(label, f"{s:.3f}", f"{s / base:.2f}x" if base else "-")
        rows.append(("weight sync", statistics.median(r.total_s for r in reports)))
    console.print(table)
    plot(rows, args.plot)
    console.print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
