"""Episodes end to end: agent server -> model endpoint (scripted, or real via the router)
-> sandboxed tools -> reward, checking the trajectory and the session headers."""

import asyncio

import httpx
import pytest

from agents.chat import ByteTokenizer, ChatRenderer
from agents.client import AgentClientError, AgentServerClient, launch_agent_server
from agents.loop import EpisodeConfig, EpisodeLimits, run_episode
from rollout.client import ModelClient
from router.headers import SessionHeaders
from agents.scripted import SCRIPTED_LOGPROB, ScriptedServer, tool_call
from common.process import free_port

BYTE_LIMITS = ["tokenizer=byte", "episode.limits.max_context_tokens=65536",
               "episode.limits.max_tokens_per_turn=4096"]


def check_trajectory(result: dict) -> None:
    """Invariants of any episode result, real model or scripted."""
    n = len(result["completion_ids"])
    assert len(result["loss_mask"]) == n == len(result["logprobs"])
    model_tokens = sum(t["completion_tokens"] for t in result["turns"])
    assert sum(result["loss_mask"]) == model_tokens
    assert all((lp is None) == (m == 0) for lp, m in zip(result["logprobs"], result["loss_mask"]))
    # each turn's prompt is the trajectory so far: prompt lengths grow by what was added
    p0 = len(result["prompt_ids"])
    assert result["turns"][0]["prompt_tokens"] == p0
    for a, b in zip(result["turns"], result["turns"][1:]):
        assert b["prompt_tokens"] > a["prompt_tokens"] + a["completion_tokens"]
    assert result["model_s"] > 0 and result["tool_s"] >= 0
    assert 0 < result["model_time_fraction"] <= 1


def check_session_headers(requests, result: dict, group_id: str, unit_id: str) -> None:
    """Every call carries the episode's session headers; only the last closes it."""
    mine = [(h, b) for h, b in requests if h.get("X-Session-Id") == result["session_id"]]
    assert len(mine) == len(result["turns"]) + (1 if result["session_closed_by_extra_request"] else 0)
    for h, _ in mine:
        assert h["X-Workload-Class"] == "agent"
        assert h["X-Group-Id"] == group_id and h["X-Rollout-Unit"] == unit_id
    assert [h.get("X-Session-End") for h, _ in mine] == [None] * (len(mine) - 1) + ["1"]
    full = result["prompt_ids"] + result["completion_ids"]
    for _, body in mine:  # exact ids: every prompt sent is a prefix of the final trajectory
        assert full[: len(body["prompt"])] == body["prompt"]


async def episode_via_agent_server(router_url: str, overrides: list[str], tmp_path,
                                   **request) -> dict:
    """The shared end-to-end body: start the agent server against ``router_url``, run one
    episode, check the trajectory invariants, return the result."""
    with launch_agent_server(tmp_path, [f"router_url={router_url}", *overrides],
                             start_timeout_s=120) as (_, url):
        client = AgentServerClient(url)
        try:
            result = await client.run_episode(**request)
        finally:
            await client.aclose()
    assert result["status"] in ("submitted", "turn_limit", "context_limit"), result["error"]
    assert result["reward"] in (0.0, 1.0)
    check_trajectory(result)
    assert all(isinstance(lp, float) for lp, m in
               zip(result["logprobs"], result["loss_mask"]) if m)
    return result


async def test_scripted_episode_end_to_end(model_base_url, scripted_server, tmp_path):
    result = await episode_via_agent_server(model_base_url, BYTE_LIMITS, tmp_path,
                                            instance_id="handmade__stats_mean",
                                            group_id="g-1", unit_id="u-1", policy_version=7)
    assert result["status"] == "submitted" and result["reward"] == 1.0
    assert result["policy_version"] == 7 and "+    return total(xs) / len(xs)" in result["patch"]
    assert set(result["logprobs"]) == {None, SCRIPTED_LOGPROB}
    check_session_headers(scripted_server.requests, result, "g-1", "u-1")


async def test_submit_and_poll_runs_episodes_concurrently(model_base_url, scripted_server, tmp_path):
    with launch_agent_server(tmp_path, [f"router_url={model_base_url}", *BYTE_LIMITS]) as (_, url):
        client = AgentServerClient(url)
        try:
            assert "handmade__stats_mean" in await client.tasks()
            ids = [await client.submit(instance_id=iid, group_id="g-2", unit_id=f"u-2-{i}")
                   for i, iid in enumerate(["handmade__text_slug", "handmade__stats_mean"] * 2)]
            polled = await asyncio.gather(*(client.result(e, poll_s=5) for e in ids))
            with pytest.raises(AgentClientError, match="unknown instance_id"):
                await client.run_episode(instance_id="nope")
            with pytest.raises(AgentClientError, match="no episode"):
                await client.result(ids[0])  # a fetched result is gone
            metrics = (await client.http.get(url + "/metrics")).text
            assert 'agent_episodes_total{status="submitted"} 4.0' in metrics
        finally:
            await client.aclose()
    assert [r["reward"] for r in polled] == [1.0] * 4
    assert len({r["session_id"] for r in polled}) == 4
    for i, r in enumerate(polled):
        check_session_headers(scripted_server.requests, r, "g-2", f"u-2-{i}")


async def run_scripted(policy, task, limits: EpisodeLimits, url: str | None = None):
    """Run one episode in-process against a scripted server with ``policy`` (or against
    ``url`` instead); returns (EpisodeResult, the server with its recorded requests)."""
    server = ScriptedServer(policy)
    runner, server.url = await server.start()
    try:
        async with httpx.AsyncClient() as http:
            client = ModelClient(http, url or server.url, "scripted", retries=0)
            result = await run_episode(task, SessionHeaders("s-inline", "agent", group_id="g", unit_id="u"),
                                       client, ChatRenderer(ByteTokenizer()),
                                       EpisodeConfig(limits=limits))
    finally:
        await runner.cleanup()
    return result, server


async def test_turn_limit_marks_the_last_model_call(handmade_tasks):
    result, server = await run_scripted(
        lambda s, turn, p: tool_call("bash", command=f"echo {turn}"),
        handmade_tasks["handmade__stats_mean"], EpisodeLimits(max_turns=3, max_context_tokens=65536))
    assert result.status == "turn_limit" and not result.session_closed_by_extra_request
    assert [t.session_end for t in result.turns] == [False, False, True]
    check_session_headers(server.requests, result.to_dict(), "g", "u")


async def test_malformed_model_output_never_crashes_the_episode(handmade_tasks):
    garbage = ["no tool here", "<tool_call>{bad json</tool_call>",
               '<tool_call>{"name": "explode", "arguments": {}}</tool_call>',
               '<tool_call>{"name": "read_file", "arguments": {"path": "/etc/shadow"}}</tool_call>',
               "<tool_call>" + "x" * 5000]
    result, _ = await run_scripted(
        lambda s, turn, p: garbage[turn] if turn < len(garbage) else tool_call("submit"),
        handmade_tasks["handmade__text_slug"],
        EpisodeLimits(max_turns=10, max_context_tokens=65536, max_tokens_per_turn=1000))
    assert result.status == "submitted" and result.reward == 0.0
    problems = [p for t in result.turns for p in t.problems]
    assert len(problems) == 4
    assert result.turns[4].finish_reason == "length"
    text = ByteTokenizer().decode(result.completion_ids)
    assert "outside the workspace" in text and "Unknown tool 'explode'" in text


async def test_context_limit_stops_before_overflowing(handmade_tasks):
    result, server = await run_scripted(
        lambda s, turn, p: tool_call("bash", command="seq 1 300"),
        handmade_tasks["handmade__stats_mean"], EpisodeLimits(max_turns=50, max_context_tokens=6000))
    assert result.status == "context_limit"
    assert len(result.prompt_ids) + len(result.completion_ids) <= 6000
    assert server.requests[-1][0]["X-Session-End"] == "1"


async def test_unreachable_model_endpoint_ends_with_model_error(handmade_tasks):
    result, _ = await run_scripted(lambda *a: "", handmade_tasks["handmade__stats_mean"],
                                   EpisodeLimits(max_context_tokens=65536),
                                   url=f"http://127.0.0.1:{free_port()}")
    assert result.status == "model_error" and "failed" in result.error
    assert result.turns == [] and result.reward == 0.0


@pytest.mark.engine
async def test_episode_through_real_router(real_router_url, tmp_path):
    """Same body with the real model: the tokenizer comes from the router's /v1/models."""
    await episode_via_agent_server(
        real_router_url, ["episode.limits.max_turns=3", "episode.limits.max_tokens_per_turn=96",
                          "sampling.temperature=0.7"],
        tmp_path, instance_id="handmade__stats_mean", group_id="g-real", unit_id="u-real")


async def test_health_answers_while_an_episode_workspace_holds_a_fifo(tmp_path):
    # The agent writes a FIFO; the host-side diff of its workspace must neither block on it
    # nor stall the server's event loop: /health keeps answering and the episode ends.
    def fifo_policy(_session: str, turn: int, _prompt: str) -> str:
        steps = [tool_call("bash", command="mkfifo pipe && echo changed > notes.txt"),
                 tool_call("submit")]
        return steps[min(turn, len(steps) - 1)]

    server = ScriptedServer(fifo_policy)
    runner, model_url = await server.start()
    try:
        with launch_agent_server(tmp_path, [f"router_url={model_url}", *BYTE_LIMITS],
                                 start_timeout_s=120) as (_, url):
            client = AgentServerClient(url)
            try:
                episode = asyncio.ensure_future(client.run_episode(instance_id="handmade__stats_mean"))
                health = []
                async with httpx.AsyncClient(timeout=60) as http:
                    while not episode.done():
                        health.append((await http.get(url + "/health")).status_code)
                        await asyncio.sleep(0.05)
                result = await asyncio.wait_for(episode, 300)
            finally:
                if not episode.done():  # /health timed out: the loop is stalled
                    episode.cancel()
                await asyncio.gather(episode, return_exceptions=True)
                await client.aclose()
    finally:
        await runner.cleanup()
    assert result["status"] == "submitted", result["error"]
    assert "+++ b/notes.txt" in result["patch"] and "pipe" not in result["patch"]
    assert health and set(health) == {200}
