"""Proxy overhead of the live router, side by side in one run.

Against one fake engine with a fixed latency (``tests/router/fake_engine.py`` in its own
process), the same closed-loop load is sent to each target in turn:

- ``direct``: the engine itself;
- ``tcp-relay (floor)``: ``bench/tcp_relay.py``, a process that forwards bytes without
  parsing HTTP: what one more process hop costs on this machine, the floor of any router;
- ``ours/<policy>``: ``python -m router`` with that policy (misa_t and round_robin);
- ``vllm-router``: the real vLLM Router program (cache_aware).

Two phases: concurrency 1 with the targets interleaved request by request (added
latency: p50/p99 minus direct's; interleaving spreads machine drift over all targets
alike), then concurrency ``--concurrency`` per target in turn (throughput, requests/s,
and its ratio to vllm-router). All routers run for the whole benchmark.
Goals: p50 added <= 1 ms, throughput >= 0.7x vllm-router. Prints a table and saves a
bar chart.

    .venv/bin/python -m bench.router_proxy --requests 400 --concurrency 32 --delay-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import math
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

from common.config import EXIT_FAILURE, RECIPES_DIR, usage_error, CommandParser, check_plot_path
from common.process import ManagedProcess, ProcessStartError, free_port
from rollout.serve import stop_on_sigterm
from router.launch import REPO_ROOT, start_router
from router.policies import RouterConfigError, registered_policy_names


@dataclass
class Phase:
    """One target's latencies at concurrency 1 (ms) and throughput under load (requests/s)."""

    latencies_ms: list[float]
    throughput_rps: float

    def pct_ms(self, q: float) -> float:
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[int(q) - 1]


_BODY = b'{"model": "fake-model", "prompt": "' + b"word " * 200 + b'", "max_tokens": 4}'
# Single-turn rlvr units: each request is a whole session (closed when it finishes).
_HEADERS = {"Content-Type": "application/json", "X-Workload-Class": "rlvr", "X-Session-End": "1"}


async def _post(session: aiohttp.ClientSession, url: str, session_id: str) -> float:
    """One completion through ``url``; returns its latency in ms."""
    t0 = time.perf_counter()
    async with session.post(f"{url}/v1/completions", data=_BODY, headers={**_HEADERS, "X-Session-Id": session_id}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status} from {url}")
    return (time.perf_counter() - t0) * 1000


async def serial_latencies(urls: dict[str, str], n_requests: int) -> dict[str, list[float]]:
    """Concurrency 1, targets interleaved request by request (drift hits all alike); ms."""
    out: dict[str, list[float]] = {name: [] for name in urls}
    async with aiohttp.ClientSession() as session:
        for i in tqdm(range(n_requests), desc="c=1, interleaved", leave=False, file=sys.stderr):
            for name, url in urls.items():
                out[name].append(await _post(session, url, f"serial-{name}-{i}"))
    return out


async def throughput_rps(url: str, n_requests: int, concurrency: int, label: str) -> float:
    """Requests/s of ``n_requests`` sent by ``concurrency`` closed-loop workers."""
    remaining = iter(range(n_requests))
    bar = tqdm(total=n_requests, desc=label, leave=False, file=sys.stderr)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            for i in remaining:
                await _post(session, url, f"{label}-{i}")
                bar.update()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    bar.close()
    return n_requests / elapsed


def _check_args(args: argparse.Namespace) -> None:
    """Refuse values no run can use, naming the option (SystemExit 2, before anything starts)."""
    if args.requests < 2:
        raise usage_error(f"--requests must be at least 2 (the latency percentiles need 2 requests per "
                          f"target), got {args.requests}")
    if args.concurrency < 1:
        raise usage_error(f"--concurrency must be a positive integer, got {args.concurrency}")
    if not (math.isfinite(args.delay_ms) and args.delay_ms >= 0):
        raise usage_error(f"--delay-ms must be a number >= 0, got {args.delay_ms}")
    check_plot_path(args.plot, "router_proxy.png")


def main() -> None:
    parser = CommandParser(prog="python -m bench.router_proxy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="requests per phase and target (at least 2)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrency of the throughput phase")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="fake engine latency")
    parser.add_argument("--plot", type=Path, default=Path("runs/bench/router_proxy.png"))
    args = parser.parse_args()
    _check_args(args)
    stop_on_sigterm()  # SIGTERM -> SystemExit: the processes are stopped and the log folder removed
    try:
        # The processes' logs; removed on every way out (a failure's message holds the log's last lines).
        with tempfile.TemporaryDirectory(prefix="router-proxy-") as log_dir:
            results = measure(args, Path(log_dir))
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, or SIGTERM via stop_on_sigterm
        print("interrupted; every process started was stopped", file=sys.stderr)
        raise SystemExit(e.code if isinstance(e, SystemExit) else 130) from None
    except (ProcessStartError, RouterConfigError, RuntimeError, aiohttp.ClientError, OSError) as e:
        print(f"bench.router_proxy failed: {e}", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE) from None
    report(results, args)


def measure(args: argparse.Namespace, log_dir: Path) -> dict[str, Phase]:
    """Start the fake engine, the relay and the routers (logs in ``log_dir``), run both
    phases against every target, stop them all, and return each target's figures."""
    port = free_port()
    engine = ManagedProcess(
        "fake-engine", [sys.executable, "-m", "tests.router.fake_engine", "--port", str(port), "--delay-ms",
                        str(args.delay_ms)], log_dir / "engine.log", health_url=f"http://127.0.0.1:{port}/health",
        cwd=REPO_ROOT,
    )
    engine_url = f"http://127.0.0.1:{port}"
    routers: dict[str, dict] = {}
    for policy in ("misa_t", "round_robin"):
        if policy in registered_policy_names():
            routers[f"ours/{policy}"] = {"impl": "ours", "policy": policy, "params": {}}
        else:
            print(f"policy {policy} is not registered yet: skipped", file=sys.stderr)
    routers["vllm-router"] = OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / "router" / "vllm.yaml"))

    handles = []
    relay_port = free_port()
    relay = ManagedProcess(
        "tcp-relay", [sys.executable, "-m", "bench.tcp_relay", "--port", str(relay_port), "--target",
                      f"127.0.0.1:{port}"], log_dir / "relay.log", health_url=f"http://127.0.0.1:{relay_port}/health",
        cwd=REPO_ROOT,
    )
    try:
        engine.start()
        engine.wait_healthy(30, poll_s=0.2)
        relay.start()
        relay.wait_healthy(30, poll_s=0.2)
        urls = {"direct": engine_url, "tcp-relay (floor)": f"http://127.0.0.1:{relay_port}"}
        for name, cfg in routers.items():
            handles.append(start_router(cfg, [engine_url], [], None, log_dir / name.replace("/", "-")))
            urls[name] = handles[-1].url
        for name, url in urls.items():
            asyncio.run(throughput_rps(url, 50, 4, f"{name} warm-up"))
        serial = asyncio.run(serial_latencies(urls, args.requests))
        loaded = {name: asyncio.run(throughput_rps(url, args.requests, args.concurrency, f"{name} c={args.concurrency}"))
                  for name, url in urls.items()}
    finally:
        for handle in handles:
            handle.stop()
        relay.stop()
        engine.stop()
    return {name: Phase(serial[name], loaded[name]) for name in urls}


def report(results: dict[str, Phase], args: argparse.Namespace) -> None:
    """Print the side-by-side table and save the bar chart."""
    direct = results["direct"]
    vllm_rps = results["vllm-router"].throughput_rps if "vllm-router" in results else None
    table = Table(title=f"Router proxy overhead (fake engine {args.delay_ms:.0f} ms, {args.requests} requests/phase)")
    for col in ("target", "p50 ms", "p99 ms", "p50 added ms", "p99 added ms",
                f"req/s c={args.concurrency}", "x vllm-router"):
        table.add_column(col, justify="right" if col != "target" else "left")
    for name, r in results.items():
        ratio = f"{r.throughput_rps / vllm_rps:.2f}" if vllm_rps else "-"
        table.add_row(name, f"{r.pct_ms(50):.2f}", f"{r.pct_ms(99):.2f}", f"{r.pct_ms(50) - direct.pct_ms(50):+.2f}",
                      f"{r.pct_ms(99) - direct.pct_ms(99):+.2f}", f"{r.throughput_rps:.0f}", ratio)
    Console(width=120).print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], [results[n].pct_ms(50) - direct.pct_ms(50) for n in names], width=0.4, label="p50")
    ax1.bar([i + 0.2 for i in x], [results[n].pct_ms(99) - direct.pct_ms(99) for n in names], width=0.4, label="p99")
    ax1.set_xticks(list(x), names)
    ax1.set_ylabel("added latency at c=1 (ms)")
    ax1.legend()
    ax2.bar(names, [results[n].throughput_rps for n in names])
    ax2.set_ylabel(f"requests/s at c={args.concurrency}")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
