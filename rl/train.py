"""``python -m rl.train recipe=mixed_step router=misa-t``: the main job.

Until the asynchronous GRPO trainer lands (issue 8), this entry point brings up the
serving stack of the recipe (packaged model, real vLLM engines, the chosen router) and
sends real mixed rollout traffic through it: rlvr units (GSM8K questions, fanned out in
GRPO groups), rlhf units (open-ended instructions) and multi-turn agent sessions, each
call carrying the session headers of DESIGN.md. It reports per-class completions and
latency, the engines' own prefix-cache hit rate and the router's state, writes them to
the run folder, and stops everything it started.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import httpx
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rl.config import hydra_entry, register_user_error
from rollout.client import ClientError, RolloutClient, SessionTag
from rollout.serve import ServingStack, stop_on_sigterm

register_user_error(ClientError)

REPO_ROOT = Path(__file__).resolve().parent.parent

_RLHF_TEMPLATES = [
    "Write a short friendly note thanking a colleague for {x}.",
    "Explain {x} to a ten-year-old in three sentences.",
    "Give two pros and two cons of {x}.",
    "Write a haiku about {x}.",
]
_RLHF_TOPICS = ["code review", "rain", "public libraries", "bicycles", "sourdough bread",
                "the night sky", "learning a language", "recycling"]


def load_gsm8k_questions(data_dir: str | Path, split: str = "test") -> list[str]:
    """Questions of GSM8K ``split`` from ``<data_dir>/<split>.jsonl`` (relative to the repo root).

    Raises:
        FileNotFoundError: the file is missing (message names the path and the option).
    """
    path = Path(data_dir)
    if not path.is_absolute():
        path = (REPO_ROOT / path).resolve()
    f = path / f"{split}.jsonl"
    if not f.exists():
        raise FileNotFoundError(f"GSM8K file {f} not found: set recipe.data.gsm8k_dir to a "
                                "folder holding train.jsonl / test.jsonl")
    return [json.loads(line)["question"] for line in f.open() if line.strip()]


async def _rlvr_unit(client, tag, question, max_tokens):
    msgs = [{"role": "user", "content": question + "\nGive the final number after '####'."}]
    c = await client.chat(msgs, tag, session_end=True, max_tokens=max_tokens, temperature=1.0)
    return 1, c


async def _rlhf_unit(client, tag, prompt, max_tokens):
    c = await client.chat([{"role": "user", "content": prompt}], tag, session_end=True,
                          max_tokens=max_tokens, temperature=1.0)
    return 1, c


async def _agent_unit(client, tag, task, turns, max_tokens):
    """A multi-turn session with a growing prefix; observations stand in for tool output."""
    msgs = [{"role": "system", "content": "You fix bugs in a Python repository. Think step by step."},
            {"role": "user", "content": task}]
    c = None
    for t in range(turns):
        last = t == turns - 1
        c = await client.chat(msgs, tag, session_end=last, max_tokens=max_tokens, temperature=1.0)
        msgs.append({"role": "assistant", "content": c.text})
        msgs.append({"role": "user", "content": f"Observation {t + 1}: the test suite reported "
                     f"{t + 1} failing test(s) in module_{t}.py. Continue."})
        await asyncio.sleep(0.2)  # the tool gap: the session's KV stays resident meanwhile
    return turns, c


async def serving_check(stack: ServingStack, cfg: DictConfig, console: Console) -> dict:
    """Send ``serving_check.units`` mixed rollout units through the router; return figures."""
    sc, rc = cfg.serving_check, cfg.recipe
    rng = random.Random(int(cfg.seed))
    questions = load_gsm8k_questions(rc.data.gsm8k_dir)
    mixture = {k: float(v) for k, v in rc.mixture.items()}
    total = sum(mixture.values())
    g = int(rc.group_size)
    units = []  # (class, coroutine factory)
    released = {k: 0 for k in mixture}
    for i in range(int(sc.units)):
        # Largest deficit first: released counts track the target mixture.
        cls = max(mixture, key=lambda k: mixture[k] / total * (i + 1) - released[k])
        released[cls] += 1
        group = f"{cls}-g{i // g}"
        tag = SessionTag(f"{cls}-u{i}", cls, group_id=group, unit_id=f"u{i}")
        if cls == "rlvr":
            q = questions[(i // g) % len(questions)]
            units.append((cls, tag, lambda c, t=tag, q=q: _rlvr_unit(c, t, q, sc.max_tokens)))
        elif cls == "rlhf":
            p = rng.choice(_RLHF_TEMPLATES).format(x=rng.choice(_RLHF_TOPICS))
            units.append((cls, tag, lambda c, t=tag, p=p: _rlhf_unit(c, t, p, sc.max_tokens)))
        else:
            task = f"Issue #{i // g}: function parse_{i // g}() returns the wrong value for empty input."
            units.append((cls, tag, lambda c, t=tag, k=task: _agent_unit(c, t, k, int(sc.agent_turns), sc.max_tokens)))

    sem = asyncio.Semaphore(int(sc.concurrency))
    per_class = {k: {"units": 0, "requests": 0, "latency_s": [], "completion_tokens": 0} for k in mixture}
    t0 = time.monotonic()
    async with RolloutClient(stack.router_url, stack.served_model_name) as client:
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("rollout units", total=len(units))

            async def run(cls, tag, make):
                async with sem:
                    s = time.monotonic()
                    n_req, c = await make(client)
                    d = per_class[cls]
                    d["units"] += 1
                    d["requests"] += n_req
                    d["latency_s"].append(time.monotonic() - s)
                    d["completion_tokens"] += c.completion_tokens
                    progress.advance(bar)

            await asyncio.gather(*(run(*u) for u in units))
    wall_s = time.monotonic() - t0
    hits = queries = 0.0
    for url in stack.engines.urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    router_state = None
    try:
        r = httpx.get(f"{stack.router_url}/state", timeout=10)
        router_state = r.json() if r.is_success else None
    except (httpx.HTTPError, ValueError):
        router_state = None  # router=vllm has no /state
    return {"wall_s": wall_s, "per_class": per_class,
            "samples_per_min": sum(d["units"] for d in per_class.values()) / wall_s * 60,
            "requests_per_min": sum(d["requests"] for d in per_class.values()) / wall_s * 60,
            "prefix_hit_rate": hits / queries if queries else None,
            "router_state": router_state}


def _report(console: Console, res: dict, stack: ServingStack) -> None:
    t = Table(title=f"serving check through {stack.router_url}")
    for col in ("class", "units", "requests", "p50 s", "max s", "completion tokens"):
        t.add_column(col, justify="right")
    for cls, d in res["per_class"].items():
        lat = sorted(d["latency_s"]) or [0.0]
        t.add_row(cls, str(d["units"]), str(d["requests"]), f"{lat[len(lat) // 2]:.1f}",
                  f"{lat[-1]:.1f}", str(d["completion_tokens"]))
    console.print(t)
    hit = res["prefix_hit_rate"]
    console.print(f"samples/min {res['samples_per_min']:.1f}  requests/min {res['requests_per_min']:.1f}  "
                  f"prefix hit rate {hit:.1%}" if hit is not None else "prefix hit rate n/a")


@hydra_entry("train")
def main(cfg: DictConfig) -> None:
    stop_on_sigterm()
    console = Console()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    console.print(f"run folder: {run_dir}")
    with ServingStack(cfg, run_dir) as stack:
        console.print(f"engines up ({stack.timings_s.get('engines_s', 0):.0f} s): {stack.engines.urls}; "
                      f"router ({cfg.router.get('impl', 'ours')}) at {stack.router_url}")
        res = asyncio.run(serving_check(stack, cfg, console))
        res["startup_s"] = stack.timings_s
        (run_dir / "serving_check.json").write_text(json.dumps(res, indent=1, default=str))
        _report(console, res, stack)
    console.print(f"stopped; logs in {run_dir / 'logs'}")


if __name__ == "__main__":
    main()
