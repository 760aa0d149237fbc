"""Every entry point answers a mistake in its command the same way: one ``error:`` line, no
traceback, exit code 2, refused before anything starts, and nothing left in the folder it
ran in (no empty run folder). A failure at run time exits 1, Ctrl-C 130, SIGTERM 143
(common.config; the last two in tests/test_config.py)."""

from __future__ import annotations

import os
import signal
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
    "agents.envs.build": ["num_tasks=-1"],
}
BENCHMARKS = ["bench.agent_episodes", "bench.engine_throughput", "bench.grpo_step", "bench.omp_wait_policy",
              "bench.router_decision", "bench.router_proxy", "bench.router_real", "bench.sim_speed"]


def _run_in(folder, module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m module args`` with ``folder`` as its working directory (so a run folder
    it makes, relative by default, lands there); ``env``: more environment variables."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=180)


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


@pytest.mark.parametrize("module", sorted(HYDRA_ENTRY_POINTS))
def test_a_dashed_option_is_one_line_that_shows_the_key_value_form(module, tmp_path):
    r = _run_in(tmp_path, module, "--port", "9000")
    _assert_refused(r, tmp_path)
    assert "--port: not an option of this command" in r.stderr
    # the key=value form of the command's own key, or that it has none (never a key to guess)
    assert "port=" in r.stderr or "no key of this command is named port" in r.stderr


def test_a_dashed_option_names_the_recipes_own_key_with_its_path(tmp_path):
    # the training recipe's port lies three sections down: the refusal names that path
    r = _run_in(tmp_path, "rl.train", "--port", "9000")
    _assert_refused(r, tmp_path)
    assert "(here: trainer.rewards.server.port=9000)" in r.stderr
    r = _run_in(tmp_path, "rl.train", "--trainer.iterations=3")
    assert "(here: trainer.iterations=3)" in r.stderr
    # a name the recipe lacks, or a line that does not compose: the general form, no guess
    r = _run_in(tmp_path, "rl.train", "router=bogus", "--iterations", "3")
    _assert_refused(r, tmp_path)
    assert "e.g. iterations=VALUE; a key in a section needs its path" in r.stderr
    r = _run_in(tmp_path, "rl.train", "--no-such-key", "3")
    _assert_refused(r, tmp_path)
    assert "(and no key of this command is named no_such_key)" in r.stderr and "no_such_key=" not in r.stderr


@pytest.mark.parametrize("module", BENCHMARKS)
def test_benchmark_refuses_an_unknown_option_with_exit_2_and_one_line(module, tmp_path):
    r = _run_in(tmp_path, module, "--no-such-option")
    assert r.returncode == EXIT_USAGE, r.stderr[-2000:]
    assert r.stderr == (f"error: unrecognized arguments: --no-such-option "
                        f"(python -m {module} --help lists the options)\n")  # no argparse usage block
    assert "Traceback" not in r.stderr + r.stdout


def test_a_value_argparse_cannot_read_is_one_line_too(tmp_path):
    r = _run_in(tmp_path, "bench.router_decision", "--decisions", "many")
    assert r.returncode == EXIT_USAGE
    assert r.stderr == ("error: argument --decisions: invalid int value: 'many' "
                        "(python -m bench.router_decision --help lists the options)\n")


def test_a_value_given_to_a_switch_says_it_takes_none(tmp_path):
    r = _run_in(tmp_path, "bench.router_real", "--baseline-at-ceiling=yes")
    assert r.returncode == EXIT_USAGE
    assert r.stderr == ("error: --baseline-at-ceiling/--no-baseline-at-ceiling is a switch and takes no value "
                        "(got 'yes'): give --baseline-at-ceiling or --no-baseline-at-ceiling alone "
                        "(python -m bench.router_real --help lists the options)\n")


def test_an_option_is_matched_by_its_whole_name_not_a_prefix(tmp_path):
    """``--policy`` is a prefix of ``--policy-param`` only: refused, not read as that option."""
    r = _run_in(tmp_path, "bench.router_real", "--policy", "misa_t")
    assert r.returncode == EXIT_USAGE
    assert r.stderr == ("error: unrecognized arguments: --policy misa_t "
                        "(python -m bench.router_real --help lists the options)\n")


def test_benchmark_refuses_a_bad_value_with_exit_2_and_one_line(tmp_path):
    r = _run_in(tmp_path, "bench.router_real", "--minutes", "-1")
    assert r.returncode == EXIT_USAGE
    assert r.stderr == "error: --minutes must be a positive number, got -1.0\n"


# A benchmark value no run can use: refused before anything starts, the option named.
BENCHMARK_BAD_VALUES = [
    ("bench.sim_speed", ["nope"], "error: unknown policy 'nope'; valid: aimd, cache_aware, "),
    ("bench.sim_speed", ["--ceiling", "0", "nope"], "error: --ceiling must be a positive integer"),
    ("bench.sim_speed", ["round_robin", "--ceiling", "-3"], "error: --ceiling must be a positive integer"),
    ("bench.router_decision", ["--decisions", "0"], "error: --decisions must be at least 2 "),
    ("bench.router_decision", ["--decisions", "-5"], "error: --decisions must be at least 2 "),
    ("bench.router_decision", ["--plot", "."], "error: --plot . is a folder"),
    ("bench.router_proxy", ["--requests", "0"], "error: --requests must be at least 2 (the latency percentiles"),
    ("bench.router_proxy", ["--requests", "1"], "error: --requests must be at least 2 (the latency percentiles"),
    ("bench.router_proxy", ["--concurrency", "0"], "error: --concurrency must be a positive integer"),
    ("bench.router_proxy", ["--delay-ms", "-1"], "error: --delay-ms must be a number >= 0"),
    ("bench.omp_wait_policy", ["--repeats", "0"], "error: --repeats must be >= 1, got 0"),
    ("bench.omp_wait_policy", ["--plot", "."], "error: --plot . is a folder; give the chart's file name ending in .png"),
    ("bench.omp_wait_policy", ["--plot", "chart"], "error: --plot chart: give the chart's file name ending in"),
    ("bench.omp_wait_policy", ["--plot", "/proc/nope/x.png"], "error: --plot /proc/nope/x.png: cannot make its folder"),
    ("bench.grpo_step", ["--plot", "chart"], "error: --plot chart: give the chart's file name ending in"),
    ("bench.agent_episodes", ["--plot", "."], "error: --plot . is a folder; give the chart's file name ending in"),
    ("bench.router_proxy", ["--plot", "x.txt"], "error: --plot x.txt: give the chart's file name ending in"),
]


@pytest.mark.parametrize(("module", "args", "start"), BENCHMARK_BAD_VALUES)
def test_benchmark_refuses_a_value_no_run_can_use_with_exit_2_and_one_line(module, args, start, tmp_path):
    # TMPDIR is the (empty) folder it runs in: a temp folder it made and left would show there
    r = _run_in(tmp_path, module, *args, env={"TMPDIR": str(tmp_path)})
    _assert_refused(r, tmp_path)
    assert r.stderr.startswith(start), r.stderr
    assert r.stdout == ""


def _exits_without_a_result(policy, ceiling, queue):
    os._exit(3)


def _killed(policy, ceiling, queue):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(600)  # a parent that waits forever fails here instead of holding the session
@pytest.mark.parametrize(("policy", "target", "expect"), [
    ("nope", None, "policy nope: UnknownOptionError: unknown router policy 'nope'; choose one of: "),
    ("round_robin", _exits_without_a_result, "policy round_robin: its process exited with code 3 without a result"),
    ("round_robin", _killed, "policy round_robin: its process was killed by signal 9 without a result"),
])
def test_sim_speed_a_child_that_fails_ends_the_wait_with_its_reason(policy, target, expect):
    import multiprocessing as mp

    from bench.sim_speed import ChildFailed, _one, run_in_child

    with pytest.raises(ChildFailed) as e:  # the child's own policy check: the name was not checked up front
        run_in_child(mp.get_context("spawn"), policy, 128, target=target or _one, poll_s=0.2)
    assert str(e.value).startswith(expect), e.value
    assert "\n" not in str(e.value)


def _reports_and_exits(policy, ceiling, queue):
    queue.put({"policy": policy, "ceiling": ceiling})


@pytest.mark.timeout(600)
def test_sim_speed_the_row_a_child_put_before_it_exited_is_returned():
    import multiprocessing as mp

    from bench.sim_speed import run_in_child

    row = run_in_child(mp.get_context("spawn"), "misa_t", 512, target=_reports_and_exits, poll_s=0.2)
    assert row == {"policy": "misa_t", "ceiling": 512}


def test_sim_speed_a_failed_policy_is_one_line_and_exit_1_after_the_finished_rows(monkeypatch, capsys):
    import bench.sim_speed as sim_speed

    row = {"policy": "round_robin", "ceiling": 128, "gen_s": 1.0, "sim_s": 2.0, "cpu_s": 2.0, "peak_mib": 100.0,
           "requests": 10, "events": 20, "decides": 10}

    def run_in_child(ctx, policy, ceiling):
        if policy == "round_robin":
            return row
        raise sim_speed.ChildFailed(f"policy {policy}: its process was killed by signal 9 without a result")

    monkeypatch.setattr(sim_speed, "run_in_child", run_in_child)
    monkeypatch.setattr(sys, "argv", ["bench.sim_speed", "round_robin", "misa-t", "cache_aware"])
    with pytest.raises(SystemExit) as e:
        sim_speed.main()
    assert e.value.code == EXIT_FAILURE
    out, err = capsys.readouterr()
    assert err == "bench.sim_speed failed: policy misa_t: its process was killed by signal 9 without a result\n"
    assert [line.split()[0] for line in out.splitlines()] == ["policy", "round_robin"]


def test_router_proxy_a_failure_stops_what_it_started_and_removes_its_temp_folder(tmp_path, monkeypatch, capsys):
    import tempfile

    import bench.router_proxy as router_proxy
    from common.process import ProcessStartError

    stopped = []

    class EngineThatDies:
        def __init__(self, name, argv, log_path, **kwargs):
            self.name, self.log_path = name, log_path

        def start(self):
            self.log_path.write_text("started\n")  # into the benchmark's temp folder
            return self

        def wait_healthy(self, *args, **kwargs):
            raise ProcessStartError(f"{self.name} exited with code 1 while starting")

        def stop(self):
            stopped.append(self.name)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(router_proxy, "ManagedProcess", EngineThatDies)
    monkeypatch.setattr(router_proxy, "stop_on_sigterm", lambda: None)  # not this test process's handler
    monkeypatch.setattr(sys, "argv", ["bench.router_proxy", "--requests", "2", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(SystemExit) as e:
        router_proxy.main()
    assert e.value.code == EXIT_FAILURE
    assert capsys.readouterr().err == "bench.router_proxy failed: fake-engine exited with code 1 while starting\n"
    assert sorted(stopped) == ["fake-engine", "tcp-relay"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the router-proxy-* folder is gone


def test_sharded_learner_gpu_help_names_itself_and_offers_no_device_option(tmp_path):
    r = _run_in(tmp_path, "bench.sharded_learner_gpu", "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage: python -m bench.sharded_learner_gpu ")
    assert "--device" not in r.stdout and "--layers" in r.stdout
    assert "Traceback" not in r.stderr


def test_sharded_learner_parser_offers_device_only_where_it_is_not_fixed(capsys):
    from bench.sharded_learner import parse_args

    assert parse_args([]).device == "cpu"
    assert parse_args(["--device", "cuda"]).device == "cuda"
    gpu = dict(device="cuda", prog="python -m bench.sharded_learner_gpu")
    assert parse_args(["--layers", "8"], **gpu).device == "cuda"
    with pytest.raises(SystemExit) as e:
        parse_args(["--ranks", "0"])  # was a ZeroDivisionError once started
    assert e.value.code == EXIT_USAGE and "--ranks: every rank count must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        parse_args(["--device", "cpu"], **gpu)
    assert e.value.code == EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m bench.sharded_learner_gpu: error: unrecognized arguments: --device cpu")


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
