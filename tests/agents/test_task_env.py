"""Task format, reward rule and tools against the committed hand-made tasks."""

import json

import pytest

from agents.envs.task import Task, TaskError, evaluate, load_tasks, parse_junit
from agents.server import HANDMADE_TASKS
from agents.toolcall import ToolCall
from agents.tools import Toolbox
from sandbox import Limits, Workspace


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(HANDMADE_TASKS)


async def test_reward_is_zero_on_snapshot_and_one_after_gold_patch(tasks, tmp_path):
    for task in tasks.values():
        async with Workspace.create(task.snapshot, root=tmp_path) as ws:
            reward, report = await evaluate(ws, task)
            assert reward == 0.0
            assert set(report.failing) == set(task.FAIL_TO_PASS)
            await ws.apply_patch(task.patch)
            reward, report = await evaluate(ws, task)
            assert reward == 1.0, report.outcomes


async def test_breaking_a_pass_to_pass_test_gives_zero(tasks, tmp_path):
    task = tasks["handmade__stats_mean"]
    async with Workspace.create(task.snapshot, root=tmp_path) as ws:
        await ws.apply_patch(task.patch)
        ws.write_text("stats/__init__.py", ws.read_text("stats/__init__.py").replace("sum(xs)", "0"))
        reward, report = await evaluate(ws, task)
        assert reward == 0.0 and report.outcomes["test_stats.py::test_total"] == "failed"


async def test_deleted_test_counts_as_not_passed(tasks, tmp_path):
    task = tasks["handmade__stats_mean"]
    async with Workspace.create(task.snapshot, root=tmp_path) as ws:
        await ws.apply_patch(task.patch)
        await ws.run("rm test_stats.py")
        reward, report = await evaluate(ws, task)
        assert reward == 0.0 and report.outcomes["test_stats.py::test_mean"] == "error"


def test_junit_node_ids_include_classes_and_params():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_a.TestX" name="test_p[1-2]" file="tests/test_a.py"/>
      <testcase classname="tests.test_a" name="test_f" file="tests/test_a.py">
        <failure message="assert 1 == 2">long text</failure></testcase>
      <testcase classname="pkg.mod" name="pkg.mod.func" file="pkg/mod.py"><skipped/></testcase>
    </testsuite></testsuites>"""
    outcomes, messages = parse_junit(xml)
    assert outcomes == {"tests/test_a.py::TestX::test_p[1-2]": "passed",
                        "tests/test_a.py::test_f": "failed",
                        "pkg/mod.py::pkg.mod.func": "skipped"}
    assert messages == {"tests/test_a.py::test_f": "assert 1 == 2"}


def test_malformed_task_file_names_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"instance_id": "x", "repo": "r", "snapshot": "s",
                                "problem_statement": "p"}) + "\n")
    with pytest.raises(TaskError, match="task x: field 'FAIL_TO_PASS' is missing"):
        load_tasks(path)
    path.write_text("{not json\n")
    with pytest.raises(TaskError, match="t.jsonl:1: not JSON"):
        load_tasks(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(TaskError, match="t.jsonl:1: not a task object"):
        load_tasks(path)
    with pytest.raises(TaskError, match="python -m agents.envs.build"):
        load_tasks(tmp_path / "missing.jsonl")


async def test_tool_misuse_becomes_observation(tasks, tmp_path):
    task = tasks["handmade__text_slug"]
    async with Workspace.create(task.snapshot, root=tmp_path) as ws:
        tools = Toolbox(ws, task, Limits(timeout_s=10), max_observation_chars=300)
        obs = await tools.call(ToolCall("str_replace", {"path": "text/__init__.py",
                                                        "old_str": "w", "new_str": "W"}))
        assert obs.error and "occurs" in obs.text and "times" in obs.text
        obs = await tools.call(ToolCall("read_file", {"path": "../../etc/passwd"}))
        assert obs.error and "outside the workspace" in obs.text
        obs = await tools.call(ToolCall("read_file", {"path": "text/__init__.py", "start_line": "99"}))
        assert obs.error and "start_line" in obs.text
        obs = await tools.call(ToolCall("bash", {"command": "seq 1 100000"}))
        assert "characters cut" in obs.text and len(obs.text) < 400
        obs = await tools.call(ToolCall("str_replace", {"path": "text/__init__.py",
                                                        "old_str": '"_".join', "new_str": '"-".join'}))
        assert not obs.error and "line 4" in obs.text
        obs = await tools.call(ToolCall("run_tests", {}))
        assert obs.text.startswith("3 of 3 tests passed")
        assert (await tools.call(ToolCall("submit", {}))).ends_episode
