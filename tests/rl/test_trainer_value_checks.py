"""The numeric ``trainer`` knobs are checked before engines start (``rl.train.validate_trainer_cfg``):
a group size of 0, a negative temperature or token limit is refused with the key named,
not accepted into a run."""

import pytest

from common.config import ConfigError, compose


@pytest.mark.parametrize("override, key", [
    ("trainer.group_size.rlvr=0", "trainer.group_size.rlvr"),
    ("trainer.group_size.agent=0", "trainer.group_size.agent"),
    ("trainer.group_size.rlhf=-2", "trainer.group_size.rlhf"),
    ("trainer.group_size.rlvr=2.5", "trainer.group_size.rlvr"),
    ("trainer.sampling.temperature=-1", "trainer.sampling.temperature"),
    ("trainer.sampling.top_p=0", "trainer.sampling.top_p"),
    ("trainer.sampling.top_p=1.5", "trainer.sampling.top_p"),
    ("trainer.max_tokens.rlvr=0", "trainer.max_tokens.rlvr"),
    ("trainer.max_tokens.rlhf=-5", "trainer.max_tokens.rlhf"),
    ("trainer.agent_limits.max_turns=0", "trainer.agent_limits.max_turns"),
    ("trainer.agent_limits.max_tokens_per_turn=0", "trainer.agent_limits.max_tokens_per_turn"),
    ("trainer.agent_limits.max_context_tokens=-1", "trainer.agent_limits.max_context_tokens"),
    ("trainer.eval.n=0", "trainer.eval.n"),
    ("trainer.eval.temperature=-0.5", "trainer.eval.temperature"),
    ("trainer.eval.max_tokens=0", "trainer.eval.max_tokens"),
    ("trainer.eval.problems=0", "trainer.eval.problems"),
    ("trainer.max_in_flight=abc", "trainer.max_in_flight='abc': give a whole number"),
    ("trainer.max_staleness=1.5", "trainer.max_staleness=1.5: give a whole number"),
    ("trainer.max_in_flight=0", "^trainer.max_in_flight=0: give a whole number >= 1"),
    ("trainer.max_in_flight=-3", "^trainer.max_in_flight=-3: give a whole number >= 1"),
    ("trainer.max_staleness=-1", "^trainer.max_staleness=-1: give a whole number >= 0"),
])
def test_a_bad_numeric_trainer_value_is_refused_before_start(override, key):
    from rl.train import validate_trainer_cfg

    cfg = compose("train", ["run_dir=runs/test", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_trainer_cfg(cfg.trainer)


def test_max_in_flight_below_the_largest_group_of_a_mixed_class_is_refused_before_start():
    from rl.train import validate_trainer_cfg

    cfg = compose("train", ["run_dir=runs/test", "trainer.group_size.rlvr=8", "trainer.max_in_flight=6"])
    with pytest.raises(ConfigError, match=r"trainer\.max_in_flight=6 .*trainer\.group_size\.rlvr=8"):
        validate_trainer_cfg(cfg.trainer)
    # a class switched off by its weight does not count
    validate_trainer_cfg(compose("train", ["run_dir=runs/test", "trainer.group_size.rlvr=8",
                                           "trainer.max_in_flight=6", "trainer.rho.rlvr=0"]).trainer)


def test_temperature_zero_is_greedy_and_allowed():
    from rl.train import validate_trainer_cfg

    validate_trainer_cfg(compose("train", ["run_dir=runs/test", "trainer.sampling.temperature=0"]).trainer)


def test_rl_train_refuses_group_size_zero_with_exit_2_and_no_run_folder(tmp_path):
    import subprocess
    import sys

    from common.config import REPO_ROOT

    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "rl.train", f"run_dir={run_dir}", "trainer.group_size.rlvr=0"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "trainer.group_size.rlvr" in r.stderr and "Traceback" not in r.stderr
    assert "run folder" not in r.stdout and not run_dir.exists()


@pytest.mark.parametrize("seed, shown", [("abc", "'abc'"), ("-1", "-1"), ("1.5", "1.5"), ("true", "true")])
def test_a_seed_that_is_not_a_whole_number_from_0_is_refused_before_start(seed, shown):
    from rl.train import validate_job_cfg

    with pytest.raises(ConfigError, match=rf"^seed={shown} is invalid: give a whole number >= 0"):
        validate_job_cfg(compose("train", ["run_dir=runs/test", f"seed={seed}"]))


def test_rl_compare_refuses_a_bad_seed_before_the_first_run():
    from rl.compare import check_train_runs

    with pytest.raises(ConfigError, match=r"^seed=-1 is invalid"):
        check_train_runs({"vllm": ["router=vllm", "seed=-1", "run_dir=runs/test/vllm"]})


def test_rl_train_refuses_seed_abc_with_exit_2_and_no_run_folder(tmp_path):
    import subprocess
    import sys

    from common.config import REPO_ROOT

    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "rl.train", f"run_dir={run_dir}", "seed=abc"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "error: seed='abc' is invalid: give a whole number >= 0, e.g. seed=0.\n"
    assert "run folder" not in r.stdout and not run_dir.exists()


@pytest.mark.parametrize("override, expect", [
    ("trainer.rho=abc", "trainer.rho: the target mixture must map each workload class to a weight, "
                        "e.g. {agent: 48.6, rlvr: 33.1, rlhf: 18.2}; got 'abc'"),
    ("~trainer.rho", "trainer.rho: the target mixture must map each workload class to a weight"),
    ("trainer.rho.rlvr=abc", "trainer.rho: the weight of class 'rlvr' is 'abc': give a number >= 0"),
    ("+trainer.rho.unknownclass=1", "trainer.rho: workload classes ['unknownclass'] have a positive target "
                                    "share but no prompt sources"),
])
def test_a_bad_target_mixture_is_refused_before_start(override, expect):
    from rl.train import validate_trainer_cfg

    with pytest.raises(ConfigError) as e:
        validate_trainer_cfg(compose("train", ["run_dir=runs/test", override]).trainer)
    assert str(e.value).startswith(expect), e.value


def test_a_class_without_sources_is_allowed_at_weight_0():
    from rl.train import validate_trainer_cfg

    validate_trainer_cfg(compose("train", ["run_dir=runs/test", "+trainer.rho.unknownclass=0"]).trainer)
