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


@pytest.mark.parametrize(("content", "says"), [
    (None, "does not exist"),
    ("", "holds no tasks"),
    ("not json\n", "is not a task file"),
    ('{"instance_id": "x"}\n', "is not a task file"),
    ("[1, 2]\n", "is not a task file"),
])
def test_a_tasks_path_the_agent_server_cannot_load_is_refused_before_anything_starts(content, says, tmp_path):
    from rl.train import validate_job_cfg

    tasks = tmp_path / "tasks.jsonl"
    if content is not None:
        tasks.write_text(content)
    cfg = compose("train", ["run_dir=runs/test", f"agents.tasks_path={tasks}"])
    with pytest.raises(ConfigError, match=f"agents.tasks_path={tasks}: {tasks} {says}.*python -m agents.envs.build"):
        validate_job_cfg(cfg)


def test_train_command_refuses_a_missing_tasks_path_with_one_line_and_leaves_no_run_folder(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import GSM8K_TINY_OVERRIDE, TESTS_DIR

    missing = tmp_path / "nonexistent.jsonl"
    r = subprocess.run([sys.executable, "-m", "rl.train", f"agents.tasks_path={missing}", GSM8K_TINY_OVERRIDE],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(TESTS_DIR.parent)})
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.startswith(f"error: agents.tasks_path={missing}: {missing} does not exist. "
                               "Build tasks with `python -m agents.envs.build`"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr + r.stdout
    assert list(tmp_path.iterdir()) == []  # no run folder: refused before the engines


def test_a_tasks_path_may_name_a_task_file_or_a_built_in_set():
    from agents.server import HANDMADE_TASKS
    from rl.train import check_tasks_path

    for ok in (None, "handmade", str(HANDMADE_TASKS)):
        check_tasks_path(ok)


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
