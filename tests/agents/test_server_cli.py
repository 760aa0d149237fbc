"""``python -m agents.server`` with a bad override: one line naming what was wrong and what is
valid, no traceback; exit 2 for an unknown key or option, 1 for a bad value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agents.server", "port=0", *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("override", "code", "expected"), [
    ("episode.limits.max_turn=3", 2, "Valid keys under 'episode.limits': max_context_tokens, max_episode_s"),
    ("+episode.limits.max_turn=3", 2, "episode.limits: unknown option(s) 'max_turn' (did you mean 'max_turns'?); valid options: max_turns"),
    ("+nosuch=1", 2, "unknown config key 'nosuch': the agent server has no such option. Valid keys: "),
    ("++nosuch=1", 2, "unknown config key 'nosuch': the agent server has no such option."),
    ("port=http", 2, "port='http' is invalid: give a TCP port number (0-65535)."),
    ("router_url=localhost:8100", 2, "router_url='localhost:8100' is invalid: give the router's base URL"),
    ("episode.command_limits.cpu_s=lots", 2, "episode.command_limits: option 'cpu_s' must be an integer"),
    ("episode.tool_listing=json", 2, "episode.tool_listing='json' is invalid: give schemas or signatures."),
    ("episode.demonstrations=abc", 2, "episode.demonstrations='abc' is invalid: give a list of {problem_statement, tool, arguments}"),
    ("episode.demonstrations=[{problem_statement: x, tool: nope, arguments: {}}]", 2,
     "episode.demonstrations[0]: demonstration calling 'nope': not a valid tool call (Unknown tool 'nope'"),
    ("episode.demonstrations=[{problem_statement: x, tool: str_replace, arguments: {path: a.py}}]", 2,
     "missing argument(s) old_str, new_str"),
])
def test_bad_override_is_one_line_with_what_is_valid(override, code, expected):
    r = _run(override)
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
    assert "Traceback" not in r.stderr + r.stdout


def test_served_model_name_is_set_from_the_command_line():
    # `model` would be the Hydra `model` group (recipes/model/), so the key is served_model_name.
    r = subprocess.run([sys.executable, "-m", "agents.server", "served_model_name=my-model", "--cfg", "job"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "served_model_name: my-model" in r.stdout.splitlines()


def test_a_port_in_use_is_one_error_line():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "agents.server", f"port={port}", "router_url=http://127.0.0.1:1"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: cannot serve on 127.0.0.1:{port}") and r.stderr.count("\n") == 1, r.stderr
    assert "address already in use" in r.stderr.lower() and "choose another host" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_a_missing_task_file_is_refused_before_the_server_says_where_it_listens(tmp_path):
    r = _run(f"tasks_path={tmp_path / 'nope.jsonl'}")
    assert r.returncode == 2, r.stderr
    assert "is neither a task file nor a built-in set" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "agent server on" not in r.stdout + r.stderr  # it never claimed to serve
    assert "Traceback" not in r.stderr + r.stdout


def test_a_sandbox_that_cannot_run_the_tests_is_refused_at_start(tmp_path):
    # The handmade task with a test command the sandbox cannot start (as `python` was, when the
    # venv was reached through a link): every reward would be 0, so the server does not start.
    from agents.envs.task import load_tasks, write_tasks
    from agents.server import HANDMADE_TASKS
    import dataclasses

    task = next(iter(load_tasks(HANDMADE_TASKS).values()))
    path = tmp_path / "tasks.jsonl"
    write_tasks([dataclasses.replace(task, test_cmd="no-such-command-in-the-sandbox -m pytest")], path)
    r = _run(f"tasks_path={path}", "extra_tasks_paths=[]", "router_url=http://127.0.0.1:1")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: task set "), r.stderr
    assert f"task {task.instance_id}: its tests do not run" in lines[0]
    assert "exit status 127" in lines[0] and "no-such-command-in-the-sandbox" in lines[0]
    assert "No agent episode could earn a reward" in lines[0]
    assert "agent server on" not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_the_builtin_task_sets_pass_the_start_check():
    # The check the server runs at start, on the sets the default recipe serves: their tests run.
    from agents.server import check_tasks_run, load_task_set_files
    from common.config import compose

    cfg = compose("agent_server", ["extra_tasks_paths=[handmade,constant_fix_l1]"])
    check_tasks_run(cfg, load_task_set_files(cfg))
