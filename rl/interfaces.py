"""What the trainer (``rl/trainer.py``) calls, as Protocols: the learner, a rollout worker,
the evaluation. The weight sync's interface (``WeightSync``) is the rollout side's, in
``rollout/weight_sync.py``; a ``Learner`` is the ``WeightSource`` it reads.

Each Protocol lists the calls the trainer makes and when it makes them. Implemented by
``rl.learner.Learner`` and ``rl.sharded_learner.ShardedLearner`` (``Learner``),
``rl.workers.SingleTurnWorker.run`` and ``AgentWorker.run`` (``Worker``), and the
``evaluate`` that ``rl.train`` builds (``Evaluate``); they match by shape, so a test's fake
needs no import.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from rollout.weight_sync import WeightSource

if TYPE_CHECKING:
    from rl.grpo import TrainSample
    from rl.sampler import RolloutUnit
    from rl.workers import UnitResult


class Learner(WeightSource, Protocol):
    """The policy update, as the trainer drives it.

    Attributes:
        version: the policy version: 0 at start, +1 per optimizer step (restored by
            ``load_checkpoint``). Units are stamped with it and staleness counted against it.
    """

    version: int

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One optimizer step on a batch's samples (called in a worker thread once
        ``groups_per_step`` groups are ready); returns its figures (``loss``, ``kl``, ...)."""

    def abort_step(self) -> None:
        """Called from the event loop's thread when the job stops during a ``step``: the
        step should end soon, without updating (``rl.learner.StepAborted``), or may run to
        its end where it cannot stop early."""

    def save_checkpoint(self, folder: Path, extra: dict[str, Any] | None = None) -> Path:
        """Model, optimizer, version and the JSON-able ``extra`` (sampler and mixture ledger
        state) in ``folder``, replaced atomically (every ``checkpoint_every`` steps)."""

    def load_checkpoint(self, folder: Path) -> dict[str, Any]:
        """Restore ``save_checkpoint``'s folder (on resume); returns its ``extra``."""


class Worker(Protocol):
    """A rollout worker: one released unit -> its finished (or failed) result. Runs as an
    asyncio task per unit while the trainer releases and trains."""

    async def __call__(self, unit: RolloutUnit) -> UnitResult: ...


class Evaluate(Protocol):
    """The held-out evaluation, through the same serving stack (pass@k), every
    ``eval_every`` steps and once at step 0."""

    async def __call__(self, version: int) -> dict[str, float]: ...
