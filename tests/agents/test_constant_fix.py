"""The constant-fix task levels (agents.envs.constant_fix): built, stated precisely, graded
in the sandbox like every task (1 for the fix, 0 for a wrong value or no change)."""

import re

import pytest

from agents.envs.constant_fix import BUGS, LEVELS, build_constant_fix, fix_call, problem_statement
from agents.envs.task import evaluate, load_tasks
from agents.loop import EpisodeLimits
from agents.scripted import tool_call
from agents.server import BUILTIN_TASK_SETS, AgentServerError, task_set_path
from agents.toolcall import ToolCall, parse_tool_calls
from agents.tools import TOOL_SPECS, Toolbox
from sandbox import Limits, Workspace
from tests.agents.test_episode import run_scripted

SETS = {level: load_tasks(BUILTIN_TASK_SETS[f"constant_fix_l{level}"]) for level in LEVELS}


def test_committed_set_is_the_builders_output(tmp_path):
    committed = BUILTIN_TASK_SETS["handmade"].parent
    for path in build_constant_fix(tmp_path):
        assert path.read_text() == (committed / path.name).read_text(), \
            "stale: run python -m agents.envs.constant_fix"
    built = sorted(p.relative_to(tmp_path) for p in (tmp_path / "snapshots").rglob("*") if p.is_file())
    assert len(built) == 2 * len(BUGS)  # the package and its tests
    for rel in built:
        assert (tmp_path / rel).read_bytes() == (committed / rel).read_bytes()


def test_every_level_has_one_task_per_package_on_a_shared_snapshot():
    for level, tasks in SETS.items():
        assert len(tasks) == len(BUGS)
        assert {t.metadata["level"] for t in tasks.values()} == {level}
    assert {t.snapshot for t in SETS[1].values()} == {t.snapshot for t in SETS[3].values()}


def test_statement_names_file_line_and_constant_giving_away_less_each_level():
    bug = BUGS[0]  # shipping: RATE_PER_KG = 3 must be 5
    s1, s2, s3 = (problem_statement(bug, level) for level in LEVELS)
    for s in (s1, s2, s3):
        assert "shipping/__init__.py" in s and "Line 3" in s and "RATE_PER_KG" in s
        assert "shipping_cost(2) returns 6 but must return 10" in s
    assert "`RATE_PER_KG = 5`" in s1 and "`RATE_PER_KG = 5`" in s2 and "= 5" not in s3
    (call,), problems = parse_tool_calls(s1, TOOL_SPECS)  # level 1 shows a call that parses
    assert not problems and call == ToolCall("str_replace", {
        "path": "shipping/__init__.py", "old_str": "= 3", "new_str": "= 5"})
    assert "<tool_call>" not in s2
    with pytest.raises(ValueError, match="choose one of 1, 2, 3"):
        problem_statement(bug, 4)


def test_level_1_call_is_exact_and_fits_the_default_recipes_turn(model_path, train_cfg):
    from agents.chat import HFTokenizer

    tok = HFTokenizer(model_path)
    budget = train_cfg.trainer.agent_limits.max_tokens_per_turn  # 64 in mixed_step
    for bug in BUGS:
        (call,), _ = parse_tool_calls(fix_call(bug), TOOL_SPECS)
        module = bug.module(bug.wrong)
        assert module.count(call.arguments["old_str"]) == 1, bug.package  # str_replace's rule
        assert module.replace(call.arguments["old_str"], call.arguments["new_str"]) == bug.module(bug.right)
        # Room for the end token and a few of the model's own.
        assert len(tok.encode(fix_call(bug))) <= budget - 4, bug.package


@pytest.mark.parametrize("level", LEVELS)
async def test_grader_gives_one_for_the_fix_and_zero_for_no_change_or_a_wrong_value(level, tmp_path):
    task = next(iter(SETS[level].values()))
    meta = task.metadata
    async with Workspace.create(task.snapshot, root=tmp_path) as ws:
        assert ws.read_text(meta["path"]).splitlines()[meta["line"] - 1] == \
            f"{meta['constant']} = {meta['wrong']}"  # the line the statement names
        assert (await evaluate(ws, task))[0] == 0.0  # empty patch
        await ws.apply_patch(task.patch)
        assert (await evaluate(ws, task))[0] == 1.0
        tools = Toolbox(ws, task, Limits())
        wrong = meta["right"] + 1
        obs = await tools.call(ToolCall("str_replace", {
            "path": meta["path"], "old_str": f"= {meta['right']}", "new_str": f"= {wrong}"}))
        assert not obs.error
        reward, report = await evaluate(ws, task)
        assert reward == 0.0 and report.failing == list(task.FAIL_TO_PASS)


def _copy_the_shown_call(_session, turn, prompt):
    """A policy that makes the tool call the level-1 statement shows, then submits (the
    task is the last user message: the demonstrations' calls come before it)."""
    shown = re.search(r"<tool_call>.*?</tool_call>", prompt.rsplit("<|im_start|>user", 1)[1], re.S)
    return shown.group(0) if turn == 0 else tool_call("submit")


async def test_scripted_agent_copying_the_level_1_call_solves_it_and_a_wrong_edit_does_not():
    task = SETS[1]["constant_fix__L1__dice"]
    limits = EpisodeLimits(max_turns=3, max_context_tokens=65536, max_tokens_per_turn=4096)
    solved, _ = await run_scripted(_copy_the_shown_call, task, limits)
    assert solved.status == "submitted" and solved.reward == 1.0
    assert "+FACES_PER_DIE = 6" in solved.patch
    wrong, _ = await run_scripted(lambda s, turn, p: tool_call(
        "str_replace", path="dice/__init__.py", old_str="FACES_PER_DIE = 4",
        new_str="FACES_PER_DIE = 5") if turn == 0 else tool_call("submit"), task, limits)
    assert wrong.status == "submitted" and wrong.reward == 0.0 and wrong.patch
    idle, _ = await run_scripted(lambda *a: tool_call("submit"), task, limits)
    assert idle.reward == 0.0 and idle.patch == ""


def test_task_sets_resolve_by_name_or_file_and_refuse_anything_else(tmp_path):
    assert task_set_path("constant_fix_l2").name == "constant_fix_l2.jsonl"
    f = tmp_path / "mine.jsonl"
    f.write_text("")
    assert task_set_path(str(f)) == f
    with pytest.raises(AgentServerError, match="neither a task file nor a built-in set .*handmade"):
        task_set_path("constant_fix_l9")


def test_solve_rate_refuses_an_unknown_task_set_with_one_line_and_exit_2(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "bench.agent_solve_rate", "--sets", "nope"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("error: task set 'nope' is neither a task file nor a built-in set")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr + r.stdout
    assert list(tmp_path.iterdir()) == []  # no engine started, no output folder


def test_solve_rate_figures_count_groups_with_unequal_rewards():
    from bench.agent_solve_rate import group_figures

    def ep(reward, calls):
        return {"reward": reward, "turns": [{"tool_calls": calls}]}
    groups = [[ep(1.0, ["str_replace"]), ep(0.0, [])], [ep(0.0, ["bash"]), ep(0.0, [])]]
    f = group_figures(groups)
    assert f["episodes"] == 4 and f["solved_share"] == 0.25 and f["informative_groups"] == 0.5
    assert f["tool_call_share"] == 0.5 and f["str_replace_share"] == 0.25
