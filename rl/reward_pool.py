"""Rewards scored out of the trainer's event loop, in a worker process.

math-verify guards its parsing with SIGALRM, which works only in a process's main thread,
and sandboxed code tests and reward-model calls block; the trainer's event loop must keep
serving rollouts meanwhile. So ``RewardPool`` builds the recipe's ``DomainRewards`` once
in each worker process (spawned, so no CUDA or event-loop state is inherited) and scores
batches there. The rlhf reward model itself runs in its own server process
(``python -m rl.reward_server``), reached over HTTP (``rlhf_scorer=http``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Mapping, Sequence

from rl.data.base import Prompt

_REWARDS = None  # the worker process's DomainRewards


def _init_worker(rcfg: dict, model_path: str) -> None:
    global _REWARDS
    from rl.rewards import rewards_from_config
    from sandbox.snippet import run_tests_in_sandbox

    _REWARDS = rewards_from_config(rcfg, model_path, run_tests_in_sandbox())


def _score(prompts: list[dict], completions: list[str]) -> list[float]:
    return _REWARDS.score([Prompt.from_dict(p) for p in prompts], completions)


class RewardPool:
    """``DomainRewards`` of ``trainer.rewards`` in ``num_workers`` spawned processes.

    Args:
        rcfg: the ``trainer.rewards`` section as a plain dict.
        model_path: the policy model folder (the judge's model when scored locally).
        num_workers: worker processes (each scores one batch at a time).

    ``score`` raises what the rewards raise (e.g. ``RewardError`` for an unknown domain).
    """

    def __init__(self, rcfg: Mapping[str, Any], model_path: str, num_workers: int = 1):
        self._pool = ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_init_worker, initargs=(dict(rcfg), model_path))

    async def score(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """One reward per (prompt, completion), in order."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _score, [p.to_dict() for p in prompts],
                                          list(completions))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
