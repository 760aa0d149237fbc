"""The agent domain: SWE-style task instances run by the agent server (workload class agent)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rl.data.base import DataError, Prompt


class AgentTaskSource:
    """Draws task instances (by ``instance_id``) for agent units.

    The prompt carries no messages: the agent server renders the task's problem
    statement itself; the unit only names the instance (``metadata.instance_id``), and
    the reward is the environment's (the task's tests in the sandbox).

    Args:
        instance_ids: the instances the agent server can run (its ``GET /v1/tasks``).
        name: the domain name.

    Raises:
        DataError: no instance ids.
    """

    def __init__(self, instance_ids: Sequence[str], name: str = "swe"):
        if not instance_ids:
            raise DataError("the agent server has no tasks: build some with "
                            "`python -m agents.envs.build` or keep the handmade tasks")
        self.instance_ids = sorted(instance_ids)
        self.name = name

    def draw(self, rng: np.random.Generator) -> Prompt:
        iid = self.instance_ids[int(rng.integers(len(self.instance_ids)))]
        return Prompt(prompt_id=f"{self.name}/{iid}", domain=self.name, messages=(),
                      metadata={"instance_id": iid})
