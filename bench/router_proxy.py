"""Proxy overhead of the live router, side by side in one run.

Against one fake engine with a fixed latency (``tests/router/fake_engine.py`` in its own
process), the same closed-loop load is sent to each target in turn:

- ``direct``: the engine itself;
- ``ours/<policy>``: ``python -m router`` with that policy (misa_t and round_robin);
- ``vllm-router``: the real vLLM Router program (cache_aware).

Two phases per target: concurrency 1 (added latency: p50/p99 minus direct's) and
concurrency ``--concurrency`` (throughput, requests/s, and its ratio to vllm-router).
Goals: p50 added <= 1 ms, throughput >= 0.7x vllm-router. Prints a table and saves a
bar chart.

    .venv/bin/python -m bench.router_proxy --requests 400 --concurrency 32 --delay-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from rollout.process import ManagedProcess, free_port
from router.__main__ import RECIPES_DIR
from router.launch import REPO_ROOT, start_router
from router.policies import registered_policy_names


@dataclass
class Phase:
    """Latencies (ms) and throughput (requests/s) of one load phase on one target."""

    latencies_ms: list[float]
    throughput_rps: float

    def pct_ms(self, q: float) -> float:
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[int(q) - 1]


async def load(url: str, n_requests: int, concurrency: int, label: str) -> Phase:
    """Send ``n_requests`` completions with ``concurrency`` workers in a closed loop."""
    body = b'{"model": "fake-model", "prompt": "' + b"word " * 200 + b'", "max_tokens": 4}'
    # Single-turn rlvr units: each request is a whole session (closed when it finishes).
    headers = {"Content-Type": "application/json", "X-Workload-Class": "rlvr", "X-Session-End": "1"}
    latencies: list[float] = []
    remaining = iter(range(n_requests))
    bar = tqdm(total=n_requests, desc=label, leave=False, file=sys.stderr)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            for i in remaining:
                t0 = time.perf_counter()
                async with session.post(f"{url}/v1/completions", data=body,
                                        headers={**headers, "X-Session-Id": f"{label}-{i}"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{label}: HTTP {r.status} from {url}")
                latencies.append((time.perf_counter() - t0) * 1000)
                bar.update()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    bar.close()
    return Phase(latencies, n_requests / elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="requests per phase and target")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrency of the throughput phase")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="fake engine latency")
    parser.add_argument("--plot", type=Path, default=Path("runs/bench/router_proxy.png"))
    args = parser.parse_args()

    log_dir = Path(tempfile.mkdtemp(prefix="router-proxy-"))
    port = free_port()
    engine = ManagedProcess(
        "fake-engine", [sys.executable, "-m", "tests.router.fake_engine", "--port", str(port), "--delay-ms",
                        str(args.delay_ms)], log_dir / "engine.log", health_url=f"http://127.0.0.1:{port}/health",
        cwd=REPO_ROOT,
    ).start()
    engine.wait_healthy(30, poll_s=0.2)
    engine_url = f"http://127.0.0.1:{port}"
    targets: list[tuple[str, dict | None]] = [("direct", None)]
    for policy in ("misa_t", "round_robin"):
        if policy in registered_policy_names():
            targets.append((f"ours/{policy}", {"impl": "ours", "policy": policy, "params": {}}))
        else:
            print(f"policy {policy} is not registered yet: skipped", file=sys.stderr)
    targets.append(("vllm-router", OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml"))))

    results: dict[str, tuple[Phase, Phase]] = {}
    try:
        for name, cfg in targets:
            handle = None
            if cfg is not None:
                handle = start_router(cfg, [engine_url], [], None, log_dir / name.replace("/", "-"))
            url = handle.url if handle else engine_url
            try:
                asyncio.run(load(url, 50, 4, f"{name} warm-up"))
                serial = asyncio.run(load(url, args.requests, 1, f"{name} c=1"))
                loaded = asyncio.run(load(url, args.requests, args.concurrency, f"{name} c={args.concurrency}"))
                results[name] = (serial, loaded)
            finally:
                if handle:
                    handle.stop()
    finally:
        engine.stop()
    report(results, args)


def report(results: dict[str, tuple[Phase, Phase]], args: argparse.Namespace) -> None:
    """Print the side-by-side table and save the bar chart."""
    direct = results["direct"][0]
    vllm_rps = results["vllm-router"][1].throughput_rps if "vllm-router" in results else None
    table = Table(title=f"Router proxy overhead (fake engine {args.delay_ms:.0f} ms, {args.requests} requests/phase)")
    for col in ("target", "p50 ms", "p99 ms", "p50 added ms", "p99 added ms",
                f"req/s c={args.concurrency}", "x vllm-router"):
        table.add_column(col, justify="right" if col != "target" else "left")
    for name, (serial, loaded) in results.items():
        ratio = f"{loaded.throughput_rps / vllm_rps:.2f}" if vllm_rps else "-"
        table.add_row(name, f"{serial.pct_ms(50):.2f}", f"{serial.pct_ms(99):.2f}",
                      f"{serial.pct_ms(50) - direct.pct_ms(50):+.2f}", f"{serial.pct_ms(99) - direct.pct_ms(99):+.2f}",
                      f"{loaded.throughput_rps:.0f}", ratio)
    Console(width=120).print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, [results[n][0].pct_ms(50) - direct.pct_ms(50) for n in names], label="p50")
    ax1.bar(names, [results[n][0].pct_ms(99) - direct.pct_ms(99) for n in names], alpha=0.4, label="p99")
    ax1.set_ylabel("added latency at c=1 (ms)")
    ax1.legend()
    ax2.bar(names, [results[n][1].throughput_rps for n in names])
    ax2.set_ylabel(f"requests/s at c={args.concurrency}")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
