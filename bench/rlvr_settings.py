"""rlvr reward of the packaged model under different sampling settings, through a real engine.

    python -m bench.rlvr_settings [--prompts-per-domain 4] [--samples 4]
                                  [--settings train:1.0:1.0:192 eval:0.8:0.95:512]
                                  [--engine-url URL]

Why: the training reward of rlvr was 0.00 in the default run while ``rl.eval`` measured
pass@1 0.19 on held-out arithmetic. Both grade with ``rl.rewards.MathVerifyReward``; what
differs is the prompt mix (training draws GSM8K and arithmetic levels 1-5) and the
sampling (training: temperature 1.0, top_p 1.0, 192 tokens; evaluation: 0.8, 0.95, 512).
This draws the same prompts for every setting (arithmetic per level from the training
split, GSM8K train), samples each ``--samples`` times through the engine's completions
endpoint exactly as ``rl.workers.SingleTurnWorker`` does (chat template, token ids,
end token), grades with the training reward, and prints per setting and domain: mean
reward, the share of groups with mixed rewards (those carry GRPO signal), the share of
completions cut at the token limit, and the share with a ``\\boxed{}``. A setting is
``name:temperature:top_p:max_tokens``. The code domain is left out (its reward needs the
sandbox, and the 135M model solves none of its problems).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import httpx
import numpy as np
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from common.config import compose, CommandParser
from rl.data import ArithmeticSource, GSM8KSource
from rl.rewards import MathVerifyReward
from rollout.client import ModelClient
from router.headers import SessionHeaders
from rollout.model import resolve_model_path

SERVED = "smollm2-135m"


def parse_setting(text: str) -> tuple[str, float, float, int]:
    """``name:temperature:top_p:max_tokens`` -> its parts; SystemExit with the format on error."""
    try:
        name, t, p, m = text.split(":")
        return name, float(t), float(p), int(m)
    except ValueError:
        raise SystemExit(f"--settings {text!r}: give name:temperature:top_p:max_tokens, "
                         "e.g. train:1.0:1.0:192") from None


def draw_prompts(per_domain: int, gsm8k_path: str, seed: int = 0) -> dict[str, list]:
    """domain label (``arithmetic/L<level>``, ``gsm8k``) -> ``per_domain`` training prompts."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {}
    for level in range(1, 6):
        src = ArithmeticSource(levels=(level,))
        out[f"arithmetic/L{level}"] = [src.draw(rng) for _ in range(per_domain)]
    if Path(gsm8k_path).is_file():
        g = GSM8KSource(gsm8k_path, split="train")
        out["gsm8k"] = [g.draw(rng) for _ in range(per_domain)]
    return out


async def sample_setting(url: str, tok, prompts: dict[str, list], samples: int,
                         temperature: float, top_p: float, max_tokens: int,
                         concurrency: int) -> dict[str, list[tuple[list[float], int, int]]]:
    """domain -> one (rewards, cut count, boxed count) per prompt."""
    grade = MathVerifyReward()
    end_id = tok.convert_tokens_to_ids(tok.eos_token)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as http:
        client = ModelClient(http, url, SERVED, sampling={"temperature": temperature,
                                                           "top_p": top_p}, timeout_s=1800)

        async def one(p, j):
            ids = tok.apply_chat_template(list(p.messages), tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
            async with sem:
                c = await client.complete(ids, max_tokens, end_id,
                                          SessionHeaders(f"{p.prompt_id}-{j}", "rlvr"), True)
            out = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] == end_id else c.token_ids
            return tok.decode(out), c.finish_reason == "length"

        results: dict[str, list] = defaultdict(list)
        for domain, ps in prompts.items():
            done = await asyncio.gather(*(one(p, j) for p in ps for j in range(samples)))
            for i, p in enumerate(ps):
                group = done[i * samples:(i + 1) * samples]
                rewards = [grade(p, text) for text, _ in group]
                results[domain].append((rewards, sum(cut for _, cut in group),
                                        sum("\\boxed" in text for text, _ in group)))
        return results


def main() -> None:
    ap = CommandParser(prog="python -m bench.rlvr_settings", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-per-domain", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--settings", nargs="+", default=["train:1.0:1.0:192", "eval:0.8:0.95:512"])
    ap.add_argument("--engine-url", default=None, help="a running engine (default: start one)")
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    settings = [parse_setting(s) for s in args.settings]
    cfg = compose("train", ["run_dir=runs/bench"])
    model_path = resolve_model_path(cfg.model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    gsm8k = str(OmegaConf.to_container(cfg.trainer.domains.rlvr, resolve=True)["gsm8k"]["path"])
    prompts = draw_prompts(args.prompts_per_domain, gsm8k)
    pool = None
    url = args.engine_url
    if url is None:
        from rollout.engines import EnginePool

        ecfg = OmegaConf.load(Path(__file__).resolve().parent.parent / "recipes/engine/cpu.yaml")
        ecfg.num_engines, ecfg.kv_cache_space_gib, ecfg.max_num_seqs = 1, 1, args.concurrency
        pool = EnginePool.start(ecfg, model_path, SERVED, 2048, "float32",
                                Path(tempfile.mkdtemp(prefix="rlvr-settings-logs-")))
        url = pool.handles[0].url
    console = Console()
    try:
        for name, t, p, m in settings:
            res = asyncio.run(sample_setting(url, tok, prompts, args.samples, t, p, m,
                                             args.concurrency))
            table = Table(title=f"setting {name}: temperature {t}, top_p {p}, max_tokens {m} "
                                f"({args.prompts_per_domain} prompts x {args.samples} samples per domain)")
            for col in ("domain", "reward", "mixed groups", "cut at limit", "boxed"):
                table.add_column(col, justify="right")
            all_r, all_n = [], 0
            for domain, groups in res.items():
                n = len(groups) * args.samples
                rs = [r for g, _, _ in groups for r in g]
                all_r += rs
                all_n += n
                mixed = sum(len(set(g)) > 1 for g, _, _ in groups) / len(groups)
                table.add_row(domain, f"{sum(rs) / n:.3f}", f"{mixed:.0%}",
                              f"{sum(c for _, c, _ in groups) / n:.0%}",
                              f"{sum(b for _, _, b in groups) / n:.0%}")
            table.add_row("all", f"{sum(all_r) / all_n:.3f}", "", "", "")
            console.print(table)
    finally:
        if pool is not None:
            pool.stop()


if __name__ == "__main__":
    main()
