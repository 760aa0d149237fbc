"""The command line: clear errors for unknown keys and options, resolved config on request."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl.config import ConfigError, compose


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl.train", *args], capture_output=True,
                          text=True, timeout=120)


def test_unknown_router_lists_the_valid_ones():
    r = _run("router=misa-x")
    assert r.returncode == 2
    assert "router=misa-x" in r.stderr and "misa-t" in r.stderr and "vllm" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_unknown_key_lists_the_keys_of_its_section():
    r = _run("engine.num_engine=3")
    assert r.returncode == 2
    assert "engine.num_engine" in r.stderr and "num_engines" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_bad_engine_value_is_a_one_line_error_without_traceback(tmp_path):
    r = _run("engine.num_engines=0", f"run_dir={tmp_path}/run")
    assert r.returncode == 1
    assert "engine.num_engines=0 is invalid" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_cfg_job_prints_the_resolved_config():
    r = _run("recipe=mixed_step", "router=misa-t", "engine.kv_cache_space_gib=2", "--cfg", "job",
             "--resolve")
    assert r.returncode == 0, r.stderr
    assert "policy: misa_t" in r.stdout
    assert "kv_cache_space_gib: 2" in r.stdout
    assert "${" not in r.stdout  # resolved


def test_compose_raises_config_error_for_a_missing_group_option():
    with pytest.raises(ConfigError, match="Valid options for model: smollm2-135m"):
        compose("train", ["model=llama-70b"])


def test_recipe_overrides_group_defaults():
    cfg = compose("train", ["recipe=mixed_step"])
    assert cfg.engine.kv_cache_space_gib == 0.5  # set by the recipe over engine/cpu.yaml
    assert cfg.trainer.max_in_flight == 32  # set by the recipe over trainer/grpo.yaml
    assert set(cfg.trainer.rho) == {"agent", "rlvr", "rlhf"}


def test_repo_relative_paths_resolve_from_the_repository_root():
    from omegaconf import OmegaConf

    from rl.config import REPO_ROOT

    cfg = compose("train", [])
    path = OmegaConf.to_container(cfg.trainer.domains.rlvr.gsm8k, resolve=True)["path"]
    assert path == str((REPO_ROOT / "../shared/data/gsm8k/train.jsonl").resolve())


@pytest.mark.parametrize("override,expect", [
    ("trainer.learner.backend=jax", "trainer.learner"),
    ("trainer.rho.agent=-5", "trainer.rho"),
    ("trainer.loss.eps_low=abc", "wrong type"),
    ("trainer.iterations=0", "trainer.iterations=0"),
])
def test_bad_trainer_values_are_refused_before_anything_starts(tmp_path, override, expect):
    r = _run(override, f"run_dir={tmp_path}/run")
    assert r.returncode == 1
    assert expect in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert "engines up" not in r.stdout
