"""GPU placement of a job on one machine: engines take the front of the job's GPU list,
the trainer process (learner, NCCL weight sync, reward model) gets GPUs of its own.
Pure functions and environment handling: runs on CPU."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from common.config import ConfigError, compose
from rollout.engines import EngineError, engine_env, gpu_placement
from tests.conftest import GSM8K_TINY_OVERRIDE, STAND_IN_MODEL_OVERRIDE


def test_engines_take_tp_gpus_each_and_the_trainer_the_ones_given():
    p = gpu_placement(3, 2, [6, 7])
    assert p.engines == ("0,1", "2,3", "4,5")
    assert p.trainer == "6,7"


def test_trainer_defaults_to_the_first_gpu_after_the_engines():
    assert gpu_placement(2, 1).trainer == "2"
    assert gpu_placement(0, 4).trainer == "0"  # engines elsewhere (engine.urls)
    assert gpu_placement(2, 2, []).trainer == ""  # a trainer on CPU


def test_positions_map_through_the_jobs_visible_devices():
    p = gpu_placement(1, 2, visible="4,5,6,7")
    assert p.engines == ("4,5",) and p.trainer == "6"
    p = gpu_placement(1, 1, [1], visible="GPU-aa, GPU-bb")
    assert p.engines == ("GPU-aa",) and p.trainer == "GPU-bb"


def test_trainer_gpu_on_an_engines_gpu_is_refused_naming_both_keys():
    with pytest.raises(EngineError, match=r"trainer.learner.gpus=\[5\] overlaps.*engine.num_engines=3"):
        gpu_placement(3, 2, [5])
    with pytest.raises(EngineError, match="distinct"):
        gpu_placement(1, 1, [2, 2])


def test_too_few_visible_gpus_is_refused():
    with pytest.raises(EngineError, match="sees 4 GPUs"):
        gpu_placement(2, 2, [4], visible="0,1,2,3")


def test_engine_env_splits_the_jobs_gpus_and_leaves_the_trainers_free(monkeypatch):
    ecfg = OmegaConf.create({"kind": "gpu", "num_engines": 3, "tensor_parallel_size": 2,
                             "env": {}})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [engine_env(ecfg, i)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["0,1", "2,3", "4,5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")
    assert engine_env(ecfg, 2)["CUDA_VISIBLE_DEVICES"] == "12,13"


def _gpu_cfg(*overrides: str):
    return compose("train", ["recipe=mixed_step_gpu", STAND_IN_MODEL_OVERRIDE, "run_dir=runs/test",
                             GSM8K_TINY_OVERRIDE, *overrides])


def test_the_gpu_recipe_puts_learner_and_reward_model_beside_the_engines(monkeypatch):
    from rl.train import job_gpu_placement, use_trainer_gpus

    # (set through monkeypatch, so the narrowing below is undone after the test)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    p = job_gpu_placement(_gpu_cfg())
    assert p.engines == ("0,1", "2,3", "4,5") and p.trainer == "6,7"
    use_trainer_gpus(p)  # (no CUDA here, so never initialised)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_external_engines_leave_every_gpu_to_the_trainer(monkeypatch):
    from rl.train import job_gpu_placement

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("rl.train.visible_gpu_count", lambda: 8)  # an 8-GPU node
    cfg = _gpu_cfg("engine.urls=[http://a:8000]", "trainer.learner.gpus=null")
    p = job_gpu_placement(cfg)
    assert p.engines == () and p.trainer == "0"
    assert job_gpu_placement(compose("train", ["run_dir=runs/test", GSM8K_TINY_OVERRIDE])) is None  # CPU engines


@pytest.mark.parametrize("overrides,error,match", [
    (["trainer.learner.gpus=[5,6]"], EngineError, "overlaps"),
    (["trainer.rewards.device=cuda:2"], ConfigError, "trainer.rewards.device=cuda:2"),
    (["engine.extra_args=[]"], ConfigError, "--worker-extension-cls"),
    (["engine=cpu", "engine.kv_cache_space_gib=1"], ConfigError, "engine=gpu"),
])
def test_inconsistent_gpu_settings_are_refused_before_anything_starts(monkeypatch, overrides,
                                                                      error, match):
    from rl.train import validate_job_cfg

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("rl.train.visible_gpu_count", lambda: 8)  # an 8-GPU node
    with pytest.raises(error, match=match):
        validate_job_cfg(_gpu_cfg(*overrides))
