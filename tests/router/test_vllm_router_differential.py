"""The simulator's vllm_router against the installed vllm-router, placement by placement.

One scripted sequence shaped like a rollout (GRPO groups of 4 sharing a task prompt, agent
sessions sharing a system prompt, later turns that extend earlier ones) goes through the
real ``vllm-router`` (cache_aware, the thresholds ``router=vllm`` launches it with) in front
of two fake engines that tokenize (``/v1/completions/render``) and hold every request in
flight, so the router's load is exactly the count it has placed; the same sequence goes
through the policy with the same loads. Every placement must agree.
"""

from __future__ import annotations

import asyncio
import shutil

import aiohttp
import pytest
from omegaconf import OmegaConf

from common.config import REPO_ROOT
from router.replay import router_decisions
from router.launch import start_router
from router.policies import make_policy
from router.policies.base import ClusterView, InstanceView, Request
from tests.router.fake_engine import FakeEngine

pytestmark = pytest.mark.skipif(shutil.which("vllm-router") is None and not (REPO_ROOT / ".venv/bin/vllm-router").exists(),
                                reason="vllm-router is not installed")


def words(key: str, n: int) -> str:
    """``n`` distinct 6-character words (a space and 5 hex digits) for ``key``."""
    base = sum(map(ord, key)) * 7919
    return "".join(f" {(base + 104729 * i) % 0xFFFFF:05x}" for i in range(n))


def sequence() -> list[tuple[str, str, str]]:
    """(session id, class, prompt) in sending order."""
    out, history = [], {}
    system = words("system", 120)
    for g in range(8):
        cls = ("agent", "rlvr", "agent", "rlhf")[g % 4]
        for k in range(4):
            sid = f"g{g}s{k}"
            prompt = (system if cls == "agent" else "") + words(f"task{g}", 60) + words(f"own{sid}", 15)
            history[sid] = prompt
            out.append((sid, cls, prompt))
        for sid in [s for s in history if s.startswith(f"g{g - 2}s")] if g >= 2 and (g - 2) % 2 == 0 else []:
            history[sid] += " done" + words(f"obs{sid}{g}", 25)  # the next turn extends the last one
            out.append((sid, "agent", history[sid]))
    return out


async def through_real_router(reqs, cfg: dict, tmp_path, decisions: dict) -> list[int]:
    """Placements (engine index) of ``reqs``; ``decisions`` gets the router's own counts."""
    gate = asyncio.Event()
    engines = [FakeEngine(gate=gate) for _ in range(2)]
    urls = [await e.start() for e in engines]
    router = await asyncio.to_thread(start_router, cfg, urls, [], None, tmp_path)
    placed: list[int] = []
    tasks = []
    try:
        async with aiohttp.ClientSession() as http:
            for sid, cls, prompt in reqs:
                before = [len(e.received) for e in engines]
                body = {"model": "fake-model", "prompt": prompt, "max_tokens": 4}
                tasks.append(asyncio.ensure_future(http.post(f"{router.url}/v1/completions", json=body,
                                                             headers={"X-Session-Id": sid, "X-Workload-Class": cls})))
                for _ in range(3000):  # until an engine has it (held there: the router's load)
                    now = [len(e.received) for e in engines]
                    if now != before:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError(f"request {len(placed)} reached no engine in 30 s")
                placed.append(0 if now[0] != before[0] else 1)
            gate.set()
            for t in tasks:
                (await t).release()
            async with http.get(f"{router.metrics_url}/metrics") as r:
                decisions.update(router_decisions(await r.text()))
    finally:
        await asyncio.to_thread(router.stop)
        for e in engines:
            await e.stop()
    return placed


def through_mimic(reqs, cfg: dict, order: tuple[int, int], decisions: dict | None = None, **params) -> list[int]:
    """The policy on the same sequence; ``order``: the real router's worker order (its ties);
    ``decisions`` gets its branch counts."""
    policy = make_policy("vllm_router", {**{k: cfg[k] for k in ("cache_threshold", "balance_abs_threshold",
                                                                   "balance_rel_threshold")}, **params})
    in_flight = [0, 0]
    placed = []
    for i, (sid, cls, prompt) in enumerate(reqs):
        view = ClusterView(tuple(InstanceView(f"e{e}", in_flight=in_flight[e]) for e in order))
        d = policy.decide(Request(request_id=str(i), session_id=sid, workload_class=cls, prompt_text=prompt),
                          view, float(i))
        e = int(d.instance[1:])
        in_flight[e] += 1
        placed.append(e)
    if decisions is not None:
        decisions.update(policy.decisions)
    return placed


@pytest.mark.parametrize("balance_abs", [64, 3])
def test_mimic_places_every_request_where_the_real_router_does(balance_abs, tmp_path):
    cfg = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "recipes" / "router" / "vllm.yaml"))
    cfg["balance_abs_threshold"] = balance_abs
    reqs = sequence()
    real_decisions: dict[str, int] = {}
    real = asyncio.run(through_real_router(reqs, cfg, tmp_path, real_decisions))
    first = real[0]  # empty tree, equal loads: the first worker in the router's order
    mimic_decisions: dict[str, int] = {}
    mimic = through_mimic(reqs, cfg, (first, 1 - first), mimic_decisions)
    assert len(set(real)) == 2  # both engines used: the sequence exercises the rules
    diff = [(i, reqs[i][0], r, m) for i, (r, m) in enumerate(zip(real, mimic)) if r != m]
    assert not diff, f"{len(diff)} of {len(reqs)} placements differ (index, session, real, mimic): {diff[:8]}"
    # the router's own metrics (what bench.router_real scrapes) count the same branches
    assert real_decisions == mimic_decisions and sum(real_decisions.values()) == len(reqs)
    if balance_abs == 3:  # the sequence tells the rules apart: the legacy path's would not agree
        assert through_mimic(reqs, cfg, (first, 1 - first), match_rule="tree_owner", session_affinity=True) != real
