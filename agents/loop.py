"""The agent loop: model call -> parse tool calls -> run tools in the sandbox -> append the
observation -> next call, until the agent submits or a turn, token or time limit hits.

``run_episode`` never raises for what the model does; malformed tool calls become
feedback observations, a failing model endpoint or sandbox ends the episode with a
status. What it returns (``EpisodeResult``) is what GRPO needs: the token-level
trajectory with the model-token mask and log-probs, the reward, and per-turn timing
split into model time and tool time (the KV residency data of MISA-T Table 3).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Mapping

from agents.chat import ChatRenderer, Trajectory
from agents.envs.task import Task, evaluate
from rollout.client import ModelCallError, ModelClient
from router.headers import SessionHeaders
from agents.toolcall import ToolCallFormat, format_tool_call, parse_tool_calls
from agents.tools import TOOL_SPECS, Observation, Toolbox
from sandbox import IsolationConfig, Limits, SandboxError, Workspace

DEFAULT_SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. The repository is "
    "your working directory. Call one tool per answer, written as\n"
    "<tool_call>\n{{\"name\": TOOL, \"arguments\": {{...}}}}\n</tool_call>\n"
    "Tools:\n{tools}\nWhen the tests pass, call submit."
)



@dataclass(frozen=True)
class Demonstration:
    """One worked example shown before the task (an in-context example, as SWE-agent's
    ``demonstrations``): a problem statement as the user gives it and the one tool call
    that answers it, rendered as an earlier user turn and assistant turn of the same
    conversation.

    Why: with the tools' schemas alone SmolLM2-135M writes prose about the tools; shown
    one exchange it copies the call format (bench/agent_solve_rate.py, README "Agents,
    sandbox and tasks").

    Attributes:
        problem_statement: the user's text.
        tool: the tool called (a name in ``agents.tools.TOOL_SPECS``).
        arguments: the call's arguments.
    """

    problem_statement: str
    tool: str
    arguments: Mapping[str, Any]

    def exchange(self, fmt: ToolCallFormat = ToolCallFormat()) -> tuple[str, str]:
        """(user text, assistant text): the problem statement, and the call written in ``fmt``."""
        return self.problem_statement, format_tool_call(self.tool, self.arguments, fmt)

    def check(self, fmt: ToolCallFormat = ToolCallFormat()) -> None:
        """Refuse a call the episode's parser would not run (checked once, at start).

        Raises:
            ValueError: unknown tool, missing or unexpected argument.
        """
        calls, problems = parse_tool_calls(self.exchange(fmt)[1], TOOL_SPECS, fmt)
        if problems or len(calls) != 1:
            why = problems[0].feedback if problems else "no call"
            raise ValueError(f"demonstration calling {self.tool!r}: not a valid tool call ({why})")


DEFAULT_DEMONSTRATIONS: tuple[Demonstration, ...] = (
    Demonstration(
        problem_statement=("Line 3 of box/__init__.py reads `SIZE = 2`; the value must be 9. "
                           "Change that line to `SIZE = 9`."),
        tool="str_replace",
        arguments={"path": "box/__init__.py", "old_str": "= 2", "new_str": "= 9"}),
)
"""The agent server's default: one edit of a package that no built-in task has."""


@dataclass(frozen=True)
class EpisodeLimits:
    """When an episode stops (besides submit).

    Attributes:
        max_turns: model calls per episode.
        max_context_tokens: the whole trajectory must fit (the engine's max_model_len).
        max_tokens_per_turn: ``max_tokens`` of one model call.
        min_turn_tokens: a turn is not started with less room than this.
        max_episode_s: wall-clock limit; checked before each model call.
    """

    max_turns: int = 10
    max_context_tokens: int = 2048
    max_tokens_per_turn: int = 256
    min_turn_tokens: int = 16
    max_episode_s: float = 600.0


@dataclass(frozen=True)
class EpisodeConfig:
    """Everything fixed for all episodes of a server (Hydra group ``agent_server.episode``)."""

    limits: EpisodeLimits = EpisodeLimits()
    command_limits: Limits = Limits()
    test_limits: Limits = Limits(timeout_s=120, cpu_s=120, output_bytes=64 * 1024)
    isolation: IsolationConfig = IsolationConfig()
    tool_format: ToolCallFormat = ToolCallFormat()
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    demonstrations: tuple[Demonstration, ...] = DEFAULT_DEMONSTRATIONS
    tool_listing: str = "schemas"
    max_observation_chars: int = 2000
    workspace_root: str | None = None
    close_session_with_request: bool = True


@dataclass
class TurnRecord:
    """One model turn and the tools it called.

    Attributes:
        prompt_tokens: trajectory length sent as this call's prompt.
        completion_tokens: tokens the model produced.
        model_s: seconds of the model call (router hold + queue + prefill + decode).
        tool_s: seconds from the end of this call to the start of the next one (tool
            runs, parsing, rendering: the "tool/orchestration gap" of MISA-T Table 3);
            for the last turn, until the episode's last tool finished.
        tool_calls: names of the tools called (parsed successfully).
        problems: feedback given for malformed tool calls.
        finish_reason: the engine's (``stop``/``length``).
        session_end: this call carried ``X-Session-End: 1``.
    """

    prompt_tokens: int
    completion_tokens: int
    model_s: float
    tool_s: float = 0.0
    tool_calls: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    finish_reason: str = ""
    session_end: bool = False


@dataclass
class EpisodeResult:
    """What one agentic rollout unit returns to the trainer.

    Attributes:
        session_id, group_id, unit_id, policy_version: identity from the request.
        instance_id: the task.
        status: ``submitted``, ``turn_limit``, ``context_limit``, ``time_limit``,
            ``model_error`` or ``sandbox_error``.
        reward: 1.0 when the task's tests pass after the episode (MISA-T's agent reward,
            SWE-bench rule), else 0.0.
        prompt_ids: the first prompt (system, demonstrations, task).
        completion_ids: everything after it (model turns and observations).
        loss_mask: 1 for model tokens (trained on), 0 for observation/template tokens.
        logprobs: engine log-prob per response token; None off the mask.
        turns: per-turn records.
        model_s, tool_s: sums over turns; residency split of MISA-T Table 3.
        eval_s: seconds of the reward test run (after the session closed).
        test_outcomes: node id -> outcome of the reward run.
        patch: the agent's diff against the snapshot.
        error: message for model_error / sandbox_error.
    """

    session_id: str
    instance_id: str
    status: str
    reward: float
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    turns: list[TurnRecord]
    model_s: float
    tool_s: float
    eval_s: float
    wall_s: float
    group_id: str | None = None
    unit_id: str | None = None
    policy_version: int | None = None
    test_outcomes: dict[str, str] = field(default_factory=dict)
    patch: str = ""
    error: str = ""
    session_closed_by_extra_request: bool = False

    @property
    def model_time_fraction(self) -> float:
        """Share of the session's residency spent in model calls (MISA-T Table 3)."""
        total = self.model_s + self.tool_s
        return self.model_s / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the agent server's response body)."""
        d = asdict(self)
        d["model_time_fraction"] = self.model_time_fraction
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EpisodeResult":
        """The result again from ``to_dict``'s body (keys that are not fields, such as the
        derived ``model_time_fraction``, are ignored).

        Raises:
            ValueError: a field is missing, or the turns are malformed; the message says which.
        """
        names = {f.name for f in fields(cls)}
        missing = sorted(f.name for f in fields(cls) if f.default is MISSING
                         and f.default_factory is MISSING and f.name not in d)
        if missing:
            raise ValueError(f"episode result without {', '.join(missing)}")
        try:
            turns = [TurnRecord(**t) for t in d["turns"]]
        except TypeError as e:
            raise ValueError(f"episode result: malformed turns ({e})") from None
        return cls(**{k: v for k, v in d.items() if k in names and k != "turns"}, turns=turns)


TOOL_LISTINGS = ("schemas", "signatures")
"""How ``{tools}`` in the system prompt lists the tools: ``schemas``, each tool's JSON
function schema (what chat templates with tool support render; 482 tokens of SmolLM2's
tokenizer for the six tools), or ``signatures``, one line each, ``name(args): description``
(126 tokens): a shorter prompt for small models, whose training step must forward every
prompt token of every agent trajectory."""


def tools_prompt(system_prompt: str, listing: str = "schemas") -> str:
    """The system prompt with the tools filled in as ``listing`` (``TOOL_LISTINGS``).

    Raises:
        ValueError: ``listing`` is not one of ``TOOL_LISTINGS``.
    """
    if listing == "schemas":
        tools = "\n".join(json.dumps(s.as_json_schema()["function"]) for s in TOOL_SPECS.values())
    elif listing == "signatures":
        tools = "\n".join(s.signature() for s in TOOL_SPECS.values())
    else:
        raise ValueError(f"tool listing {listing!r}: choose one of {', '.join(TOOL_LISTINGS)}")
    return system_prompt.format(tools=tools)


async def run_episode(task: Task, session: SessionHeaders, client: ModelClient,
                      renderer: ChatRenderer, cfg: EpisodeConfig,
                      policy_version: int | None = None) -> EpisodeResult:
    """Run one episode of ``task`` to the end and score it.

    Args:
        task: the SWE-style task (snapshot, tests).
        session: session/group/unit ids for the router headers.
        client: model endpoint (the router).
        renderer: chat template + tokenizer of the served model.
        cfg: limits, tools, sandbox settings.
        policy_version: echoed into the result (the trainer's staleness bookkeeping).

    Returns:
        EpisodeResult; never raises for model, tool-call or sandbox failures.

    Raises:
        ValueError: ``cfg`` has a tool listing that is not one of ``TOOL_LISTINGS`` (the
            agent server checks it, and its demonstrations, when it starts:
            ``agents.server.episode_config``).
    """
    started = time.monotonic()
    lim = cfg.limits
    traj = Trajectory()
    traj.add_context(renderer.first_prompt(
        tools_prompt(cfg.system_prompt, cfg.tool_listing), task.problem_statement,
        [d.exchange(cfg.tool_format) for d in cfg.demonstrations]))
    traj.prompt_len = len(traj)
    turns: list[TurnRecord] = []
    status, error, reward, outcomes, patch, eval_s = "turn_limit", "", 0.0, {}, "", 0.0
    last_call_marked = closed_by_extra = False
    ws: Workspace | None = None
    try:
        # Host-side file work runs off the event loop (the agent server serves many
        # episodes and its /health on this loop): the copy here, the diff below.
        ws = await asyncio.to_thread(Workspace.create, task.snapshot, root=cfg.workspace_root,
                                     isolation=cfg.isolation, limits=cfg.command_limits)
        tools = Toolbox(ws, task, cfg.command_limits, max_observation_chars=cfg.max_observation_chars)
        for turn in range(lim.max_turns):
            room = lim.max_context_tokens - len(traj)
            if room < lim.min_turn_tokens:
                status = "context_limit"
                break
            if time.monotonic() - started > lim.max_episode_s:
                status = "time_limit"
                break
            last_call_marked = turn + 1 == lim.max_turns
            completion = await client.complete(
                traj.token_ids, min(lim.max_tokens_per_turn, room), renderer.end_token_id,
                session, session_end=last_call_marked)
            call_done = time.monotonic()
            record = TurnRecord(len(traj), len(completion.token_ids), completion.model_s,
                                finish_reason=completion.finish_reason,
                                session_end=last_call_marked)
            turns.append(record)
            traj.add_model(completion.token_ids, completion.logprobs)
            traj.add_context(renderer.close_model_turn(completion.token_ids))
            calls, problems = parse_tool_calls(renderer.model_text(completion.token_ids),
                                               TOOL_SPECS, cfg.tool_format)
            observations = [p.feedback for p in problems]
            record.problems = observations[:]
            submitted = False
            for call in calls:
                obs: Observation = await tools.call(call)
                record.tool_calls.append(call.name)
                if obs.ends_episode:
                    submitted = True
                    break
                observations.append(obs.text)
            record.tool_s = time.monotonic() - call_done
            if submitted:
                status = "submitted"
                break
            if turn + 1 == lim.max_turns:
                break
            observation_ids = renderer.observation_turn(observations)
            if len(traj) + len(observation_ids) + lim.min_turn_tokens > lim.max_context_tokens:
                # No room for another turn: the observation is never sent, so it is not
                # part of the trajectory either.
                status = "context_limit"
                break
            traj.add_context(observation_ids)
        if turns and not last_call_marked and cfg.close_session_with_request:
            # The router closes a session at the request marked X-Session-End. Whether a
            # call is the last is known only afterwards (the model submitted), so the
            # session is closed by one extra 1-token call on the final trajectory: its
            # prefix is cached (cheap) and the router sees the session's true length.
            try:
                await client.complete(traj.token_ids[: lim.max_context_tokens - 1], 1,
                                      renderer.end_token_id, session, session_end=True)
                closed_by_extra = True
            except ModelCallError as e:  # the trajectory is complete; only the close failed
                error = f"session close request failed: {e}"
        eval_started = time.monotonic()
        reward, report = await evaluate(ws, task, cfg.test_limits)
        outcomes, patch = report.outcomes, await ws.diff_async()
        eval_s = time.monotonic() - eval_started
    except ModelCallError as e:
        status, error = "model_error", str(e)
    except SandboxError as e:
        status, error = "sandbox_error", str(e)
    finally:
        if ws is not None:
            await ws.destroy()
    p = traj.prompt_len
    return EpisodeResult(
        session_id=session.session_id, instance_id=task.instance_id, status=status,
        reward=reward, prompt_ids=traj.token_ids[:p],
        completion_ids=traj.token_ids[p:], loss_mask=traj.loss_mask[p:],
        logprobs=traj.logprobs[p:], turns=turns,
        model_s=sum(t.model_s for t in turns), tool_s=sum(t.tool_s for t in turns),
        eval_s=eval_s, wall_s=time.monotonic() - started, group_id=session.group_id,
        unit_id=session.unit_id, policy_version=policy_version, test_outcomes=outcomes,
        patch=patch, error=error,
        session_closed_by_extra_request=closed_by_extra,
    )
