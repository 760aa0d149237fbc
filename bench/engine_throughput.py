"""Output tokens/s of one real vLLM engine at 1 and 16 concurrent requests.

    python -m bench.engine_throughput [--concurrency 1 16] [--max-tokens 128] [--compiled]

Starts one engine with the packaged model (eager unless ``--compiled``), measures start
time, then for each concurrency level sends ``rounds x concurrency`` requests of
``--max-tokens`` output tokens (ignore_eos, so every request decodes the full length) and
prints output tokens/s and the ratio to the single-stream figure, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from common.config import compose, CommandParser
from rollout.engines import EnginePool
from rollout.model import resolve_model_path


async def _measure(url: str, model: str, concurrency: int, rounds: int, max_tokens: int) -> float:
    async with httpx.AsyncClient(timeout=600) as http:
        async def one(i: int) -> int:
            r = await http.post(f"{url}/v1/completions", json={
                "model": model, "prompt": f"Request {i}: write a long story about a lighthouse.",
                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0})
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        await one(-1)  # warm-up
        t0 = time.monotonic()
        tokens = 0
        for r in range(rounds):
            tokens += sum(await asyncio.gather(*(one(r * concurrency + i) for i in range(concurrency))))
        return tokens / (time.monotonic() - t0)


def main() -> None:
    ap = CommandParser(prog="python -m bench.engine_throughput", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--compiled", action="store_true", help="compiled mode (slow start) instead of eager")
    args = ap.parse_args()
    cfg = compose("train", ["run_dir=runs/bench"])
    ecfg = OmegaConf.create(OmegaConf.to_container(cfg.engine))
    ecfg.num_engines = 1
    ecfg.enforce_eager = not args.compiled
    model_path = resolve_model_path(cfg.model)
    console = Console()
    with tempfile.TemporaryDirectory() as logs:
        with EnginePool.start(ecfg, model_path, cfg.model.name, 2048, "float32", Path(logs)) as pool:
            h = pool.handles[0]
            console.print(f"engine up in {h.start_s:.1f} s ({'compiled' if args.compiled else 'eager'})")
            rows = []
            for c in args.concurrency:
                tps = asyncio.run(_measure(h.url, cfg.model.name, c, args.rounds, args.max_tokens))
                rows.append((c, tps))
    t = Table(title=f"one engine, {'compiled' if args.compiled else 'eager'}, {args.max_tokens} output tokens/request")
    for col in ("concurrent requests", "output tokens/s", "x single stream"):
        t.add_column(col, justify="right")
    for c, tps in rows:
        t.add_row(str(c), f"{tps:.1f}", f"{tps / rows[0][1]:.2f}")
    console.print(t)


if __name__ == "__main__":
    main()
