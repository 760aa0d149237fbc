"""Agent episodes at scale on this machine: 64 concurrent episodes with a scripted policy.

One run, side by side:

- ``sandbox``: the same trivial command (``true``) run directly and in a bubblewrap
  workspace, many times: the per-command overhead of isolation (and workspace creation).
- ``concurrent``: ``--episodes`` episodes submitted at once to ``python -m agents.server``
  (max 64 in flight), the model being a scripted OpenAI-compatible server with
  ``--latency-ms`` per call (no model). Each episode runs every tool: bash, read_file,
  str_replace, run_tests (pytest in the sandbox), submit, and the reward test run.
- ``sequential``: ``--sequential`` episodes one after another: the concurrency speed-up.

Reports episodes/min, the model/tool time split, and the peak resident memory of the
agent server with all its children (bubblewrap, shells, pytest) sampled every 50 ms.
Goal: 64 concurrent episodes in <= 4 GiB besides the engines. Prints a table, saves a plot.

    .venv/bin/python -m bench.agent_episodes --episodes 64 --latency-ms 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from agents.client import AgentServerClient, launch_agent_server
from agents.envs.task import load_tasks
from agents.scripted import ScriptedServer, gold_patch_policy
from agents.server import HANDMADE_TASKS
from common.config import CommandParser, check_plot_path
from sandbox import Workspace


class TreeMemory:
    """Samples the RSS (bytes) of a process and all its descendants in a thread."""

    def __init__(self, pid: int, period_s: float = 0.05) -> None:
        self.root = psutil.Process(pid)
        self.period_s = period_s
        self.samples: list[tuple[float, int, int]] = []  # (t, rss bytes, processes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            rss, n = 0, 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    rss += p.memory_info().rss
                    n += 1
                except psutil.Error:
                    pass
            self.samples.append((time.monotonic() - t0, rss, n))
            self._stop.wait(self.period_s)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_bytes(self) -> int:
        return max((s[1] for s in self.samples), default=0)


async def sandbox_overhead(n: int, tmp: Path) -> dict[str, float]:
    """Mean seconds of `true` run directly, in a sandbox, and of creating a workspace."""
    snap = tmp / "snap"
    snap.mkdir(exist_ok=True)
    (snap / "a.py").write_text("x = 1\n")
    t = time.monotonic()
    for _ in range(n):
        subprocess.run(["/bin/sh", "-c", "true"], check=True)
    direct = (time.monotonic() - t) / n
    t = time.monotonic()
    spaces = [Workspace.create(HANDMADE_TASKS.parent / "snapshots" / "stats_mean", root=tmp)
              for _ in range(n)]
    create = (time.monotonic() - t) / n
    ws = spaces[0]
    t = time.monotonic()
    for _ in range(n):
        await ws.run("true")
    sandboxed = (time.monotonic() - t) / n
    t = time.monotonic()
    for w in spaces:
        await w.destroy()
    destroy = (time.monotonic() - t) / n
    return {"direct_s": direct, "sandboxed_s": sandboxed, "create_s": create, "destroy_s": destroy}


async def run_episodes(client: AgentServerClient, ids: list[str], concurrent: bool,
                       desc: str) -> tuple[list[dict], float]:
    started = time.monotonic()
    results: list[dict] = []
    bar = tqdm(total=len(ids), desc=desc, unit="ep")
    if concurrent:
        eids = [await client.submit(instance_id=iid, group_id=f"g{i // 8}", unit_id=f"u{i}")
                for i, iid in enumerate(ids)]

        async def one(eid: str) -> None:
            results.append(await client.result(eid, poll_s=60))
            bar.update(1)
        await asyncio.gather(*(one(e) for e in eids))
    else:
        for i, iid in enumerate(ids):
            results.append(await client.run_episode(instance_id=iid, unit_id=f"s{i}"))
            bar.update(1)
    bar.close()
    return results, time.monotonic() - started


async def bench(args: argparse.Namespace) -> None:
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    overhead = await sandbox_overhead(args.sandbox_runs, tmp)

    tasks_path = args.tasks or HANDMADE_TASKS
    tasks = load_tasks(tasks_path)
    server = ScriptedServer(gold_patch_policy({t.problem_statement: t.patch for t in tasks.values()}),
                            latency_s=args.latency_ms / 1000)
    runner, url = await server.start()
    names = sorted(tasks)
    ids = [names[i % len(names)] for i in range(args.episodes)]
    overrides = [f"router_url={url}", "tokenizer=byte", f"tasks_path={tasks_path}",
                 "extra_tasks_paths=[]", "max_concurrent_episodes=64",
                 "episode.limits.max_context_tokens=65536", "episode.limits.max_tokens_per_turn=4096"]
    try:
        with launch_agent_server(tmp, overrides) as (proc, agent_url):
            client = AgentServerClient(agent_url)
            try:
                seq, seq_s = await run_episodes(client, ids[: args.sequential], False, "sequential")
                with TreeMemory(proc.pid) as mem:
                    conc, conc_s = await run_episodes(client, ids, True, "concurrent")
            finally:
                await client.aclose()
    finally:
        await runner.cleanup()

    seq_rate = 60 * len(seq) / seq_s
    conc_rate = 60 * len(conc) / conc_s
    solved = sum(r["reward"] for r in conc)
    model_s = sum(r["model_s"] for r in conc)
    tool_s = sum(r["tool_s"] for r in conc)
    commands = sum(sum(len(t["tool_calls"]) for t in r["turns"]) for r in conc)
    idle_rss = mem.samples[0][1] if mem.samples else 0

    table = Table(title=f"agent episodes ({len(conc)} concurrent, scripted policy, "
                        f"{args.latency_ms:g} ms per model call)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("`true` direct / sandboxed (ms)",
                  f"{overhead['direct_s'] * 1e3:.2f} / {overhead['sandboxed_s'] * 1e3:.2f}",
                  f"{overhead['sandboxed_s'] / overhead['direct_s']:.2f}x")
    table.add_row("sandbox overhead per command (ms)",
                  f"{(overhead['sandboxed_s'] - overhead['direct_s']) * 1e3:.2f}", "")
    table.add_row("workspace create / destroy (ms)",
                  f"{overhead['create_s'] * 1e3:.2f} / {overhead['destroy_s'] * 1e3:.2f}", "")
    table.add_row("episodes/min sequential", f"{seq_rate:.1f}", "1.00x")
    table.add_row("episodes/min concurrent", f"{conc_rate:.1f}", f"{conc_rate / seq_rate:.2f}x")
    table.add_row("solved (reward 1)", f"{solved:.0f}/{len(conc)}", "")
    table.add_row("median episode wall (s)", f"{statistics.median(r['wall_s'] for r in conc):.2f}", "")
    table.add_row("model / tool time share", f"{model_s / (model_s + tool_s):.1%} / "
                  f"{tool_s / (model_s + tool_s):.1%}", "")
    table.add_row("tool calls run", f"{commands}", "")
    table.add_row("peak RSS agent server + children (GiB)", f"{mem.peak_bytes / 1024**3:.2f}",
                  f"{mem.peak_bytes / (4 * 1024**3):.0%} of 4 GiB")
    table.add_row("idle RSS agent server (GiB)", f"{idle_rss / 1024**3:.2f}", "")
    table.add_row("peak processes in tree", f"{max(s[2] for s in mem.samples)}", "")
    console.print(table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ts = [s[0] for s in mem.samples]
    ax.plot(ts, [s[1] / 1024**3 for s in mem.samples], label="RSS (GiB)")
    ax.axhline(4, color="red", linestyle="--", label="4 GiB goal")
    ax.set_xlabel("seconds")
    ax.set_ylabel("GiB")
    ax2 = ax.twinx()
    ax2.plot(ts, [s[2] for s in mem.samples], color="gray", alpha=0.6, label="processes")
    ax2.set_ylabel("processes")
    ax.set_title(f"{len(conc)} concurrent agent episodes: agent server memory")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    console.print(f"plot: {args.plot}")


def main() -> None:
    ap = CommandParser(prog="python -m bench.agent_episodes", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=4, help="episodes run one by one first")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="scripted model time per call")
    ap.add_argument("--sandbox-runs", type=int, default=50)
    ap.add_argument("--tasks", type=Path, default=None,
                    help="tasks JSONL (default: the hand-made tasks)")
    ap.add_argument("--plot", type=Path, default=Path("runs/bench/agent_episodes.png"))
    args = ap.parse_args()
    check_plot_path(args.plot, "agent_episodes.png")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
