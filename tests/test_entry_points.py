"""Every entry point answers a mistake in its command the same way: one ``error:`` line, no
traceback, exit code 2, refused before anything starts, and nothing left in the folder it
ran in (no empty run folder). A failure at run time exits 1, Ctrl-C 130, SIGTERM 143
(common.config; the last two in tests/test_config.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from common.config import EXIT_FAILURE, EXIT_USAGE, RunFailedError, user_error_exit_code
from tests.conftest import GSM8K_TINY, GSM8K_TINY_OVERRIDE, TESTS_DIR

REPO = TESTS_DIR.parent

# The commands built on common.config.hydra_entry, each with one bad value it refuses before it
# starts anything (an unknown key is the same for all of them).
HYDRA_ENTRY_POINTS = {
    "rl.train": ["engine.num_engines=0", GSM8K_TINY_OVERRIDE],
    "rl.eval": ["eval.n=-2", f"eval.benchmarks.gsm8k.path={GSM8K_TINY}"],
    "rl.compare": ["routers=[vllm]"],
    "rl.reward_server": ["model.path=/nonexistent/model", "trainer.rewards.rlhf_scorer=reward_model"],
    "router": ["router=round-robin", "engines.urls=[http://127.0.0.1:1]", "server.port=-1"],
    "router.sim": ["scale=big"],
    "rollout.serve": ["engine.num_engines=0"],
    "agents.server": ["port=http"],
}
BENCHMARKS = ["bench.agent_episodes", "bench.engine_throughput", "bench.grpo_step", "bench.router_decision",
              "bench.router_proxy", "bench.router_real", "bench.sim_speed"]


def _run_in(folder, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` with ``folder`` as its working directory (so a run folder
    it makes, relative by default, lands there)."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=180)


def _assert_refused(r: subprocess.CompletedProcess, folder) -> None:
    assert r.returncode == EXIT_USAGE, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert sorted(p.name for p in folder.iterdir()) == []  # no run folder, no empty parents


@pytest.mark.parametrize("module", sorted(HYDRA_ENTRY_POINTS))
def test_unknown_key_exits_2_with_one_line_and_leaves_nothing(module, tmp_path):
    _assert_refused(_run_in(tmp_path, module, "no_such_key=1"), tmp_path)


@pytest.mark.parametrize("module", sorted(HYDRA_ENTRY_POINTS))
def test_bad_value_exits_2_with_one_line_and_leaves_nothing(module, tmp_path):
    _assert_refused(_run_in(tmp_path, module, *HYDRA_ENTRY_POINTS[module]), tmp_path)


@pytest.mark.parametrize("module", BENCHMARKS)
def test_benchmark_refuses_an_unknown_option_with_exit_2(module, tmp_path):
    r = _run_in(tmp_path, module, "--no-such-option")
    assert r.returncode == EXIT_USAGE and "unrecognized arguments: --no-such-option" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_benchmark_refuses_a_bad_value_with_exit_2_and_one_line(tmp_path):
    r = _run_in(tmp_path, "bench.router_real", "--minutes", "-1")
    assert r.returncode == EXIT_USAGE
    assert r.stderr == "error: --minutes must be a positive number, got -1.0\n"


@pytest.mark.parametrize(("module", "args"), [
    ("rollout.serve", ["engine.num_engines=0", "run_dir=new/deeper/serve"]),
    ("router.sim", ["scale=big", "out_dir=new/deeper"]),
])
def test_refused_command_removes_the_run_folder_and_the_parents_it_made(module, args, tmp_path):
    (tmp_path / "kept").mkdir()  # an empty folder that was there before is not touched
    r = _run_in(tmp_path, module, *args)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_a_failure_at_run_time_exits_1_not_2():
    from rollout.engines import EngineError, EngineStartError
    from rollout.model import ModelBuildError, ModelPrepareError
    from common.process import ProcessStartError
    import rollout.serve  # noqa: F401  (registers the serving stack's errors)

    assert user_error_exit_code(RunFailedError("a child run failed")) == EXIT_FAILURE
    for failure in (EngineStartError("x"), ModelBuildError("x"), ProcessStartError("x")):
        assert user_error_exit_code(failure) == EXIT_FAILURE
    for mistake in (EngineError("x"), ModelPrepareError("x")):
        assert user_error_exit_code(mistake) == EXIT_USAGE


@pytest.mark.parametrize(("module", "key"), [("rl.train", "run_dir"), ("router.sim", "out_dir")])
@pytest.mark.parametrize(("where", "expect"), [
    ("file", "{file} is a file, not a folder"),
    ("file/sub", "{file} is a file, not a folder"),
    ("/proc/misa-rl-test", "cannot make /proc/misa-rl-test (No such file or directory)"),
])
def test_a_run_folder_that_cannot_be_made_is_one_error_line(module, key, where, expect, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    value = where if where.startswith("/") else str(tmp_path / where)
    r = _run_in(tmp_path, module, f"{key}={value}")
    assert r.returncode == EXIT_USAGE, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.startswith(f"error: {key}={value}: {expect.format(file=tmp_path / 'file')}"), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr + r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_learning_curve_refuses_a_run_folder_without_metrics_with_exit_2_and_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    r = _run_in(tmp_path, "bench.learning_curve", "--runs", str(tmp_path / "run"), "/nonexistent")
    assert r.returncode == EXIT_USAGE, r.stderr
    assert r.stderr == f"error: --runs {tmp_path / 'run'}: no metrics.jsonl (did the run finish?); give rl.train run folders\n"
    assert r.stdout == ""
