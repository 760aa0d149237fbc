"""Agent units as the job configures them: which task sets the agent server gets
(``agents.task_sets``), and that episodes sample with ``trainer.sampling`` like the
single-turn classes."""

import pytest

from common.config import ConfigError, compose
from rl.data.base import Prompt
from rl.sampler import RolloutUnit


def test_task_sets_become_the_agent_servers_task_files(tmp_path):
    from rl.train import agent_task_sets_override

    mine = tmp_path / "tasks.jsonl"
    mine.write_text("")
    assert agent_task_sets_override(["constant_fix_l1", str(mine)]) == \
        f"extra_tasks_paths=[constant_fix_l1,{mine}]"
    assert agent_task_sets_override([]) == "extra_tasks_paths=[]"


def test_an_unknown_task_set_is_refused_before_anything_starts():
    from rl.train import validate_job_cfg

    cfg = compose("train", ["run_dir=runs/test", "agents.task_sets=[constant_fix_l9]"])
    with pytest.raises(ConfigError, match="agents.task_sets: 'constant_fix_l9' is neither"):
        validate_job_cfg(cfg)


def test_an_unknown_tool_listing_is_refused_before_anything_starts():
    from rl.train import validate_job_cfg

    cfg = compose("train", ["run_dir=runs/test", "agents.tool_listing=json"])
    with pytest.raises(ConfigError, match="agents.tool_listing='json' is invalid: give schemas or signatures"):
        validate_job_cfg(cfg)


class RecordingAgentClient:
    """Answers every episode request with a one-turn solved episode; keeps the request."""

    def __init__(self) -> None:
        self.requests = []

    async def run_episode(self, **request):
        self.requests.append(request)
        return {"status": "submitted", "reward": 1.0, "instance_id": request["instance_id"],
                "prompt_ids": [1, 2], "completion_ids": [3, 4],
                "loss_mask": [1, 1], "logprobs": [-0.5, -0.25],
                "turns": [{"prompt_tokens": 2, "completion_tokens": 2, "model_s": 0.1, "tool_s": 0.0, "tool_calls": ["submit"]}], "model_s": 0.1, "tool_s": 0.0,
                "eval_s": 0.0, "wall_s": 0.1, "session_id": request["session_id"]}


async def test_agent_episodes_sample_with_the_trainers_sampling():
    from rl.workers import AgentWorker

    unit = RolloutUnit("u0", "s0", "g0", "agent", "swe", 0,
                       Prompt("swe/x", "swe", (), metadata={"instance_id": "x"}))
    client = RecordingAgentClient()
    sampling = {"temperature": 0.8, "top_p": 1.0}
    result = await AgentWorker(client, "http://router", "m", limits={"max_turns": 3}, sampling=sampling).run(unit)
    assert result.ok and result.reward == 1.0
    (req,) = client.requests
    assert req["sampling"] == sampling and req["limits"] == {"max_turns": 3}
    await AgentWorker(client, "http://router", "m").run(unit)
    assert "sampling" not in client.requests[-1]  # None: the agent server's own
