"""Rollout workers: turn rollout units into model requests and finished samples (DESIGN.md step 3).

- ``SingleTurnWorker`` (rlvr, rlhf): one ``/v1/completions`` call through the router on
  the prompt rendered with the model's chat template (token ids in, token ids and
  log-probs out, so the trainer sees exactly what was sampled), then the unit's reward.
- ``AgentWorker`` (agent): hands the unit to the agent server, which runs the multi-turn
  loop in a sandbox through the router and returns the token-level trajectory with its
  loss mask, log-probs, reward and per-turn timing.

Both return a ``UnitResult``; neither raises for a failed model call or episode: the
result says ``ok=False`` with the error and a short ``drop_reason``, and the trainer drops
the unit (never scored, never trained on), logs why and counts it per reason. A completion
the engine aborted (a weight sync with ``pause_mode=abort``) is such a failure: it was cut
wherever the pause found it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import httpx

from agents.client import AgentClientError, AgentServerClient
from agents.loop import EpisodeResult
from rollout.client import ModelCallError, ModelClient
from rl.grpo import TrainSample
from rl.sampler import RolloutUnit


@dataclass
class UnitResult:
    """One finished (or failed) rollout unit.

    Attributes:
        unit: the unit as released.
        ok: False when the model call or episode failed (``error`` says why).
        drop_reason: when not ok, a short name of why, for the per-reason counts
            (``aborted``, ``model_error``, ``prompt_too_long``, ``agent_timeout``,
            ``agent_server_error``, ``agent_<episode status>``, ``agent_empty_trajectory``).
        reward: scalar reward (0.0 when not ok).
        prompt_ids / completion_ids: the token sequence (completion = everything after
            the first prompt; for agents, observations included).
        logprobs: engine log-prob per completion token (0.0 where the engine gave none
            or where ``loss_mask`` is 0).
        loss_mask: 1 on the model's own tokens; None = all of them.
        text: the (last) model answer as text, for logs.
        num_requests: model calls the unit made.
        model_s / tool_s: time in model calls and between them (tool gaps), seconds.
        finished_at_s: monotonic time the unit finished.
        info: extras for logs (status, finish reason, ...).
    """

    unit: RolloutUnit
    ok: bool
    reward: float = 0.0
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] | None = None
    text: str = ""
    num_requests: int = 0
    model_s: float = 0.0
    tool_s: float = 0.0
    finished_at_s: float = 0.0
    error: str = ""
    drop_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def train_sample(self, advantage: float) -> TrainSample:
        """The GRPO training record of this unit with its group-normalised advantage."""
        return TrainSample(prompt_ids=self.prompt_ids, completion_ids=self.completion_ids,
                           old_logprobs=self.logprobs, advantage=float(advantage),
                           loss_mask=self.loss_mask, policy_version=self.unit.policy_version)


class SingleTurnWorker:
    """Runs single-turn units (rlvr, rlhf) through the router.

    Args:
        client: completions client bound to the router (shared connection pool).
        tokenizer: the served model's HF tokenizer (chat template, end token).
        rewards: ``async score(prompts, completions) -> list[float]`` (``rl.reward_pool.RewardPool``).
        max_tokens: workload class -> output token limit.
        max_model_len: the engines' context length; prompts are cut to leave room.
    """

    def __init__(self, client: ModelClient, tokenizer, rewards,
                 *, max_tokens: Mapping[str, int], max_model_len: int):
        self.client = client
        self.tok = tokenizer
        self.rewards = rewards
        self.max_tokens = dict(max_tokens)
        self.max_model_len = int(max_model_len)
        self.end_token_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def render(self, unit: RolloutUnit) -> list[int]:
        """Prompt token ids: the unit's messages through the chat template."""
        ids = self.tok.apply_chat_template(list(unit.prompt.messages), tokenize=True,
                                           add_generation_prompt=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    async def run(self, unit: RolloutUnit) -> UnitResult:
        prompt_ids = self.render(unit)
        limit = int(self.max_tokens.get(unit.workload_class, 128))
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            return UnitResult(unit, False, error=f"prompt of {len(prompt_ids)} tokens leaves no "
                              f"room under max_model_len={self.max_model_len}",
                              drop_reason="prompt_too_long", finished_at_s=time.monotonic())
        try:
            c = await self.client.complete(prompt_ids, min(limit, room), self.end_token_id,
                                           unit.session(), session_end=True)
        except ModelCallError as e:
            return UnitResult(unit, False, error=str(e), drop_reason=e.reason, num_requests=1,
                              finished_at_s=time.monotonic())
        ids = c.token_ids
        text = self.tok.decode(ids[:-1] if ids and ids[-1] == self.end_token_id else ids)
        reward = (await self.rewards.score([unit.prompt], [text]))[0]
        return UnitResult(unit, True, reward=reward, prompt_ids=prompt_ids, completion_ids=ids,
                          logprobs=[lp if lp is not None else 0.0 for lp in c.logprobs],
                          text=text, num_requests=1, model_s=c.model_s,
                          finished_at_s=time.monotonic(),
                          info={"finish_reason": c.finish_reason})


class AgentWorker:
    """Runs agent units as episodes on the agent server.

    Args:
        client: the agent server's client.
        router_url: where the episode's model calls go.
        model: served model name.
        limits: per-episode limits sent with each request (see agents.loop.EpisodeLimits).
        sampling: request fields of the episode's model calls (``trainer.sampling``: the
            same temperature and top_p as the single-turn classes); None = the agent
            server's own ``sampling``.
    """

    def __init__(self, client: AgentServerClient, router_url: str, model: str,
                 *, limits: Mapping[str, Any] | None = None,
                 sampling: Mapping[str, Any] | None = None):
        self.client = client
        self.router_url = router_url
        self.model = model
        self.limits = dict(limits or {})
        self.sampling = dict(sampling) if sampling is not None else None

    async def run(self, unit: RolloutUnit) -> UnitResult:
        iid = unit.prompt.metadata.get("instance_id")
        try:
            ep = EpisodeResult.from_dict(await self.client.run_episode(
                instance_id=iid, session_id=unit.session_id, group_id=unit.group_id,
                unit_id=unit.unit_id, policy_version=unit.policy_version,
                router_url=self.router_url, model=self.model, limits=self.limits,
                **({"sampling": self.sampling} if self.sampling is not None else {})))
        except (AgentClientError, OSError, httpx.HTTPError, ValueError) as e:
            timed_out = isinstance(e, httpx.TimeoutException) or isinstance(
                e.__cause__, httpx.TimeoutException)
            return UnitResult(unit, False, error=str(e) or type(e).__name__,
                              drop_reason="agent_timeout" if timed_out else "agent_server_error",
                              finished_at_s=time.monotonic())
        failed = ep.status in ("model_error", "sandbox_error")
        ok = not failed and bool(ep.completion_ids)
        reason = "" if ok else f"agent_{ep.status}" if failed else "agent_empty_trajectory"
        return UnitResult(
            unit, ok, reward=float(ep.reward) if ok else 0.0,
            prompt_ids=ep.prompt_ids, completion_ids=ep.completion_ids,
            logprobs=[lp if lp is not None else 0.0 for lp in ep.logprobs],
            loss_mask=ep.loss_mask, text=ep.patch[:2000],
            num_requests=len(ep.turns), model_s=ep.model_s, tool_s=ep.tool_s,
            finished_at_s=time.monotonic(), error=ep.error, drop_reason=reason,
            info={"status": ep.status, "instance_id": ep.instance_id})
