"""The asynchronous GRPO loop (rl.trainer) with fake workers and a fake learner.

The loop's own rules are checked here: iterations and metrics, the mixture ledger's
books, the staleness bound, failed units, checkpoint and resume. The real learner,
rewards, workers and engines have their own tests.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from omegaconf import OmegaConf

from rl.data import ArithmeticSource, InstructionSource
from rl.data.agent_tasks import AgentTaskSource
from rl.mixture import MixtureLedger
from rl.sampler import MixtureSampler, WorkloadClassSpec
from rl.trainer import Trainer, trainer_config
from rl.workers import UnitResult

RHO = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}


class FakeLearner:
    """Counts steps and what it was trained on; checkpoints to JSON."""

    def __init__(self):
        self.version = 0
        self.trained = []

    def step(self, samples):
        self.trained.append(list(samples))
        self.version += 1
        return {"loss": 0.5, "kl": 0.0}

    def abort_step(self):  # a fake step is instant: nothing to abort
        pass

    def save_weights(self, folder):
        return folder

    def save_checkpoint(self, folder, extra=None):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.json").write_text(json.dumps({"version": self.version, "extra": extra}))
        return folder

    def load_checkpoint(self, folder):
        state = json.loads((folder / "state.json").read_text())
        self.version = state["version"]
        return state["extra"]


class SlowLearner(FakeLearner):
    def __init__(self, step_s):
        super().__init__()
        self.step_s = step_s

    def step(self, samples):
        import time

        time.sleep(self.step_s)  # runs in a worker thread, as the real learner does
        return super().step(samples)


def tcfg(**kw):
    base = {"max_in_flight": 16, "max_staleness": 1, "groups_per_step": 2, "iterations": 3,
            "sync_every": 1, "checkpoint_every": 1, "loss": {"scale_adv_by_std": True},
            "dynamic_sampling": {"enabled": True, "max_release_factor": 4}}
    return OmegaConf.create({**base, **kw})


def sampler(seed=0):
    return MixtureSampler(RHO, {
        "agent": WorkloadClassSpec({"swe": (AgentTaskSource(["t1", "t2", "t3"]), 1.0)}, group_size=2),
        "rlvr": WorkloadClassSpec({"arithmetic": (ArithmeticSource(levels=(1, 2)), 1.0)}, group_size=4),
        "rlhf": WorkloadClassSpec({"instructions": (InstructionSource(), 1.0)}, group_size=2),
    }, seed=seed, run_id="test")


def make_worker(fail=lambda unit: False, hold=None):
    """A rollout worker whose reward is the unit's own: 1 for odd ``group_index``, 0 for
    even, so every group of two or more units (also one that lost its first unit) has
    unequal rewards and no advantage is 0, whatever order the units finish in.

    Args:
        fail: units for which the model call fails.
        hold: ``unit -> awaitable or None``; the unit finishes only once it is done (an
            event the test sets), so which units are overtaken never depends on timing.
    """

    async def run(unit):
        waiter = hold(unit) if hold is not None else None
        if waiter is not None:
            await waiter
        if fail(unit):
            return UnitResult(unit, False, error="model call failed", num_requests=1)
        return UnitResult(unit, True, reward=float(unit.group_index % 2), prompt_ids=[1, 2, 3],
                          completion_ids=[4, 5], logprobs=[-0.1, -0.2], num_requests=1)

    return run


class FakeSync:
    def __init__(self):
        self.versions = []

    def sync(self, write_weights, version):
        self.versions.append(version)

        class Report:
            def as_metrics(self):
                return {"weight_sync/total_s": 0.01}

        return Report()


def trainer(tmp_path, cfg, workers=None, learner=None, sync=None, model_source=None):
    w = make_worker()
    return Trainer(trainer_config(cfg), sampler=sampler(), mixture_ledger=MixtureLedger(RHO),
                   learner=learner or FakeLearner(),
                   workers=workers or {"agent": w, "rlvr": w, "rlhf": w}, engine_urls=[],
                   router_url=None, weight_sync=sync, run_dir=tmp_path, model_source=model_source)


def books_balance(ledger: MixtureLedger) -> bool:
    s = ledger.snapshot()
    return all(s["released"][b] == s["completed"][b] + s["dropped"][b] + s["in_flight"][b]
               for b in s["released"])


def test_loop_takes_the_configured_steps_and_logs_each(tmp_path):
    sync = FakeSync()
    t = trainer(tmp_path, tcfg(), sync=sync)
    history = asyncio.run(t.run())
    assert [h["iteration"] for h in history] == [1, 2, 3]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    m = json.loads(lines[-1])
    for key in ("iteration_s", "generation_wait_s", "update_s", "samples_per_min",
                "requests_per_min", "consumed_mixture", "tv_distance", "backlog", "loss/loss"):
        assert key in m
    assert sync.versions == [1, 2, 3]
    assert m["sync_s"] == 0.01
    assert (tmp_path / "checkpoint" / "state.json").exists()


def test_a_sharded_learners_gather_figures_are_in_the_sync_metrics(tmp_path):
    class GatheringLearner(FakeLearner):
        # what ShardedLearner._gather_buckets leaves after each sync
        last_sync_stats = {"gather_s": 0.25, "buckets": 3.0, "gathered_gib": 0.5,
                           "peak_mem_gib_rank0": 1.5, "peak_mem_gib_rank1": 0.75}

    t = trainer(tmp_path, tcfg(iterations=1), learner=GatheringLearner(), sync=FakeSync())
    asyncio.run(t.run())
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["sync/gather/gather_s"] == 0.25 and m["sync/gather/buckets"] == 3.0
    assert (m["sync/gather/peak_mem_gib_rank0"], m["sync/gather/peak_mem_gib_rank1"]) == (1.5, 0.75)


class BusyLearner(FakeLearner):
    """A step that burns CPU in this process and leaves a child process burning it too (a
    stand-in for the rollouts beside the update); the child is still running at the meter's
    end reading and is stopped by the test."""

    def __init__(self):
        super().__init__()
        self.children = []

    def step(self, samples):
        import subprocess
        import sys
        import time

        import psutil

        child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                                  "while time.process_time() - t < 0.3: pass\ntime.sleep(60)"])
        self.children.append(child)
        t = time.thread_time()
        while time.thread_time() - t < 0.05:  # CPU work in this process, whatever the load
            pass
        proc = psutil.Process(child.pid)
        while sum(proc.cpu_times()[:2]) < 0.1:  # the child has used CPU during the step
            time.sleep(0.01)
        return super().step(samples)


def test_each_update_says_how_many_cores_each_role_of_the_job_used_meanwhile(tmp_path):
    learner = BusyLearner()
    try:
        asyncio.run(trainer(tmp_path, tcfg(iterations=2), learner=learner).run())
    finally:
        for child in learner.children:
            child.kill()
            child.wait()
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        assert m["cpu_update/job"] > 0 and m["cpu_update/other"] > 0  # this process; the child
        # the engines' sum covers the engine roles of the tree (in the full suite, pytest's own
        # session-wide engines are in it too, so it need not be 0)
        parts = [m.get(f"cpu_update/{r}", 0.0) for r in ("engine_worker", "engine_core", "api_server")]
        assert m["cpu_update/engines"] == pytest.approx(sum(parts), abs=2e-3)


def test_update_cores_sums_the_engines_roles():
    from rl.trainer import update_cores

    cores = {"job": 1.1, "engine_worker": 0.6, "engine_core": 0.2, "api_server": 0.05, "router": 0.01}
    assert update_cores(cores) == {**cores, "engines": 0.85}


def test_every_released_unit_is_completed_dropped_or_in_flight_exactly_once(tmp_path):
    t = trainer(tmp_path, tcfg(iterations=4))
    history = asyncio.run(t.run())
    assert books_balance(t.mixture_ledger)
    # Completed = trained on + consumed without signal (a filtered group, or a unit of
    # zero advantage inside an informative one).
    s = t.mixture_ledger.snapshot()
    assert sum(s["completed"].values()) == (sum(len(b) for b in t.learner.trained)
                                            + sum(h["zero_advantage_units"] + h["filtered_units"]
                                                  for h in history))


def test_consumed_mixture_follows_the_target(tmp_path):
    t = trainer(tmp_path, tcfg(iterations=12, groups_per_step=3, max_in_flight=24))
    asyncio.run(t.run())
    assert t.mixture_ledger.consumed_tv() < 0.15


def test_units_older_than_the_staleness_bound_are_dropped_not_trained(tmp_path):
    # The first agent group is held until the trainer has published version
    # max_staleness + 1 = 2 (its metrics line, the log callback), then finishes: released
    # at version 0, it is too old (2 > 0 + 1) and dropped. The trainer never needs it to
    # get there: with groups_per_step 1 and max_staleness 1 the release budget is 2 groups
    # (rl.trainer._release), the held one takes one, the other slot keeps the steps going.
    published = asyncio.Event()
    held: set[str] = set()

    def hold(unit):
        if unit.workload_class == "agent" and (not held or unit.group_id in held):
            held.add(unit.group_id)
            return published.wait()
        return None

    def on_iteration(m):
        if m["policy_version"] >= 2:
            published.set()

    learner, w = FakeLearner(), make_worker(hold=hold)
    t = Trainer(trainer_config(tcfg(max_staleness=1, iterations=6, groups_per_step=1)), sampler=sampler(),
                mixture_ledger=MixtureLedger(RHO), learner=learner, workers={"agent": w, "rlvr": w, "rlhf": w},
                engine_urls=[], router_url=None, weight_sync=None, run_dir=tmp_path, log=on_iteration)
    history = asyncio.run(t.run())
    assert len(held) == 1 and published.is_set()
    assert sum(h["dropped_stale"] for h in history) == 2  # the held group's 2 units, no other
    # every other unit was trained on (all groups informative, no advantage 0)
    s = t.mixture_ledger.snapshot()
    assert sum(len(b) for b in learner.trained) == sum(s["completed"].values())
    assert s["dropped"] == {**{b: 0 for b in s["dropped"]}, "agent": 2}
    assert all(h["staleness_mean"] <= 1.0 for h in history)
    assert books_balance(t.mixture_ledger)


def test_release_stops_at_what_the_staleness_window_can_train(tmp_path):
    t = trainer(tmp_path, tcfg(max_staleness=1, groups_per_step=2, max_in_flight=1000, iterations=5))
    history = asyncio.run(t.run())
    released = sum(t.mixture_ledger.released_units.values())
    # At most (max_staleness + 1) * groups_per_step groups beyond those consumed (trained
    # on, or without signal: zero advantage or a filtered group).
    assert released <= sum(h["trained_units"] + h["zero_advantage_units"] + h["filtered_units"]
                           for h in history) + 4 * 4
    assert sum(h["dropped_stale"] for h in history) == 0


def test_failed_units_are_dropped_and_never_trained(tmp_path):
    bad = make_worker(fail=lambda u: u.group_index == 0)
    learner = FakeLearner()
    t = trainer(tmp_path, tcfg(), workers={"agent": bad, "rlvr": bad, "rlhf": bad}, learner=learner)
    history = asyncio.run(t.run())
    assert sum(h["dropped_failed"] for h in history) > 0
    trained = [s for batch in learner.trained for s in batch]
    assert trained and len(trained) == sum(h["trained_units"] for h in history)
    assert all(s.advantage != 0.0 for s in trained)  # equal-reward groups carry no signal
    assert books_balance(t.mixture_ledger)


def test_resume_continues_from_the_checkpoint_without_counting_a_unit_twice(tmp_path):
    first = trainer(tmp_path, tcfg(iterations=2))
    asyncio.run(first.run())
    completed_before = dict(first.mixture_ledger.completed_units)

    second = trainer(tmp_path, tcfg(iterations=4))
    assert second.resume()
    assert second.learner.version == 2
    assert second.mixture_ledger.in_flight() == 0  # units lost with the old process were dropped
    assert second.sampler.num_groups == first.sampler.num_groups
    history = asyncio.run(second.run())
    assert [h["iteration"] for h in history][-2:] == [3, 4]
    assert all(second.mixture_ledger.completed_units[b] >= n for b, n in completed_before.items())
    assert books_balance(second.mixture_ledger)


def test_no_worker_for_a_released_class_is_a_clear_error(tmp_path):
    from rl.trainer import TrainerError

    w = make_worker()
    t = trainer(tmp_path, tcfg(), workers={"rlvr": w, "rlhf": w})
    with pytest.raises(TrainerError, match="no rollout worker for workload class 'agent'"):
        asyncio.run(t.run())


def test_evaluation_runs_every_k_steps_and_lands_in_the_metrics(tmp_path):
    calls = []

    async def evaluate(version):
        calls.append(version)
        return {"eval/arithmetic/pass@1": 0.25}

    w = make_worker()
    t = Trainer(trainer_config(tcfg(iterations=4, eval_every=2)), sampler=sampler(),
                mixture_ledger=MixtureLedger(RHO), learner=FakeLearner(),
                workers={"agent": w, "rlvr": w, "rlhf": w}, engine_urls=[], router_url=None,
                weight_sync=None, run_dir=tmp_path, evaluate=evaluate)
    history = asyncio.run(t.run())
    assert calls == [2, 4]
    assert [h.get("eval/arithmetic/pass@1") for h in history] == [None, 0.25, None, 0.25]


def test_batch_takes_ready_groups_by_consumption_deficit_not_finish_order(tmp_path):
    t = trainer(tmp_path, tcfg(groups_per_step=2))
    units = t.sampler.release(40, 0)
    groups = {}
    for u in units:
        groups.setdefault(u.group_id, []).append(UnitResult(u, True))
    ready = sorted(groups.values(), key=lambda g: g[0].unit.workload_class != "agent")  # agent first
    for g in ready[:3]:  # the ledger has already consumed agent units
        for r in g:
            t.mixture_ledger.record_released(r.unit.unit_id, r.unit.workload_class)
    for g in ready[:2]:
        for r in g:
            t.mixture_ledger.record_completed(r.unit.unit_id)
    batch, rest = t._pick_batch(ready[2:])
    assert {g[0].unit.workload_class for g in batch} == {"rlvr", "rlhf"}
    assert len(rest) == len(ready) - 4


def test_failed_units_are_logged_with_their_reason_and_counted_per_reason(tmp_path, caplog):
    import logging

    from rl.trainer import DROP_LOG_LINES_PER_REASON

    def run_with(reason, error):
        async def run(unit):
            return UnitResult(unit, False, error=error, drop_reason=reason, num_requests=1)
        return run

    good = make_worker()
    workers = {"agent": run_with("agent_timeout", "agent server: no answer within 0.2 s"),
               "rlvr": good, "rlhf": run_with("aborted", "completion aborted by the engine")}
    t = trainer(tmp_path, tcfg(max_in_flight=32), workers=workers)
    with caplog.at_level(logging.WARNING, logger="rl.trainer"):
        history = asyncio.run(t.run())
    by_reason: dict[str, int] = {}
    for h in history:
        for reason, n in h["dropped_by_reason"].items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    assert set(by_reason) == {"agent_timeout", "aborted"}
    assert sum(by_reason.values()) == sum(h["dropped_failed"] for h in history)
    lines = [r.getMessage() for r in caplog.records]
    one_each = [m for m in lines if m.startswith("dropped unit")]
    assert any("agent_timeout" in m and "no answer within 0.2 s" in m for m in one_each)
    assert any("aborted" in m and "aborted by the engine" in m for m in one_each)
    assert len(one_each) <= DROP_LOG_LINES_PER_REASON * 2 * len(history)  # rate-limited
    assert books_balance(t.mixture_ledger)


def test_drops_beyond_the_first_few_per_reason_go_into_one_summary_line(caplog):
    import logging

    from rl.trainer import DROP_LOG_LINES_PER_REASON, IterationStats

    unit = sampler().next_group(0)[0]
    it = IterationStats(0.0)
    with caplog.at_level(logging.WARNING, logger="rl.trainer"):
        for _ in range(DROP_LOG_LINES_PER_REASON + 5):
            it.record_failed(UnitResult(unit, False, error="no answer", drop_reason="agent_timeout"))
        it.record_failed(UnitResult(unit, False, error="cut", drop_reason="aborted"))
        it.log_unlogged_drops()
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if m.startswith("dropped unit")]) == DROP_LOG_LINES_PER_REASON + 1
    assert lines[-1] == "dropped 5 more unit(s) this iteration: agent_timeout 5"
    assert it.dropped_by_reason == {"agent_timeout": DROP_LOG_LINES_PER_REASON + 5, "aborted": 1}
    assert it.dropped_failed == DROP_LOG_LINES_PER_REASON + 6


def test_loop_goes_on_when_the_agent_server_never_answers(tmp_path):
    from agents.client import AgentServerClient
    from rl.workers import AgentWorker
    from tests.rollout.test_workers import hanging_agent_server

    async def go():
        async with hanging_agent_server() as url:
            client = AgentServerClient(url, timeout_s=0.2)
            try:
                good = make_worker()
                agent = AgentWorker(client, "http://router:9000", "m").run
                t = trainer(tmp_path, tcfg(), workers={"agent": agent, "rlvr": good, "rlhf": good})
                return await t.run()
            finally:
                await client.aclose()

    history = asyncio.run(go())
    assert [h["iteration"] for h in history] == [1, 2, 3]
    assert sum(h["dropped_by_reason"].get("agent_timeout", 0) for h in history) > 0


@pytest.mark.parametrize("keep_last", [1, 2])
def test_only_the_last_keep_last_checkpoints_stay_and_resume_reads_the_newest(tmp_path, keep_last):
    t = trainer(tmp_path, tcfg(iterations=4, checkpoint_keep_last=keep_last))
    asyncio.run(t.run())  # a checkpoint after each of the 4 steps
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint"))
    newest = [f"checkpoint-v{v}" for v in range(5 - keep_last, 5)]
    assert kept == sorted(["checkpoint", *newest])
    assert (tmp_path / "checkpoint").resolve() == (tmp_path / "checkpoint-v4").resolve()
    again = trainer(tmp_path, tcfg(iterations=5, checkpoint_keep_last=keep_last))
    assert again.resume() and again.learner.version == 4


def test_a_checkpoint_of_the_old_single_folder_layout_is_kept_as_one_of_the_last(tmp_path):
    old = tmp_path / "checkpoint"  # a real folder, as runs before checkpoint_keep_last wrote
    old.mkdir()
    (old / "state.json").write_text(json.dumps({"version": 0, "extra": {}}))
    (old / "trainer_state.json").write_text(json.dumps({"version": 0}))
    t = trainer(tmp_path, tcfg(iterations=1, checkpoint_keep_last=2))
    asyncio.run(t.run())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint")) == [
        "checkpoint", "checkpoint-v0", "checkpoint-v1"]


class SafetensorsCheckpointLearner(FakeLearner):
    """A learner whose checkpoint holds the weights as ``model.safetensors`` (the torch
    backend): nothing else may write them."""

    def save_checkpoint(self, folder, extra=None):
        super().save_checkpoint(folder, extra)
        (folder / "model.safetensors").write_text(f"checkpoint weights v{self.version}")
        return folder

    def save_weights(self, folder):
        raise AssertionError("the checkpoint holds its weights already")


class WeightWritingLearner(FakeLearner):
    """A learner whose checkpoints hold no safetensors weights (DeepSpeed's, the sharded
    learner's DCP shards): ``save_weights`` must write them beside."""

    def save_weights(self, folder):
        (folder / "model.safetensors").write_text(f"saved weights v{self.version}")
        return folder


@pytest.mark.parametrize(("learner_cls", "weights"), [(SafetensorsCheckpointLearner, "checkpoint weights v1"),
                                                      (WeightWritingLearner, "saved weights v1")])
def test_a_checkpoint_is_a_model_folder_with_the_starting_models_config_and_tokenizer(tmp_path, learner_cls,
                                                                                       weights):
    source = tmp_path / "base"
    source.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors", "model.safetensors.index.json"):
        (source / name).write_text("base " + name)
    (tmp_path / "run").mkdir()
    t = trainer(tmp_path / "run", tcfg(iterations=1), learner=learner_cls(), model_source=source)
    asyncio.run(t.run())
    ckpt = (tmp_path / "run" / "checkpoint").resolve()
    assert (ckpt / "config.json").read_text() == "base config.json"
    assert (ckpt / "tokenizer.json").is_file()
    assert not (ckpt / "model.safetensors.index.json").exists()  # the base's index would misname the weights
    assert (ckpt / "model.safetensors").read_text() == weights


def test_disk_estimate_counts_weights_adam_state_keep_last_and_the_sync_folder():
    from rl.learner import disk_estimate

    # 1,000 fp32 parameters of which 100 are a tied head copied into every file:
    # weights 1,100 x 4 = 4,400 B; AdamW keeps 2 fp32 moments of the 1,000: 8,000 B
    est = disk_estimate(num_params=1000, tied_head_params=100, param_bytes=4, keep_last=2)
    assert est.checkpoint_bytes == 4400 + 8000
    assert est.checkpoints_bytes == 3 * (4400 + 8000)  # keep_last + the one being written
    assert est.weight_sync_bytes == 2 * 4400  # the new version's folder beside the last


def group_pattern_worker(informative):
    """A worker whose groups have mixed rewards (1 for the first unit, 0 for the rest)
    when ``informative(k)`` holds for the group's arrival order k, and all rewards 0 else."""
    order: dict[str, int] = {}

    async def run(unit):
        k = order.setdefault(unit.group_id, len(order))
        reward = float(informative(k, unit) and unit.group_index == 0)
        return UnitResult(unit, True, reward=reward, prompt_ids=[1, 2, 3], completion_ids=[4, 5],
                          logprobs=[-0.1, -0.2], num_requests=1)

    return run


def test_equal_reward_groups_are_replaced_so_no_step_is_empty(tmp_path):
    # Agent groups always score 0 (as the 135M model does on every agent task), and every
    # other rlvr/rlhf group too: without dynamic sampling a step of such groups trains on
    # nothing. With it, each step waits for groups_per_step informative groups.
    w = group_pattern_worker(lambda k, u: u.workload_class != "agent" and k % 2 == 0)
    sync, learner = FakeSync(), FakeLearner()
    t = trainer(tmp_path, tcfg(iterations=4, max_in_flight=24), sync=sync, learner=learner,
                workers={"agent": w, "rlvr": w, "rlhf": w})
    history = asyncio.run(t.run())
    assert [h["iteration"] for h in history] == [1, 2, 3, 4]
    assert all(not h["skipped_update"] and h["trained_units"] > 0 for h in history)
    assert len(learner.trained) == 4 and sync.versions == [1, 2, 3, 4]
    # each step trained on 2 groups, one unit of advantage != 0 in each... all units of a
    # mixed group have advantage != 0 here (rewards 1, 0, 0, ...: none equals the mean)
    assert all({s.advantage != 0.0 for s in batch} == {True} for batch in learner.trained)
    assert sum(h["filtered_groups"] for h in history) > 0
    assert all(h.get("filtered_share/agent", 1.0) == 1.0 for h in history)
    # per class, the units and the (informative) groups that entered each step's gradient
    for h, batch in zip(history, learner.trained):
        assert sum(h["trained_units_by_class"].values()) == h["trained_units"] == len(batch)
        assert "agent" not in h["trained_units_by_class"] and "agent" not in h["trained_groups_by_class"]
        # at most groups_per_step; every unit of a mixed group trains (rlvr G=4, rlhf G=2)
        assert 1 <= sum(h["trained_groups_by_class"].values()) <= 2
        sizes = {"rlvr": 4, "rlhf": 2}
        assert h["trained_units_by_class"] == {b: sizes[b] * n for b, n in h["trained_groups_by_class"].items()}
    # filtered units are consumed (the mixture ledger's books), never trained on
    s = t.mixture_ledger.snapshot()
    assert s["completed"]["agent"] > 0 and t.trained_units["agent"] == 0
    assert history[-1]["trained_mixture"]["agent"] == 0.0
    assert history[-1]["trained_tv"] > history[-1]["tv_distance"]
    # the reward of all rollouts counts the filtered groups; the trained groups' does not
    assert all(h["rollout_reward_by_class"].get("agent") == 0.0 for h in history
               if "agent" in h["rollout_reward_by_class"])
    assert any("agent" in h["rollout_reward_by_class"] for h in history)
    assert all("agent" not in h["reward_by_class"] for h in history)
    assert books_balance(t.mixture_ledger)


def test_dynamic_sampling_gives_up_after_its_bound_and_skips_an_update_with_nothing(tmp_path, caplog):
    import logging

    # Every group has equal rewards: each step examines max_release_factor x
    # groups_per_step = 2 x 2 groups, then gives up; with no informative group it skips
    # the update: no optimizer step, no new version, no weight sync.
    w = group_pattern_worker(lambda k, u: False)
    sync, learner = FakeSync(), FakeLearner()
    cfg = tcfg(iterations=3, dynamic_sampling={"enabled": True, "max_release_factor": 2})
    t = trainer(tmp_path, cfg, sync=sync, learner=learner,
                workers={"agent": w, "rlvr": w, "rlhf": w})
    with caplog.at_level(logging.WARNING, logger="rl.trainer"):
        history = asyncio.run(t.run())
    assert [h["iteration"] for h in history] == [1, 2, 3]
    assert all(h["skipped_update"] and h["policy_version"] == 0 for h in history)
    assert learner.trained == [] and sync.versions == []
    give_ups = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dynamic sampling")]
    assert len(give_ups) == 3
    import re

    # at least the bound was examined (groups finishing together may pass it)
    assert all(int(re.search(r"0 of (\d+) groups", m).group(1)) >= 4 for m in give_ups)
    assert all("skipping the update" in m for m in give_ups)
    assert books_balance(t.mixture_ledger)


def test_dynamic_sampling_gives_up_and_trains_on_the_informative_groups_it_has(tmp_path, caplog):
    import logging

    # One group in four is informative, a step may examine 2 x 2 groups: most steps end
    # with fewer than groups_per_step informative groups and train on those.
    w = group_pattern_worker(lambda k, u: k % 4 == 0)
    learner = FakeLearner()
    cfg = tcfg(iterations=3, dynamic_sampling={"enabled": True, "max_release_factor": 2})
    t = trainer(tmp_path, cfg, learner=learner, workers={"agent": w, "rlvr": w, "rlhf": w})
    with caplog.at_level(logging.WARNING, logger="rl.trainer"):
        history = asyncio.run(t.run())
    assert [h["iteration"] for h in history] == [1, 2, 3]
    msgs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dynamic sampling")]
    assert any("training on those" in m for m in msgs)
    assert all(h["trained_units"] > 0 for h in history if not h["skipped_update"])
    assert books_balance(t.mixture_ledger)


def test_max_release_factor_below_one_is_refused(tmp_path):
    from rl.trainer import TrainerError

    with pytest.raises(TrainerError, match="max_release_factor"):
        trainer(tmp_path, tcfg(dynamic_sampling={"enabled": True, "max_release_factor": 0.5}))


def concurrency_tracking_worker():
    """A ``make_worker`` worker that also records how many units run at once (``peak``)."""
    inner, state = make_worker(), {"running": 0, "peak": 0}

    async def run(unit):
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
        try:
            await asyncio.sleep(0.001)  # let other units start beside this one
            return await inner(unit)
        finally:
            state["running"] -= 1

    return run, state


def test_a_step_larger_than_max_in_flight_trains_instead_of_stalling(tmp_path):
    # groups_per_step x group size (6 x up to 4 units) is three times max_in_flight: finished
    # groups waiting for their step must not hold the release ceiling (they did, and the
    # loop stopped with "nothing in flight and no update running").
    w, state = concurrency_tracking_worker()
    t = trainer(tmp_path, tcfg(groups_per_step=6, max_in_flight=8, iterations=3),
                workers={"agent": w, "rlvr": w, "rlhf": w})
    history = asyncio.run(t.run())
    assert len(history) == 3 and all(not h["skipped_update"] for h in history)
    assert 4 <= state["peak"] <= 8  # max_in_flight bounds units being generated at once
    assert books_balance(t.mixture_ledger)


def test_units_generated_at_once_stay_under_max_in_flight(tmp_path):
    w, state = concurrency_tracking_worker()
    t = trainer(tmp_path, tcfg(groups_per_step=3, max_in_flight=5, iterations=4),
                workers={"agent": w, "rlvr": w, "rlhf": w})
    asyncio.run(t.run())
    assert 2 <= state["peak"] <= 5


def test_max_in_flight_below_a_group_is_refused_before_the_loop(tmp_path):
    from rl.trainer import TrainerError

    # rlvr groups are 4 units (the test sampler); a group is released whole
    with pytest.raises(TrainerError, match=r"trainer.max_in_flight=3 .*trainer.group_size.rlvr=4"):
        trainer(tmp_path, tcfg(max_in_flight=3))


class BlockingLearner(FakeLearner):
    """A step that runs until ``abort_step`` (as a long learner step on CPU would), then
    raises as ``rl.learner.Learner`` does; ``started`` is set when the step began."""

    def __init__(self):
        super().__init__()
        import threading

        self.started, self.aborted = threading.Event(), threading.Event()

    def abort_step(self):
        self.aborted.set()

    def step(self, samples):
        from rl.learner import StepAborted

        self.started.set()
        if not self.aborted.wait(timeout=120):  # a test that never aborts fails, not hangs
            return super().step(samples)
        raise StepAborted("step aborted")


def test_a_stopped_run_aborts_the_running_learner_step_instead_of_waiting_for_it(tmp_path):
    """Ctrl-C or SIGTERM cancels the trainer's run; its update's learner step (in a worker
    thread the interpreter would wait for at exit) is aborted, and no step is counted."""
    learner = BlockingLearner()
    t = trainer(tmp_path, tcfg(iterations=3), learner=learner)

    async def go():
        run = asyncio.ensure_future(t.run())
        while not learner.started.is_set():
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(go())
    assert learner.aborted.is_set() and learner.version == 0 and learner.trained == []


def test_rollout_progress_is_reported_as_units_come_back(tmp_path):
    from rl.report import rollout_progress_line

    seen = []
    w = make_worker()
    t = Trainer(trainer_config(tcfg(iterations=2)), sampler=sampler(), mixture_ledger=MixtureLedger(RHO),
                learner=FakeLearner(), workers={"agent": w, "rlvr": w, "rlhf": w}, engine_urls=[],
                router_url=None, weight_sync=None, run_dir=tmp_path, on_rollout=seen.append)
    asyncio.run(t.run())
    first = [p for p in seen if p["iteration"] == 1]
    assert first and [p["units_back"] for p in first] == list(range(1, len(first) + 1))
    assert first[-1]["groups_ready"] >= 2 and all(p["groups_per_step"] == 2 for p in seen)
    assert sum(first[-1]["units_back_by_class"].values()) == first[-1]["units_back"]
    assert {p["iteration"] for p in seen} <= {1, 2}
    # units counted from the iteration's start, also those back while its update runs
    for it in (1, 2):
        backs = [p["units_back"] for p in seen if p["iteration"] == it]
        assert backs == sorted(backs)
    p = {"iteration": 1, "updating": False, "groups_ready": 3, "groups_per_step": 8, "units_back": 20,
         "units_back_by_class": {"rlvr": 10, "agent": 4}, "elapsed_s": 95.4}
    assert rollout_progress_line(p) == "rollouts for iteration 1: 3/8 groups ready, 20 units back (agent 4, rlvr 10), 95 s"
    assert rollout_progress_line(dict(p, updating=True)) == (
        "iteration 1 updating: 3/8 groups ready for the next step, 20 units back (agent 4, rlvr 10), 95 s")


def test_rollout_progress_keeps_coming_while_a_long_update_runs_with_nothing_in_flight(tmp_path):
    """The last iteration's update (or any with every unit back) may run for minutes with no
    unit in flight: progress still comes every tick, saying the update runs."""
    import time

    from rl.report import rollout_progress_line

    class SlowSync(FakeSync):  # the weights sync after the learner step counted
        def sync(self, write_weights, version):
            time.sleep(0.5)
            return super().sync(write_weights, version)

    seen = []
    w = make_worker()
    t = Trainer(trainer_config(tcfg(iterations=1)), sampler=sampler(), mixture_ledger=MixtureLedger(RHO),
                learner=SlowLearner(0.5), workers={"agent": w, "rlvr": w, "rlhf": w}, engine_urls=[],
                router_url=None, weight_sync=SlowSync(), run_dir=tmp_path, on_rollout=seen.append,
                progress_tick_s=0.05)
    asyncio.run(t.run())
    ticks = [p for p in seen if p["updating"]]
    assert len(ticks) >= 5  # 1 s of update at a 0.05 s tick, on a loaded machine too
    # the iteration being updated, also while its weights sync after its step counted; the
    # last one names no next step
    assert all(p["iteration"] == 1 and p["last"] for p in ticks)
    assert rollout_progress_line(ticks[-1]).startswith("iteration 1 updating (the last), ")
    assert [p["elapsed_s"] for p in ticks] == sorted(p["elapsed_s"] for p in ticks)
