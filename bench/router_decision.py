"""Policy-core cost, side by side in one run: decision latency and memory.

1. Decision latency per policy: 4 instances, 10,000 tracked sessions (3 workload
   classes, GRPO groups of 8, most visible, some held), a prefix index holding every
   session's prompt blocks, and a steady mix of continuations and new sessions (each
   admitted new session replaces an ended one, so the ledger stays at 10,000). Each
   request carries a 32-block prompt chain. Reports p50/p99 per policy in microseconds,
   split into new sessions and continuations, next to the goal (p99 <= 200 us) and as a
   ratio to round_robin measured in the same run.
2. Memory: in a fresh process, RSS of misa_t holding 10,000 sessions plus a prefix index
   of 1,000,000 blocks (goal <= 300 MB), and the RSS added over the bare interpreter
   with the policy modules imported.

Prints a table and saves a bar chart (``--plot``).

    .venv/bin/python -m bench.router_decision --decisions 4000
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from common.config import usage_error, CommandParser, check_plot_path
from router.policies import POLICY_NAMES, make_policy
from router.policies.base import (
    BlocksStored,
    ClusterView,
    Hold,
    InstanceMetrics,
    InstanceView,
    MetricsSampled,
    Request,
    RequestStarted,
    SessionEnded,
)

INSTANCES = tuple(f"http://engine-{i}:8000" for i in range(4))
CLASSES = ("agent", "rlvr", "rlhf")
SESSIONS = 10_000
PROMPT_BLOCKS = 32
GOAL_P99_US = 200.0
GOAL_RSS_MB = 300.0
# 200,000 blocks per instance: with k_ref = 64 blocks, about 2,800 protected sessions each,
# so 10,000 sessions are mostly admitted, the rest held.
METRICS = InstanceMetrics(num_blocks=200_000, block_size=16)


def _request(rng: random.Random, session: int, turn: int) -> Request:
    prefix = [rng.getrandbits(63) for _ in range(PROMPT_BLOCKS)]
    return Request(
        request_id=f"s{session}-t{turn}",
        session_id=f"s{session}",
        workload_class=CLASSES[session % 3],
        group_id=f"g{session // 8}",
        prompt_tokens=PROMPT_BLOCKS * 16,
        block_hashes=tuple(prefix),
        prompt_text="system prompt " * 8 + f"task {session} turn {turn}",
    )


def _view() -> ClusterView:
    return ClusterView(tuple(InstanceView(w, in_flight=10, metrics=METRICS, metrics_age_s=0.5) for w in INSTANCES))


def measure_policy(name: str, decisions: int, seed: int) -> dict[str, list[float]]:
    """Fill ``name`` with 10,000 sessions, then time ``decisions`` decide() calls.

    Returns microseconds per call: ``new`` and ``continuation`` in thread CPU time (the
    policy's own cost; this 2-core machine is shared, and a preempted call would count the
    other processes' 4 ms scheduler slices), ``wall`` in wall-clock time for all calls.
    """
    rng = random.Random(seed)
    policy = make_policy(name)
    view = _view()
    now = 0.0
    for w in INSTANCES:
        policy.observe(MetricsSampled(w, METRICS, now))
    protected: list[Request] = []
    for s in range(SESSIONS):
        r = _request(rng, s, 0)
        decision = policy.decide(r, view, now)
        if not isinstance(decision, Hold):
            policy.observe(RequestStarted(r, decision.instance, now))
            policy.observe(BlocksStored(decision.instance, r.block_hashes, now))
            protected.append(r)
        now += 0.001
    for w in INSTANCES:
        policy.observe(MetricsSampled(w, METRICS, now + 0.5))  # pending -> active
    times: dict[str, list[float]] = {"new": [], "continuation": [], "wall": []}
    next_session = SESSIONS
    gc.collect()
    for i in range(decisions):
        now += 0.01
        if i % 2 and protected:
            old = protected[rng.randrange(len(protected))]
            r = Request(f"{old.request_id}+{i}", old.session_id, old.workload_class, old.group_id,
                        prompt_tokens=old.prompt_tokens, block_hashes=old.block_hashes, prompt_text=old.prompt_text)  # fmt: skip
            kind = "continuation"
        else:
            r, kind = _request(rng, next_session, 0), "new"
            next_session += 1
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        decision = policy.decide(r, view, now)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        times[kind].append((c1 - c0) / 1000)
        times["wall"].append((w1 - w0) / 1000)
        if kind == "new" and not isinstance(decision, Hold):
            ended = protected.pop(rng.randrange(len(protected))) if protected else None
            if ended is not None:
                policy.observe(SessionEnded(ended.session_id, now))
            policy.observe(RequestStarted(r, decision.instance, now))
            protected.append(r)
    tracked = policy.state().get("ledger_sizes", {}).get("tracked")
    times["tracked_sessions"] = [float(tracked)] if tracked is not None else []
    return times


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _rss_mb() -> float:
    """Current RSS in MB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def memory_child() -> None:
    """Run in a fresh process: RSS before/after 10,000 sessions and 1,000,000 index blocks."""
    policy = make_policy("misa_t")
    gc.collect()
    base = _rss_mb()
    rng = random.Random(1)
    view = _view()
    for w in INSTANCES:
        policy.observe(MetricsSampled(w, METRICS, 0.0))
    for s in range(SESSIONS):
        r = Request(f"s{s}-t0", f"s{s}", CLASSES[s % 3], f"g{s // 8}", prompt_tokens=512)
        decision = policy.decide(r, view, 0.0)
        if not isinstance(decision, Hold):
            policy.observe(RequestStarted(r, decision.instance, 0.0))
    chunk = 1000
    for start in range(0, 1_000_000, chunk):
        policy.index.store(INSTANCES[(start // chunk) % 4], [rng.getrandbits(64) for _ in range(chunk)])
    gc.collect()
    print(json.dumps({"rss_mb": _rss_mb(), "added_mb": _rss_mb() - base, "blocks": len(policy.index),
                      "sessions": len(policy.session_ledger)}))  # fmt: skip


def main() -> None:
    parser = CommandParser(prog="python -m bench.router_decision", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=4000,
                        help="timed decide() calls per policy, at least 2 (new sessions and continuations alternate)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=Path("runs/bench/router_decision.png"))
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child()
        return
    _check_args(args)
    console = Console(width=150)
    results = {}
    for name in tqdm(POLICY_NAMES, desc="policies", file=sys.stderr):
        results[name] = measure_policy(name, args.decisions, args.seed)
    mem = json.loads(
        subprocess.run([sys.executable, "-m", "bench.router_decision", "--memory-child"], check=True,
                       capture_output=True, text=True).stdout  # fmt: skip
    )
    base_p99 = _pct(results["round_robin"]["new"] + results["round_robin"]["continuation"], 99)
    table = Table(
        title=f"decide() latency in us (thread CPU time; wall-clock last), 4 instances, "
        f"{SESSIONS:,} sessions, {args.decisions} calls per policy; rr = round_robin"
    )
    for col in ("policy", "sessions", "new p50", "new p99", "cont p50", "cont p99", "all p99",
                f"goal p99<={GOAL_P99_US:.0f}", "p99/rr", "wall p50", "wall p99"):  # fmt: skip
        table.add_column(col, justify="right")
    for name, t in results.items():
        every = t["new"] + t["continuation"]
        p99 = _pct(every, 99)
        tracked = f"{t['tracked_sessions'][0]:,.0f}" if t["tracked_sessions"] else "-"
        table.add_row(
            name, tracked, f"{_pct(t['new'], 50):.1f}", f"{_pct(t['new'], 99):.1f}", f"{_pct(t['continuation'], 50):.1f}",
            f"{_pct(t['continuation'], 99):.1f}", f"{p99:.1f}", "met" if p99 <= GOAL_P99_US else "MISSED",
            f"{p99 / base_p99:.1f}x", f"{_pct(t['wall'], 50):.1f}", f"{_pct(t['wall'], 99):.1f}",
        )  # fmt: skip
    console.print(table)
    mem_table = Table(title="memory: misa_t, 10,000 sessions + prefix index of 1,000,000 blocks (fresh process)")
    for col in ("sessions", "index blocks", "process RSS MB", "added by ledger+index MB", f"goal <= {GOAL_RSS_MB:.0f} MB"):
        mem_table.add_column(col, justify="right")
    mem_table.add_row(
        f"{mem['sessions']:,}", f"{mem['blocks']:,}", f"{mem['rss_mb']:.0f}", f"{mem['added_mb']:.0f}",
        "met" if mem["rss_mb"] <= GOAL_RSS_MB else "MISSED",
    )  # fmt: skip
    console.print(mem_table)
    plot(results, args.plot)
    console.print(f"plot: {args.plot}")


def _check_args(args) -> None:
    """Refuse values no run can use, naming the option (SystemExit 2, before anything runs)."""
    if args.decisions < 2:
        raise usage_error(f"--decisions must be at least 2 (the timed calls alternate new sessions and "
                          f"continuations, and each kind needs one), got {args.decisions}")
    check_plot_path(args.plot, "router_decision.png")


def plot(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    """Bar chart of p50/p99 per policy with the p99 goal line, saved to ``path`` (its folder
    made by ``check_plot_path`` before the timing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    every = [results[n]["new"] + results[n]["continuation"] for n in names]  # thread CPU time
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([x - 0.2 for x in xs], [_pct(e, 50) for e in every], width=0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [_pct(e, 99) for e in every], width=0.4, label="p99")
    ax.axhline(GOAL_P99_US, color="red", linestyle="--", label=f"goal p99 {GOAL_P99_US:.0f} us")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("decide() thread CPU time (us)")
    ax.set_title(f"4 instances, {SESSIONS:,} tracked sessions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
