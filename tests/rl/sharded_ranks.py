"""One learner rank of a test scenario (run by tests/rl/test_sharded_learner.py with the
launcher's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python tests/rl/sharded_ranks.py train|step|resume|steps|quit WORKDIR MODEL_DIR

Rank 0 drives a ``ShardedLearner`` and writes its results into WORKDIR; the other ranks
run ``rl.distributed.worker_loop`` (logs: WORKDIR/rank<r>.log).

``train`` and ``step`` both take one step on WORKDIR/samples.pkl and write its stats
(stats.json), the weights synced after it (w1/) and DCP's gather of the full model
(full.pt). ``train`` (the tiny model) also writes the sync before the step (w0/), the
log-probs and loss before it, the NCCL stream (streamed.pt), the full optimizer state and
a checkpoint (ckpt/); ``step`` (the packaged 135M model) leaves those out: GBs to gather
and write there, and a fifth of the run on a loaded 2-core machine. ``quit``: rank 0 posts
``stop`` before any learner is built, closes the group and exits at once (``os._exit``).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import torch

from rl.distributed import RankError, RankGroup, rank_from_env, redirect_output, worker_loop
from rl.learner import LearnerConfig
from rl.sharded_learner import ShardedLearner


def main() -> int:
    scenario, work, model_dir = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    info = rank_from_env()
    log = work / f"rank{info.rank}.log"
    (work / f"pid{info.rank}").write_text(str(os.getpid()))
    if info.rank > 0:
        redirect_output(log)
    group = RankGroup(info, "gloo", collective_timeout_s=60, log_path=str(log))
    cfg = LearnerConfig(device="cpu", lr=1e-3, micro_batch_size=2, sync_bucket_mb=0.1)
    if info.rank > 0:
        try:
            return worker_loop(group, lambda g, path, c: ShardedLearner(g, path, c))
        finally:
            group.close()  # as rl.learner_launch.worker_main
    group.stop_on_sigterm()  # as rl.train's rank 0
    if scenario == "quit":  # stop at once and leave as fast as a process can
        group.post("stop")
        group.close()
        group.close()  # a second close does nothing
        os._exit(0)
    group.post("build", model_dir, cfg)
    torch.manual_seed(0)
    learner = ShardedLearner(group, model_dir, cfg)
    samples = pickle.loads((work / "samples.pkl").read_bytes())
    try:
        if scenario in ("train", "step"):
            every = scenario == "train"
            before = {}
            if every:
                learner.save_weights(work / "w0")
                before = {"log_probs": learner.log_probs(samples), "loss": learner.loss(samples)}
            stats = learner.step(samples)
            learner.save_weights(work / "w1")
            if every:
                streamed = learner.weights_for_sync(to_cpu=True)  # the NCCL sync's stream
                meta = [(n, list(t.shape), str(t.dtype)) for n, t in streamed.items()]
                torch.save({"meta": meta, "tensors": {n: t.to("cpu") for n, t in streamed.items()}},
                           work / "streamed.pt")
            torch.save(learner.full_state(optimizer=every), work / "full.pt")
            if every:
                learner.save_checkpoint(work / "ckpt", extra={"sampler": {"num_groups": 3}})
            (work / "stats.json").write_text(json.dumps({"step": stats, **before,
                                                         "disk": vars(learner.disk_estimate(2)),
                                                         "sync": learner.last_sync_stats}))
        elif scenario == "resume":
            extra = learner.load_checkpoint(work / "ckpt")
            torch.save(learner.full_state(), work / f"resumed{info.world_size}.pt")
            (work / f"resumed{info.world_size}.json").write_text(json.dumps(
                {"extra": extra, "version": learner.version}))
        elif scenario == "steps":  # until a rank dies
            (work / "stepping").write_text("1")
            while True:
                learner.step(samples)
    except RankError as e:  # as rl.train's entry point shows it: one line
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        learner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
