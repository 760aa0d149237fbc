"""Shared fixtures of the RL tests: the real policy model folder, one real vLLM engine."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def policy_model_path() -> str:
    """The prepared default policy model (SmolLM2-135M-Instruct, converted once)."""
    from rl.config import compose
    from rollout.model import resolve_model_path

    return resolve_model_path(compose("train").model)


@pytest.fixture(scope="session")
def real_engine_url(policy_model_path, tmp_path_factory) -> str:
    """One real vLLM CPU engine (eager, one replica) for the whole test session; stopped
    in the finalizer. Its log is in the session's tmp folder (engine-0.log)."""
    from omegaconf import OmegaConf

    from rollout.engines import EnginePool

    ecfg = OmegaConf.load(Path(__file__).resolve().parents[2] / "recipes/engine/cpu.yaml")
    ecfg.num_engines = 1
    log_dir = tmp_path_factory.mktemp("engine")
    pool = EnginePool.start(ecfg, policy_model_path, "smollm2-135m", 2048, "float32", log_dir)
    try:
        yield pool.urls[0]
    finally:
        pool.stop()
