"""The train/inference mismatch metric against a real engine (marked ``engine``).

Right after a weight sync the engine samples from the learner's weights, so the learner's
log-probs of the sampled tokens (from its loss forward pass, before the optimizer step)
equal the engine's to float error; when the engine serves stale weights on purpose (the
learner moved and nothing was synced) the metric is clearly above that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
import torch

from tests.conftest import SERVED_NAME

PROMPTS = ("What is 17 + 25? Give the final answer as a number in \\boxed{}.",
           "Name three colours of the rainbow.")


def _engine_samples(url: str, learner, advantages=(1.0, -1.0)):
    """One completion per prompt from the engine (temperature 1), as TrainSamples with
    the engine's log-probs, stamped with the learner's current version."""
    from rl.grpo import TrainSample
    from rollout.client import ModelClient
    from router.headers import SessionHeaders

    tok = learner.tokenizer
    end = tok.convert_tokens_to_ids(tok.eos_token)

    async def go():
        async with httpx.AsyncClient() as http:
            client = ModelClient(http, url, SERVED_NAME, sampling={"temperature": 1.0, "top_p": 1.0},
                                 timeout_s=600)
            out = []
            for i, text in enumerate(PROMPTS):
                ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                              add_generation_prompt=True)
                ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
                c = await client.complete(ids, 24, end, SessionHeaders(f"mismatch-{i}", "rlvr"), True)
                out.append(TrainSample(ids, c.token_ids, [float(x) for x in c.logprobs],
                                       advantages[i], policy_version=learner.version))
            return out

    return asyncio.run(go())


@pytest.mark.engine
def test_mismatch_is_near_zero_after_a_sync_and_clear_when_the_engine_is_stale(real_engine_url,
                                                                                model_path):
    from rl.learner import Learner, LearnerConfig
    from rollout.weight_sync import HttpReloadSync, WeightSyncConfig

    learner = Learner(model_path, LearnerConfig(lr=1e-6, micro_batch_size=1))
    torch.manual_seed(2)
    with torch.no_grad():  # weights the engine did not start with, so the sync matters
        for p in learner.model.parameters():
            p.add_(2e-3 * torch.randn_like(p))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(model_path)
    sync = HttpReloadSync([real_engine_url], WeightSyncConfig(shm_dir=f"{shm}/misa-rl-test-mismatch"))
    try:
        sync.sync(learner, policy_version=learner.version)
        in_sync = learner.step(_engine_samples(real_engine_url, learner))
        assert in_sync["mismatch/tokens"] > 0
        assert in_sync["mismatch/logprob_abs_diff"] < 1e-3, in_sync
        assert in_sync["mismatch/k3_kl"] < 1e-4, in_sync
        # Stale on purpose: the learner moves on (its step, plus noise), nothing is synced.
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(1e-2 * torch.randn_like(p))
        stale = learner.step(_engine_samples(real_engine_url, learner))
        assert stale["mismatch/logprob_abs_diff"] > 2e-2, stale
        assert stale["mismatch/k3_kl"] > 10 * in_sync["mismatch/k3_kl"], (stale, in_sync)
        print(f"in sync: |d| {in_sync['mismatch/logprob_abs_diff']:.2e}, k3 "
              f"{in_sync['mismatch/k3_kl']:.2e}; stale: |d| {stale['mismatch/logprob_abs_diff']:.2e}, "
              f"k3 {stale['mismatch/k3_kl']:.2e}")
    finally:
        sync.close()
