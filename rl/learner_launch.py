"""Which learner each rank of ``python -m rl.train`` builds.

Rank 0 (the orchestrator) calls ``make_learner``: the one-process ``rl.learner.Learner``, or
the sharded ``rl.sharded_learner.ShardedLearner`` over the launcher's ranks. Every other
rank runs ``worker_main``: it joins the group and builds its shard of the same learner on
rank 0's ``build`` command (``rl.distributed.worker_loop``). This module sits above the
learners and the rank group, so neither imports the other's builder.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rl.distributed import RankError, RankGroup, RankInfo, redirect_output, worker_loop
from rl.learner import Learner, LearnerConfig, LearnerError
from rl.sharded_learner import ShardedLearner, make_sharded_learner


def make_learner(model_path: str | Path, cfg: LearnerConfig, group=None):
    """The learner for this job: ``ShardedLearner`` over ``group``'s ranks when
    ``cfg.backend`` is ``fsdp`` or the launcher started more than one rank, else ``Learner``.

    Args:
        group: ``rl.distributed.RankGroup`` (rank 0's), required for the sharded learner.

    Raises:
        LearnerError: several ranks with ``backend=deepspeed`` (ZeRO 1/2 here is one rank).
    """
    world = group.world_size if group is not None else 1
    if cfg.backend == "deepspeed" and world > 1:
        raise LearnerError(f"{world} learner ranks with trainer.learner.backend=deepspeed: the "
                           "sharded learner is FSDP2; set trainer.learner.backend=fsdp")
    if cfg.backend == "fsdp" or world > 1:
        if group is None:
            raise LearnerError("trainer.learner.backend=fsdp needs the learner's ranks "
                               "(rl.distributed.RankGroup)")
        return make_sharded_learner(group, model_path, cfg)
    return Learner(model_path, cfg)


def worker_main(info: RankInfo, device: str, collective_timeout_s: float) -> int:
    """A worker rank of ``python -m rl.train``: join the group, log to
    ``<run_dir>/logs/learner-rank<r>.log`` (the run folder rank 0 publishes), then
    ``worker_loop`` with the sharded learner. Returns the exit status."""
    import torch

    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    group = RankGroup(info, "nccl" if on_gpu else "gloo", collective_timeout_s)
    try:
        log = Path(group.fetch("run_dir")) / "logs" / f"learner-rank{info.rank}.log"
        redirect_output(log)
        group.set_log(str(log))
        return worker_loop(group, lambda g, path, cfg: ShardedLearner(g, path, cfg))
    except RankError as e:
        print(e, file=sys.stderr, flush=True)
        return 1
    finally:
        group.close()
