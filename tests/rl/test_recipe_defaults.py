"""The default recipe (recipe=mixed_step) resolves to the settings chosen for learning you
can see in `make run` (issue 16; the measurement behind them is in
recipes/recipe/mixed_step.yaml and bench/rlvr_settings.py)."""

from omegaconf import OmegaConf

from common.config import compose


def test_default_recipe_resolves_to_the_learning_settings():
    cfg = compose("train", ["run_dir=runs/test"])
    t = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert t["learner"]["lr"] == 5e-5
    assert t["iterations"] == 8 and t["eval_every"] == 4
    assert t["sampling"] == {"temperature": 0.8, "top_p": 1.0}
    assert t["max_tokens"] == {"rlvr": 160, "rlhf": 64}
    assert t["group_size"] == {"agent": 4, "rlvr": 8, "rlhf": 4} and t["groups_per_step"] == 6
    assert (t["agent_limits"]["max_turns"], t["agent_limits"]["max_tokens_per_turn"]) == (2, 64)
    rlvr = t["domains"]["rlvr"]
    assert rlvr["arithmetic"] == {"weight": 1.0, "levels": [1, 2, 3]}
    assert rlvr["gsm8k"]["weight"] == 0.0 and rlvr["code"]["weight"] == 0.0
    assert t["eval"]["levels"] == [1, 2, 3] and t["eval"]["problems"] == 48
    assert (t["eval"]["temperature"], t["eval"]["top_p"], t["eval"]["max_tokens"]) == (0.8, 0.95, 256)
    assert t["dynamic_sampling"] == {"enabled": True, "max_release_factor": 3}
    assert t["loss"]["tis_cap"] is None
    assert list(cfg.agents.task_sets) == ["constant_fix_l1"] and cfg.agents.tool_listing == "signatures"


def test_default_recipe_passes_the_pre_start_checks():
    from rl.train import validate_trainer_cfg

    validate_trainer_cfg(compose("train", ["run_dir=runs/test"]).trainer)


def test_a_release_factor_below_one_is_refused_before_start():
    import pytest

    from common.config import ConfigError
    from rl.train import validate_trainer_cfg

    cfg = compose("train", ["run_dir=runs/test", "trainer.dynamic_sampling.max_release_factor=0.5"])
    with pytest.raises(ConfigError, match="max_release_factor"):
        validate_trainer_cfg(cfg.trainer)
