"""One short real run of the main job: real engine, router, agent server, reward server,
learner and weight sync, from the command line (``python -m rl.train``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from common.config import REPO_ROOT
from tests.conftest import GSM8K_TINY_OVERRIDE

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _leftover_processes(run_dir) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(run_dir) in line and "ps -eo" not in line]


def test_main_job_trains_one_iteration_end_to_end_and_stops_everything(tmp_path):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "rl.train", "recipe=mixed_step", "router=misa-t",
            f"run_dir={run_dir}", GSM8K_TINY_OVERRIDE, "engine.num_engines=1", "engine.kv_cache_space_gib=0.25",
            "trainer.iterations=1", "trainer.groups_per_step=3", "trainer.max_in_flight=12",
            "trainer.group_size.agent=2", "trainer.group_size.rlvr=2", "trainer.group_size.rlhf=2",
            "trainer.rho.agent=1", "trainer.rho.rlvr=1", "trainer.rho.rlhf=1",
            "trainer.max_tokens.rlvr=32", "trainer.max_tokens.rlhf=32",
            "trainer.agent_limits.max_turns=2", "trainer.agent_limits.max_tokens_per_turn=32",
            "trainer.eval_every=1", "trainer.eval.problems=2", "trainer.eval.max_tokens=16",
            "logging.rollout_line_every_s=0"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1500, cwd=REPO_ROOT,
                       env={**__import__("os").environ, "WANDB_MODE": "offline"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # with eval_every, a step-0 evaluation line (baseline) comes before the iteration's
    base = [x for x in lines if x.get("baseline")]
    assert len(base) == 1 and base[0]["iteration"] == 0 and "eval/arithmetic/pass@1" in base[0]
    lines = [x for x in lines if not x.get("baseline")]
    assert len(lines) == 1
    m = lines[0]
    assert m["iteration"] == 1
    for key in ("samples_per_min", "requests_per_min", "prefix_hit_rate", "decode_tok_s",
                "consumed_mixture", "tv_distance", "backlog", "sync_s", "update_s"):
        assert key in m, key
    assert m["sync_s"] > 0  # the new weights went into the running engine
    assert 0.0 <= m["eval/arithmetic/pass@1"] <= 1.0  # pass@k through the same stack
    assert sum(m["completed"].values()) >= 6  # three groups of two
    assert (run_dir / "checkpoint").is_dir()
    from rollout.model import check_model_path  # the checkpoint is a model folder rl.eval takes

    check_model_path(OmegaConf.create({"path": str(run_dir / "checkpoint")}))
    assert (run_dir / "checkpoint" / "tokenizer_config.json").is_file()
    assert (run_dir / "plots" / "mixture.png").exists()
    for log in ("engine-0.log", "router.log", "agent_server.log", "reward_server.log"):
        assert (run_dir / "logs" / log).exists(), log
    assert "samples/min" in r.stdout
    assert "GRPO iteration 1/1" in r.stdout  # not a terminal: one progress line per iteration, not only at the end
    # the iteration that ended with an evaluation says its held-out scores as it happens
    assert any(line.startswith("GRPO iteration 1/1") and "held-out arithmetic/pass@1 " in line
               for line in r.stdout.splitlines())
    assert not any(line.startswith("GRPO ━") for line in r.stdout.splitlines())  # no bar drawn at the end
    # the silent minutes before iteration 1 say what they are doing
    assert "evaluating the initial weights" in r.stdout and "step 0 (initial weights): arithmetic/pass@1" in r.stdout
    # and while the rollouts run (a line per unit back here; every 30 s by default)
    assert "rollouts for iteration 1: " in r.stdout and " units back (" in r.stdout
    assert "disk: about " in r.stdout and " GB for checkpoints in " in r.stdout
    assert "\r" not in r.stdout + r.stderr  # and no progress bar redrawn into it (the learner's weight loading)
    assert _leftover_processes(run_dir) == []
