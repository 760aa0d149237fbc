"""Solve rate of agent tasks with the real model, in GRPO groups, through the real stack.

    python -m bench.agent_solve_rate [--sets constant_fix_l1 constant_fix_l2 ...]
                                     [--group-size 4] [--repeats 1] [--engine-url URL]
                                     [--agent-overrides 'episode.demonstrations=[]']

Why: agent groups whose rewards are all equal carry no gradient, and the 135M model solved
none of the bug-injected or hand-made tasks, so the agent class gave no signal. This runs
each task of each set ``--group-size`` times (one GRPO group per task and repeat) as the
trainer does: one real vLLM engine (started here unless ``--engine-url``), our router
(the default recipe's policy) in front of it, and the agent server with the sandbox, with
the default recipe's episode limits (``trainer.agent_limits``), sampling
(``trainer.sampling``) and tool listing (``agents.tool_listing``). Prints per set:
episodes, mean reward, solved share, the share of
groups with unequal rewards (those train), how many episodes made a well-formed tool call
and a ``str_replace``, and the episodes' end states; writes every result, with the text of
each model turn, to ``--out``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from agents.chat import HFTokenizer
from agents.client import AgentServerClient, launch_agent_server
from agents.envs.task import load_tasks
from agents.server import BUILTIN_TASK_SETS, episode_config, task_set_path
from agents.server import VALUE_RULES as AGENT_SERVER_RULES
from common.config import check_values, compose, usage_error, CommandParser
from rollout.model import resolve_model_path

SERVED = "smollm2-135m"


def group_figures(groups: Sequence[Sequence[dict]]) -> dict[str, float]:
    """Figures of episode results grouped as GRPO groups (each a list of result dicts).

    Returns:
        ``episodes``, ``mean_reward``, ``solved_share`` (reward 1), ``informative_groups``
        (share of groups whose rewards are not all equal), ``tool_call_share`` (episodes
        with at least one parsed tool call), ``str_replace_share``.
    """
    eps = [r for g in groups for r in g]
    n = max(len(eps), 1)
    calls = [[c for t in r["turns"] for c in t["tool_calls"]] for r in eps]
    return {"episodes": len(eps),
            "mean_reward": sum(r["reward"] for r in eps) / n,
            "solved_share": sum(r["reward"] >= 1.0 for r in eps) / n,
            "informative_groups": sum(len({r["reward"] for r in g}) > 1 for g in groups)
            / max(len(groups), 1),
            "tool_call_share": sum(bool(c) for c in calls) / n,
            "str_replace_share": sum("str_replace" in c for c in calls) / n}


async def run_groups(agent_url: str, router_url: str, ids: list[str], group_size: int,
                     repeats: int, limits: dict, sampling: dict) -> list[list[dict]]:
    """Submit every group at once (the agent server bounds concurrency), wait for all."""
    client = AgentServerClient(agent_url)
    try:
        plan = [(iid, rep) for rep in range(repeats) for iid in ids]
        eids = [[await client.submit(instance_id=iid, group_id=f"{iid}/{rep}",
                                     unit_id=f"{iid}/{rep}/{j}", router_url=router_url,
                                     limits=limits, sampling=sampling)
                 for j in range(group_size)] for iid, rep in plan]
        return [list(await asyncio.gather(*(client.result(e, poll_s=60) for e in g)))
                for g in eids]
    finally:
        await client.aclose()


def model_turns(result: dict, decode: Callable[[list[int]], str]) -> list[str]:
    """The text of each model turn of an episode result: its runs of model tokens
    (``loss_mask`` 1), decoded."""
    runs: list[list[int]] = []
    prev = 0
    for tok, m in zip(result["completion_ids"], result["loss_mask"]):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(tok)
        prev = m
    return [decode(r) for r in runs]


def write_results(out: Path, results: dict, limits: dict, sampling: dict, group_size: int,
                  decode: Callable[[list[int]], str], agent_overrides: Sequence[str] = ()) -> None:
    """Write the sets measured so far (figures, each episode's outcome and what the model
    wrote in each turn) to ``out``, with the settings they ran under (limits, sampling,
    group size, the agent server's overrides: tool listing, demonstrations)."""
    slim = {name: {"wall_s": res["wall_s"], "figures": group_figures(res["groups"]),
                   "groups": [[{k: r[k] for k in ("instance_id", "status", "reward", "patch")}
                               | {"tool_calls": [c for t in r["turns"] for c in t["tool_calls"]],
                                  "model_turns": model_turns(r, decode)}
                               for r in g] for g in res["groups"]]}
            for name, res in results.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"limits": limits, "sampling": sampling, "group_size": group_size,
                               "agent_overrides": list(agent_overrides), "sets": slim}, indent=1))


def main() -> None:
    ap = CommandParser(prog="python -m bench.agent_solve_rate", description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["constant_fix_l1", "constant_fix_l2",
                                                   "constant_fix_l3", "handmade"],
                    help=f"task sets ({', '.join(BUILTIN_TASK_SETS)}) or task files")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1, help="groups per task")
    ap.add_argument("--engine-url", default=None, help="a running engine (default: start one)")
    ap.add_argument("--overrides", nargs="*", default=[],
                    help="train-config overrides, e.g. trainer.sampling.temperature=1.0")
    ap.add_argument("--agent-overrides", nargs="*", default=[],
                    help="agent-server overrides (recipes/agent_server.yaml), e.g. "
                         "'episode.demonstrations=[]' (no worked example)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/agent_solve_rate.json"))
    args = ap.parse_args()
    try:
        cfg = compose("train", ["run_dir=runs/bench", *args.overrides])
    except ValueError as e:  # ConfigError: an unknown key, a malformed override
        raise usage_error(f"--overrides: {e}") from None
    tcfg = cfg.trainer
    limits = OmegaConf.to_container(tcfg.agent_limits, resolve=True)
    sampling = OmegaConf.to_container(tcfg.sampling, resolve=True)
    try:
        sets = {s: sorted(load_tasks(task_set_path(s))) for s in args.sets}
    except ValueError as e:  # AgentServerError, TaskError: a mistake in --sets, exit 2
        raise usage_error(e) from None
    agent_overrides = [f"episode.tool_listing={cfg.agents.tool_listing}", *args.agent_overrides]
    try:  # the agent server's own checks, before an engine starts
        acfg = compose("agent_server", agent_overrides)
        check_values(acfg, AGENT_SERVER_RULES)
        episode_config(acfg)
    except ValueError as e:  # ConfigError, AgentServerError
        raise usage_error(f"--agent-overrides: {e}") from None
    model_path = resolve_model_path(cfg.model)
    decode = HFTokenizer(str(model_path)).decode
    logs = args.out.parent / f"{args.out.stem}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    console = Console()
    pool = None
    from router.launch import start_router

    try:
        if args.engine_url is None:
            from rollout.engines import EnginePool

            ecfg = OmegaConf.load(Path(__file__).resolve().parent.parent / "recipes/engine/cpu.yaml")
            ecfg.num_engines, ecfg.kv_cache_space_gib, ecfg.max_num_seqs = 1, 1, 32
            pool = EnginePool.start(ecfg, model_path, SERVED, int(cfg.model.max_model_len),
                                    "float32", logs)
            engine_url, kv = pool.handles[0].url, [pool.handles[0].kv_events_endpoint]
        else:
            engine_url, kv = args.engine_url.rstrip("/"), []
        router = start_router(cfg.router, [engine_url], kv, model_path, logs)
        extra = "extra_tasks_paths=[" + ",".join(str(task_set_path(s)) for s in args.sets) + "]"
        try:
            with launch_agent_server(logs, [f"router_url={router.url}", f"tokenizer={model_path}",
                                            extra, "max_concurrent_episodes=32",
                                            *agent_overrides],
                                     start_timeout_s=120) as (_, agent_url):
                results = {}
                for name, ids in sets.items():
                    t0 = time.monotonic()
                    groups = asyncio.run(run_groups(agent_url, router.url, ids, args.group_size,
                                                    args.repeats, limits, sampling))
                    results[name] = {"groups": groups, "wall_s": time.monotonic() - t0}
                    console.print(f"{name}: {len(groups)} groups in {results[name]['wall_s']:.0f} s: "
                                  f"{group_figures(groups)}")
                    write_results(args.out, results, limits, sampling, args.group_size, decode,
                                  agent_overrides)
        finally:
            router.stop()
    finally:
        if pool is not None:
            pool.stop()
    table = Table(title=f"agent tasks, real model: groups of {args.group_size}, "
                        f"limits {limits}, sampling {sampling}")
    for col in ("set", "episodes", "mean reward", "solved", "informative groups",
                "tool call", "str_replace", "end states"):
        table.add_column(col, justify="right")
    for name, res in results.items():
        f = group_figures(res["groups"])
        states = Counter(r["status"] for g in res["groups"] for r in g)
        table.add_row(name, str(f["episodes"]), f"{f['mean_reward']:.3f}", f"{f['solved_share']:.0%}",
                      f"{f['informative_groups']:.0%}", f"{f['tool_call_share']:.0%}",
                      f"{f['str_replace_share']:.0%}",
                      ", ".join(f"{k} {v}" for k, v in states.most_common()))
    console.print(table)
    console.print(f"results: {args.out}; logs: {logs}")


if __name__ == "__main__":
    main()
