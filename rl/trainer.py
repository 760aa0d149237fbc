"""Asynchronous GRPO over mixed rollouts: the main loop (DESIGN.md, "The job").

One ``Trainer.run`` does, until ``trainer.iterations`` optimizer steps are taken:

1. **Release**: while units being generated are below ``max_in_flight``, the sampler releases
   whole GRPO groups at the target mixture rho; each unit becomes an asyncio task on a
   rollout worker (single-turn for rlvr/rlhf, the agent server for agent units). All model
   calls go through the router with the session headers.
2. **Collect**: finished units gather by group. A group is ready when all its units are
   back. A unit whose policy version is too old (``AsyncLimits.is_fresh``) is dropped and
   counted; so is a unit whose model call or episode failed (an aborted completion
   included): never scored, logged with its reason, counted per reason.
   **Dynamic sampling** (DAPO, verl): a group whose rewards are all equal has zero
   advantage and carries no gradient; it is *filtered*: consumed (the mixture ledger
   counts it completed) but not trained on, and its place is released again, so the step
   waits for ``groups_per_step`` informative groups. The search is bounded: once
   ``dynamic_sampling.max_release_factor x groups_per_step`` groups were examined for one
   step, the trainer gives up with one logged line and trains on the informative groups it
   has, or skips the update when it has none (no new version, no weight sync).
3. **Update**: once ``groups_per_step`` groups are ready, their group-normalised
   advantages feed one learner step (in a worker thread, so generation keeps running:
   generation runs ahead of training, bounded by staleness). The policy version rises.
4. **Sync**: every ``sync_every`` steps the new weights go into the running engines
   (pause / reload / reset prefix cache / resume) and the router clears its prefix index;
   never after a skipped update (the weights did not change).
5. **Log**: one line per iteration in ``metrics.jsonl`` and wandb (offline unless the user
   logs in): iteration time and its parts, samples/min, requests/min, the engines' prefix
   hit rate and prefill/decode tok/s, consumed mixture and its TV distance to rho,
   backlog per class, router caps, reward per class (``reward_by_class``: of the groups
   trained on, which dynamic sampling keeps at mixed rewards; ``rollout_reward_by_class``:
   of every unit completed in the iteration, filtered ones included, the policy's reward
   on what it generated), loss, KL, staleness, the filtered
   share per class, the train/inference mismatch (``mismatch/*``). Two mixtures: the
   *consumed* one (every completed unit, filtered ones included) is the headline
   ``tv_distance``, because it is the contract between trainer and routing layer (MISA-T
   3.3: what the rollout side delivered against rho); the *trained* one (units that
   entered a gradient) is ``trained_tv``: it shows how dynamic sampling tilts what the
   model learns from (a class whose groups are all equal is consumed, never trained).
6. **Checkpoint** every ``checkpoint_every`` steps: model, optimizer, sampler and mixture
   ledger together, the newest ``checkpoint_keep_last`` kept; a killed run resumes there (units in flight at the checkpoint are
   recorded as dropped, never counted twice).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx
from omegaconf import DictConfig, OmegaConf

from common.cpu_time import ENGINE_ROLES, CpuMeter, engine_job_role
from rl.grpo import AsyncLimits, GRPOLossConfig, async_limits, group_advantages, loss_config
from rl.interfaces import Evaluate, Learner, Worker
from rl.mixture import MixtureLedger, tv_distance
from rl.sampler import MixtureSampler, RolloutUnit, largest_deficit
from rl.workers import UnitResult
from rollout.model import copy_model_files
from rollout.weight_sync import WeightSync
from router.signals import parse_engine_metrics

CHECKPOINT_DIR = "checkpoint"

log = logging.getLogger(__name__)

# One log line per dropped unit, with its reason and error, for the first few of each
# reason in an iteration; the rest go into one summary line at the iteration's end, so a
# dead agent server does not print a line for each of hundreds of units.
DROP_LOG_LINES_PER_REASON = 3


def _checkpoint_version(folder: Path) -> int:
    """The policy version a checkpoint folder holds (0 when its state file is unreadable)."""
    from rl.learner import STATE_FILE

    try:
        return int(json.loads((folder / STATE_FILE).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _informative(group: list[UnitResult]) -> bool:
    """True when the group's finished units can give a gradient: at least two of them,
    and not all with the same reward (equal rewards -> zero advantage for every unit)."""
    rewards = [r.reward for r in group if r.ok]
    return len(rewards) >= 2 and max(rewards) != min(rewards)


class TrainerError(RuntimeError):
    """The training loop cannot go on; the message says why and what to do."""


def _whole(value: Any, key: str, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise TrainerError(f"trainer.{key}={value!r}: give a whole number >= {least}")


@dataclass(frozen=True)
class TrainerConfig:
    """The loop's settings, read once from the ``trainer`` config group (``trainer_config``).

    Attributes:
        iterations: iterations to run (optimizer steps plus skipped updates), >= 1.
        groups_per_step: GRPO groups in one learner step, >= 1.
        limits: max in-flight units and max staleness (DESIGN.md step 2).
        loss: the GRPO loss options (the loop reads ``scale_adv_by_std`` for the advantages).
        sync_every: push the weights into the engines every k steps, >= 1.
        checkpoint_every: checkpoint every k steps (0: only at the end).
        checkpoint_keep_last: how many ``checkpoint-v<version>`` folders are kept, >= 1.
        eval_every: evaluate every k steps and at step 0 (0: never).
        dynamic_sampling: filter groups whose rewards are all equal (DAPO) and release others.
        max_release_factor: the filter examines at most this many times ``groups_per_step``
            groups for one step, >= 1, then trains on what it has.

    Raises:
        TrainerError: a value out of range; the message names the ``trainer.`` key.
    """

    iterations: int
    groups_per_step: int
    limits: AsyncLimits
    loss: GRPOLossConfig
    sync_every: int
    checkpoint_every: int
    checkpoint_keep_last: int = 1
    eval_every: int = 0
    dynamic_sampling: bool = False
    max_release_factor: float = 4.0

    def __post_init__(self) -> None:
        for key in ("iterations", "groups_per_step", "sync_every", "checkpoint_keep_last"):
            _whole(getattr(self, key), key, 1)
        for key in ("checkpoint_every", "eval_every"):
            _whole(getattr(self, key), key, 0)
        factor = self.max_release_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
            raise TrainerError(f"trainer.dynamic_sampling.max_release_factor={factor!r}: give a "
                               "number >= 1 (groups one step may examine, in groups_per_step)")


def check_group_fits(max_in_flight: int, group_sizes: Mapping[str, int], rho: Mapping[str, float]) -> None:
    """A GRPO group is released whole, so ``max_in_flight`` must hold the largest group of
    every class the mixture draws from (weight > 0 in ``rho``); else that class could never
    be released and the loop would stall.

    Raises:
        TrainerError: naming ``trainer.max_in_flight`` and the group size it is below.
    """
    drawn = {b: int(g) for b, g in group_sizes.items() if float(rho.get(b, 0) or 0) > 0}
    if not drawn:
        return
    b = max(drawn, key=drawn.get)
    if drawn[b] > max_in_flight:
        raise TrainerError(f"trainer.max_in_flight={max_in_flight} is below trainer.group_size.{b}="
                           f"{drawn[b]}: a group is released whole; raise trainer.max_in_flight to "
                           f"at least {drawn[b]} or lower the group size")


def trainer_config(tcfg: DictConfig | Mapping[str, Any]) -> TrainerConfig:
    """``TrainerConfig`` from the ``trainer`` group (its other sections, such as the
    learner's, the domains or the weight sync, are read by their own parts).

    Raises:
        TrainerError: a key missing or a value out of range; GRPOError: a bad ``loss`` or limit.
    """
    plain = OmegaConf.to_container(tcfg, resolve=True) if isinstance(tcfg, DictConfig) else dict(tcfg)
    missing = [k for k in ("iterations", "groups_per_step", "max_in_flight", "max_staleness", "loss",
                           "sync_every", "checkpoint_every") if k not in plain]
    if missing:
        raise TrainerError(f"trainer: missing {', '.join(missing)}; give them (recipes/trainer/grpo.yaml)")
    ds = plain.get("dynamic_sampling") or {}
    return TrainerConfig(
        iterations=plain["iterations"], groups_per_step=plain["groups_per_step"],
        limits=async_limits(plain), loss=loss_config(plain["loss"]),
        sync_every=plain["sync_every"], checkpoint_every=plain["checkpoint_every"],
        checkpoint_keep_last=plain.get("checkpoint_keep_last", 1),
        eval_every=plain.get("eval_every", 0) or 0,
        dynamic_sampling=bool(ds.get("enabled", False)),
        max_release_factor=ds.get("max_release_factor", 4.0))


@dataclass
class IterationStats:
    """What one iteration's metrics are computed from (reset after each step)."""

    started_s: float
    wait_s: float = 0.0
    units: list[UnitResult] = field(default_factory=list)
    dropped_stale: int = 0
    dropped_failed: int = 0
    dropped_by_reason: Counter = field(default_factory=Counter)
    zero_advantage: int = 0
    groups_by_class: Counter = field(default_factory=Counter)
    filtered_by_class: Counter = field(default_factory=Counter)
    filtered_units: int = 0

    def record_failed(self, res: UnitResult) -> None:
        """Count a failed unit under its reason; log it (the first few of each reason)."""
        reason = res.drop_reason or "failed"
        self.dropped_failed += 1
        self.dropped_by_reason[reason] += 1
        if self.dropped_by_reason[reason] <= DROP_LOG_LINES_PER_REASON:
            log.warning("dropped unit %s (%s, %s): %s", res.unit.unit_id,
                        res.unit.workload_class, reason, res.error or "no error text")

    def log_unlogged_drops(self) -> None:
        """One line for the failed units beyond the first few of each reason."""
        more = {r: n - DROP_LOG_LINES_PER_REASON for r, n in self.dropped_by_reason.items()
                if n > DROP_LOG_LINES_PER_REASON}
        if more:
            log.warning("dropped %d more unit(s) this iteration: %s", sum(more.values()),
                        ", ".join(f"{r} {n}" for r, n in sorted(more.items())))


@dataclass
class EngineCounters:
    """Summed engine counters at one moment (tokens; from each engine's /metrics)."""

    at_s: float
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0

    @classmethod
    def scrape(cls, urls: list[str]) -> "EngineCounters":
        c = cls(time.monotonic())
        for url in urls:
            try:
                m = parse_engine_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
            except (httpx.HTTPError, ValueError):
                continue  # a missing sample only makes this iteration's figures partial
            c.prefix_queries += m.prefix_cache_queries_total
            c.prefix_hits += m.prefix_cache_hits_total
            c.prompt_tokens += m.prompt_tokens_total
            c.generation_tokens += m.generation_tokens_total
        return c

    def rates(self, before: "EngineCounters") -> dict[str, float | None]:
        """Prefix hit rate, effective prefill tok/s (hits included) and decode tok/s since ``before``."""
        dt = max(self.at_s - before.at_s, 1e-9)
        q = self.prefix_queries - before.prefix_queries
        return {"prefix_hit_rate": (self.prefix_hits - before.prefix_hits) / q if q > 0 else None,
                "prefill_tok_s": (self.prompt_tokens - before.prompt_tokens) / dt,
                "decode_tok_s": (self.generation_tokens - before.generation_tokens) / dt}


def update_cores(cores: Mapping[str, float]) -> dict[str, float]:
    """Cores each role of the job used during a learner step (a :class:`CpuMeter` reading with
    :func:`common.cpu_time.engine_job_role`), with ``engines``: the sum over the engines' roles
    (model workers, engine cores, API servers). ``job`` is this process (the learner's step and
    the rollout client); ``other`` the rest of its process tree (agent and reward servers,
    sandboxes). Processes outside the tree (remote engines, other torchrun ranks) are not in it.

    On shared CPU cores (the CPU recipe) the learner's step runs beside the next iteration's
    rollouts: ``engines`` over ``job`` says how much of the machine went to them meanwhile."""
    out = {role: round(v, 3) for role, v in cores.items()}
    out["engines"] = round(sum(v for role, v in cores.items() if role in ENGINE_ROLES), 3)
    return out


def _mean_reward_by_class(results: list[UnitResult]) -> dict[str, float]:
    """Mean reward per workload class over ``results`` (completed units)."""
    by_class: dict[str, list[float]] = defaultdict(list)
    for r in results:
        if r.reward is not None:
            by_class[r.unit.workload_class].append(float(r.reward))
    return {b: sum(v) / len(v) for b, v in sorted(by_class.items())}


class Trainer:
    """The asynchronous GRPO loop over one running serving stack.

    Args:
        config: the loop's settings (``trainer_config``).
        sampler, mixture_ledger: mixture sampler and mixture ledger (restored on resume;
            saved under the checkpoint key "ledger").
        learner: the policy update (its ``version`` is the policy version).
        workers: workload class -> rollout worker (``async run(unit) -> UnitResult``).
        engine_urls: engines whose counters are scraped for the serving figures.
        router_url: the router (its ``/state`` holds caps; None for the vLLM Router).
        weight_sync: pushes the learner's weights into the engines, or None to skip syncing.
        run_dir: the run folder (metrics.jsonl, checkpoint/).
        log: callback taking one iteration's metrics dict (wandb, progress bar).
        evaluate: optional evaluation run every ``eval_every`` steps through the same stack
            (pass@k), merged into the metrics.
        on_rollout: callback taking the rollout progress towards the next step (a dict:
            ``iteration`` = the step being collected for, ``groups_ready`` of
            ``groups_per_step``, ``units_back`` = units finished in this iteration so far,
            by class in ``units_back_by_class``, ``elapsed_s`` since the iteration began,
            called whenever a unit comes back, and every ``progress_tick_s`` seconds while
            none does (an update of minutes with nothing in flight), with ``updating`` True
            while the iteration's update runs (``iteration`` is then the one updating, and the
            groups ready are for the next step; ``last``: the run has no next step); minutes
            pass between two updates, and this is what a user watching the job sees meanwhile.
        progress_tick_s: see ``on_rollout`` (seconds; the caller rate-limits its lines).
    """

    def __init__(self, config: TrainerConfig, *, sampler: MixtureSampler, mixture_ledger: MixtureLedger,
                 learner: Learner, workers: dict[str, Worker], engine_urls: list[str],
                 router_url: str | None, weight_sync: WeightSync | None, run_dir: Path,
                 log: Callable[[dict], None] = lambda m: None, evaluate: Evaluate | None = None,
                 model_source: str | Path | None = None, on_rollout: Callable[[dict], None] | None = None,
                 progress_tick_s: float = 10.0):
        check_group_fits(config.limits.max_in_flight,
                         {b: spec.group_size for b, spec in sampler.classes.items()}, sampler.rho)
        self.config = config
        self.sampler = sampler
        self.mixture_ledger = mixture_ledger
        self.learner = learner
        self.workers = workers
        self.engine_urls = engine_urls
        self.router_url = router_url
        self.weight_sync = weight_sync
        self.run_dir = Path(run_dir)
        self.log = log
        self.evaluate = evaluate
        self.model_source = model_source
        self.on_rollout = on_rollout
        self.progress_tick_s = progress_tick_s
        self._updating_iteration = 0  # the iteration whose update runs (its step counts when the step ends)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.history: list[dict] = []
        self.started_at_s = time.monotonic()
        self.totals = {"units": 0, "requests": 0, "skipped_steps": 0}
        self.trained_units: Counter = Counter()  # units that entered a gradient, per class
        self.outstanding_groups = 0  # released groups not yet trained on or dropped
        self.filtered_for_step = 0  # groups filtered since the last batch was picked

    @property
    def iterations_done(self) -> int:
        """Iterations finished: optimizer steps plus skipped updates."""
        return self.learner.version + int(self.totals.get("skipped_steps", 0))

    # ------------------------------------------------------------------ loop

    async def run(self) -> list[dict]:
        """Train until ``iterations`` policy versions; returns every iteration's metrics."""
        in_flight: dict[asyncio.Task, RolloutUnit] = {}
        groups: dict[str, list[UnitResult]] = defaultdict(list)
        ready: list[list[UnitResult]] = []
        it = IterationStats(time.monotonic())
        counters = await asyncio.to_thread(EngineCounters.scrape, self.engine_urls)
        update: asyncio.Task | None = None
        try:
            while self.iterations_done < self.config.iterations or update is not None:
                if self.iterations_done + (update is not None) < self.config.iterations:
                    self._release(in_flight, updating=update is not None)
                waits = set(in_flight) | ({update} if update else set())
                if not waits:  # cannot happen while check_group_fits holds (see _release)
                    raise TrainerError("nothing in flight and no update running, with "
                                       f"{self.outstanding_groups} group(s) outstanding: a bug in "
                                       "the release rules; please report it with this run's config")
                t0 = time.monotonic()
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED,
                                             timeout=self.progress_tick_s if self.on_rollout else None)
                if update is None:
                    it.wait_s += time.monotonic() - t0
                if not done:  # nothing came back for a tick: say the job is alive (and where)
                    if self.on_rollout is not None:
                        self.on_rollout(self._rollout_progress(ready, it, updating=update is not None))
                    continue
                for task in done:
                    if task is update:
                        update = None
                        counters = await self._finish_iteration(task.result(), it, counters)
                        it = IterationStats(time.monotonic())
                        continue
                    unit = in_flight.pop(task)
                    self._collect(task.result(), unit, groups, ready, it)
                    if self.on_rollout is not None:
                        self.on_rollout(self._rollout_progress(ready, it, updating=update is not None))
                # Start the next update as soon as enough fresh groups are ready (or the
                # dynamic-sampling search for them gave up).
                ready = [g for g in ready if self._fresh_group(g, it)]
                if update is None and self.iterations_done < self.config.iterations and (
                        len(ready) >= self.config.groups_per_step or self._give_up(ready)):
                    batch, ready = self._pick_batch(ready)
                    self.filtered_for_step = 0
                    self._updating_iteration = self.iterations_done + 1
                    update = asyncio.ensure_future(self._update(batch, it))
        finally:
            # Stopping (an error, Ctrl-C, SIGTERM): the rollouts and a running update are
            # cancelled and waited for; the update's learner step is aborted (_update).
            pending = [*in_flight, *([update] if update is not None else [])]
            for task in pending:
                task.cancel()
            if pending:
                outcomes = await asyncio.gather(*pending, return_exceptions=True)
                if update is not None and isinstance(outcomes[-1], Exception):
                    # the run is already ending with another error: keep this one in the log
                    log.error("the update running when the loop stopped failed too: %s", outcomes[-1])
        return self.history

    def _rollout_progress(self, ready: list[list[UnitResult]], it: IterationStats, updating: bool) -> dict:
        """What ``on_rollout`` receives (see the class docstring); ``updating``: the
        iteration's update runs (``iteration`` is that one, also once its learner step counted
        and its weights are syncing), and the groups ready are for the step after it, if any
        (``last``: it is the run's last iteration)."""
        by_class = Counter(r.unit.workload_class for r in it.units)
        iteration = self._updating_iteration if updating else self.iterations_done + 1
        return {"iteration": iteration, "updating": updating,
                "last": iteration >= self.config.iterations, "groups_ready": len(ready),
                "groups_per_step": self.config.groups_per_step, "units_back": len(it.units),
                "units_back_by_class": dict(sorted(by_class.items())),
                "elapsed_s": time.monotonic() - it.started_s}

    def _pick_batch(self, ready: list[list[UnitResult]]) -> tuple[list[list[UnitResult]], list[list[UnitResult]]]:
        """The next step's groups: by largest consumption deficit against rho, not by which
        finished first (fast classes would otherwise crowd out slow ones: the mixture contract
        is on consumed units, MISA-T section 3.3). Returns (batch, the rest, in order)."""
        consumed = dict(self.mixture_ledger.completed_units)
        rest, batch = list(ready), []
        for _ in range(min(self.config.groups_per_step, len(rest))):
            ready_classes = {g[0].unit.workload_class for g in rest}
            target = {b: w for b, w in self.mixture_ledger.rho.items() if b in ready_classes}
            b = largest_deficit(target, consumed)
            g = next(g for g in rest if g[0].unit.workload_class == b)
            rest.remove(g)
            batch.append(g)
            consumed[b] = consumed.get(b, 0) + len(g)
        return batch, rest

    def _release(self, in_flight: dict[asyncio.Task, RolloutUnit], updating: bool) -> None:
        # Two limits (DESIGN.md step 2). Concurrency: at most max_in_flight units are being
        # generated at once (released, not yet back from their worker). Units that finished
        # and wait in a group for the next step do not count: they hold no engine capacity,
        # and counting them stalled any run whose step (groups_per_step x G) is larger than
        # max_in_flight. Run-ahead: no more groups are out than the next max_staleness + 1
        # steps can train on: a group released beyond that would only go stale and be
        # dropped. A group released now is stamped with the current version v; the k-th
        # group queued behind the outstanding ones is trained at version
        # v + updating + k // G_step, which must stay <= v + max_staleness.
        # With nothing generating and no update running, free = max_in_flight >= every
        # group (check_group_fits) and fewer than groups_per_step groups are outstanding
        # (else an update would have started), so a group is always released.
        free = self.config.limits.free_slots(len(in_flight))
        steps_ahead = self.config.limits.max_staleness + 1 - int(updating)
        group_budget = steps_ahead * self.config.groups_per_step - self.outstanding_groups
        while group_budget > 0:
            next_class = largest_deficit(self.sampler.rho, self.sampler.released_units)
            if self.sampler.classes[next_class].group_size > free:
                break
            units = self.sampler.next_group(self.learner.version)
            free -= len(units)
            group_budget -= 1
            self.outstanding_groups += 1
            for unit in units:
                if unit.workload_class not in self.workers:
                    raise TrainerError(
                        f"no rollout worker for workload class {unit.workload_class!r}; set its "
                        f"rho weight to 0 or configure one ({sorted(self.workers)})")
                self.mixture_ledger.record_released(unit.unit_id, unit.workload_class)
                in_flight[asyncio.ensure_future(self.workers[unit.workload_class](unit))] = unit

    def _collect(self, res: UnitResult, unit: RolloutUnit, groups, ready, it: IterationStats) -> None:
        self.totals["requests"] += res.num_requests
        it.units.append(res)
        g = groups[unit.group_id]
        g.append(res)
        if len(g) == unit.group_size:
            group = groups.pop(unit.group_id)
            it.groups_by_class[unit.workload_class] += 1
            if self.config.dynamic_sampling and not _informative(group):
                self._filter(group, it)
            else:
                ready.append(group)

    def _filter(self, group: list[UnitResult], it: IterationStats) -> None:
        """Consume a group without signal (rewards all equal, or fewer than two units
        back): its finished units count as completed, its failed ones as dropped, nothing
        is trained, and its place in the release budget is freed for another group."""
        for r in group:
            if r.ok:
                self.mixture_ledger.record_completed(r.unit.unit_id)
                it.filtered_units += 1
            else:
                self.mixture_ledger.record_dropped(r.unit.unit_id)
                it.record_failed(r)
        it.filtered_by_class[group[0].unit.workload_class] += 1
        self.outstanding_groups -= 1
        self.filtered_for_step += 1

    def _give_up(self, ready: list[list[UnitResult]]) -> bool:
        """True (after one log line) when dynamic sampling has examined
        ``max_release_factor x groups_per_step`` groups for this step without finding
        ``groups_per_step`` informative ones: the step then trains on those it has, or
        is skipped when there are none."""
        if not self.config.dynamic_sampling:
            return False
        examined = self.filtered_for_step + len(ready)
        if examined < self.config.max_release_factor * self.config.groups_per_step:
            return False
        log.warning("dynamic sampling: %d of %d groups examined for step %d carry signal "
                    "(the other %d had equal rewards; limit trainer.dynamic_sampling."
                    "max_release_factor=%g x groups_per_step=%d): %s", len(ready), examined,
                    self.learner.version + 1, self.filtered_for_step, self.config.max_release_factor,
                    self.config.groups_per_step, "training on those" if ready else
                    "skipping the update (no new version, no weight sync)")
        return True

    def _fresh_group(self, group: list[UnitResult], it: IterationStats) -> bool:
        """Drop a group whose units are too stale (MISA-T 3.1 staleness bound), counting them."""
        if all(self.config.limits.is_fresh(r.unit.policy_version, self.learner.version) for r in group):
            return True
        for r in group:
            self.mixture_ledger.record_dropped(r.unit.unit_id)
            it.dropped_stale += 1
        self.outstanding_groups -= 1
        return False

    async def _update(self, batch: list[list[UnitResult]], it: IterationStats) -> dict:
        """Advantages, one learner step, weight sync; returns the step's figures."""
        samples, used = [], []
        groups_by_class: Counter = Counter()
        t0 = time.monotonic()
        self.outstanding_groups -= len(batch)
        for group in batch:
            ok = [r for r in group if r.ok]
            for r in group:
                if not r.ok:
                    self.mixture_ledger.record_dropped(r.unit.unit_id)
                    it.record_failed(r)
            if len(ok) < 2:
                for r in ok:  # one unit carries no group signal: counted as consumed
                    self.mixture_ledger.record_completed(r.unit.unit_id)
                continue
            adv = group_advantages([r.reward for r in ok], [r.unit.group_id for r in ok],
                                   scale_by_std=self.config.loss.scale_adv_by_std)
            trained_before = len(used)
            for r, a in zip(ok, adv.tolist()):
                self.mixture_ledger.record_completed(r.unit.unit_id)
                if a == 0.0:
                    # All rewards of the group equal: no gradient signal, so no forward
                    # and backward pass is spent on it (it still counts as consumed).
                    it.zero_advantage += 1
                    continue
                samples.append(r.train_sample(a))
                used.append(r)
                self.trained_units[r.unit.workload_class] += 1
            if len(used) > trained_before:
                groups_by_class[group[0].unit.workload_class] += 1
        staleness = [self.learner.version - r.unit.policy_version for g in batch for r in g if r.ok]
        step: dict[str, Any] = {}
        cpu: dict[str, float] = {}
        if samples:
            meter = await asyncio.to_thread(CpuMeter, os.getpid(), engine_job_role)
            try:
                step = await asyncio.to_thread(self.learner.step, samples)
            except asyncio.CancelledError:
                # The job is stopping (Ctrl-C, SIGTERM): the thread would otherwise run the
                # step to its end, and the interpreter waits for it at exit.
                self.learner.abort_step()
                raise
            cpu = update_cores(await asyncio.to_thread(meter.cores))
        else:
            # Nothing to learn from: no optimizer step, so no new policy version and no
            # weight sync; the iteration still counts (the loop must end).
            self.totals["skipped_steps"] = int(self.totals.get("skipped_steps", 0)) + 1
        update_s = time.monotonic() - t0
        sync: dict[str, float] = {}
        if self.weight_sync is not None and samples and self.learner.version % self.config.sync_every == 0:
            report = await asyncio.to_thread(self.weight_sync.sync, self.learner, self.learner.version)
            sync = report.as_metrics()
            # a sharded learner's gather: time, buckets, peak memory per rank
            sync.update({f"gather/{k}": v for k, v in getattr(self.learner, "last_sync_stats", {}).items()})
        return {"update_s": update_s, "step": step, "sync": sync, "cpu": cpu, "updated": bool(samples),
                "trained_units": len(used), "groups": len(batch),
                "trained_units_by_class": dict(Counter(r.unit.workload_class for r in used)),
                "trained_groups_by_class": dict(groups_by_class),
                "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
                "reward_by_class": _mean_reward_by_class([r for g in batch for r in g if r.ok])}

    async def _finish_iteration(self, upd: dict, it: IterationStats,
                                before: EngineCounters) -> EngineCounters:
        now = await asyncio.to_thread(EngineCounters.scrape, self.engine_urls)
        iter_s = time.monotonic() - it.started_s
        it.log_unlogged_drops()
        finished = [r for r in it.units if r.ok]
        self.totals["units"] += len(finished)
        state = await asyncio.to_thread(self._router_state)
        snap = self.mixture_ledger.snapshot()
        trained = dict(self.trained_units)
        trained_mix = {b: trained.get(b, 0) / max(sum(trained.values()), 1) for b in self.mixture_ledger.rho}
        m = {
            "iteration": self.iterations_done,
            "policy_version": self.learner.version,
            "skipped_update": not upd["updated"],
            "time_s": round(time.monotonic() - self.started_at_s, 2),
            "iteration_s": iter_s,
            "generation_wait_s": it.wait_s,
            "update_s": upd["update_s"],
            "sync_s": upd["sync"].get("weight_sync/total_s", 0.0),
            "samples_per_min": len(finished) / iter_s * 60,
            "requests_per_min": sum(r.num_requests for r in it.units) / iter_s * 60,
            **now.rates(before),
            "consumed_mixture": snap.get("consumed_mixture"),
            "tv_distance": snap.get("consumed_tv"),
            "trained_mixture": trained_mix,
            "trained_tv": tv_distance(trained_mix, self.mixture_ledger.rho) if trained else None,
            "backlog": snap.get("backlog"),
            "released": snap.get("released"),
            "completed": snap.get("completed"),
            "dropped": snap.get("dropped"),
            "dropped_stale": it.dropped_stale,
            "dropped_failed": it.dropped_failed,
            "dropped_by_reason": dict(it.dropped_by_reason),
            "zero_advantage_units": it.zero_advantage,
            "filtered_groups": sum(it.filtered_by_class.values()),
            "filtered_units": it.filtered_units,
            **{f"filtered_share/{b}": it.filtered_by_class[b] / n
               for b, n in sorted(it.groups_by_class.items())},
            "reward_by_class": upd["reward_by_class"],
            "rollout_reward_by_class": _mean_reward_by_class(finished),
            "trained_units": upd["trained_units"],
            "trained_units_by_class": upd["trained_units_by_class"],
            "trained_groups_by_class": upd["trained_groups_by_class"],
            "staleness_mean": upd["staleness_mean"],
            "router_caps": ((state or {}).get("policy") or {}).get("caps"),
            **{(k if "/" in k else f"loss/{k}"): v for k, v in upd["step"].items()},
            **{f"sync/{k}": v for k, v in upd["sync"].items()},
            **{f"cpu_update/{k}": v for k, v in upd["cpu"].items()},
        }
        if upd["updated"] and self.evaluate is not None and self.config.eval_every \
                and self.learner.version % self.config.eval_every == 0:
            m.update(await self._evaluate())
        self._record(m)
        every = self.config.checkpoint_every
        if upd["updated"] and every and self.learner.version % every == 0:
            await asyncio.to_thread(self.save_checkpoint)
        return now

    async def _evaluate(self) -> dict:
        t_eval = time.monotonic()
        out = dict(await self.evaluate(self.learner.version))
        out["eval_s"] = time.monotonic() - t_eval
        return out

    def _record(self, m: dict) -> None:
        self.history.append(m)
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(m, default=float) + "\n")
        self.log(m)

    async def evaluate_baseline(self) -> dict | None:
        """Evaluate the starting weights (step 0) when ``eval_every`` is on and nothing was
        trained yet; the line (``iteration`` 0, ``baseline`` true) goes into the history,
        metrics.jsonl and the log callback, so learning curves start at step 0."""
        if self.evaluate is None or not self.config.eval_every or self.iterations_done > 0:
            return None
        m = {"iteration": 0, "policy_version": 0, "baseline": True,
             "time_s": round(time.monotonic() - self.started_at_s, 2), **await self._evaluate()}
        self._record(m)
        return m

    def _router_state(self) -> dict | None:
        if not self.router_url:
            return None
        try:
            r = httpx.get(f"{self.router_url}/state", timeout=5)
            return r.json() if r.is_success else None
        except (httpx.HTTPError, ValueError):
            return None

    # ------------------------------------------------------------------ checkpoint

    def save_checkpoint(self) -> Path:
        """Model, optimizer, sampler, mixture ledger and history in
        ``run_dir/checkpoint-v<version>``; then ``run_dir/checkpoint`` (a link, replaced
        atomically) names it, and only the newest ``checkpoint_keep_last`` of them are kept:
        older ones are removed once the new one is complete, so a run killed at any moment
        still has a whole checkpoint to resume from.

        With ``model_source`` (the model the learner started from) the checkpoint is also a
        Hugging Face model folder: its config and tokenizer files are copied in
        (``rollout.model.copy_model_files``), and a backend whose checkpoint holds no
        safetensors weights (DeepSpeed, the sharded learner's DCP shards) also writes them
        (``save_weights``), so ``rl.eval model.path=runs/<run>/checkpoint`` and a next run's
        ``model.path`` load it."""
        folder = self.run_dir / f"{CHECKPOINT_DIR}-v{self.learner.version}"
        self.learner.save_checkpoint(folder, extra={
            "sampler": self.sampler.state_dict(), "ledger": self.mixture_ledger.state_dict(),
            "history": self.history, "totals": self.totals,
            "trained_units": dict(self.trained_units)})
        if self.model_source is not None:
            if not any((folder / n).exists() for n in ("model.safetensors", "model.safetensors.index.json")):
                self.learner.save_weights(folder)
            copy_model_files(self.model_source, folder)
        latest = self.run_dir / CHECKPOINT_DIR
        if latest.is_dir() and not latest.is_symlink():  # the single-folder layout of older runs
            latest.rename(self.run_dir / f"{CHECKPOINT_DIR}-v{_checkpoint_version(latest)}")
        link = self.run_dir / f".{CHECKPOINT_DIR}.link"
        link.unlink(missing_ok=True)
        link.symlink_to(folder.name)
        os.replace(link, latest)
        for old in self._checkpoints()[:-self.config.checkpoint_keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return folder

    def _checkpoints(self) -> list[Path]:
        """The ``checkpoint-v<version>`` folders of ``run_dir``, oldest first."""
        found = []
        for p in self.run_dir.glob(f"{CHECKPOINT_DIR}-v*"):
            suffix = p.name.removeprefix(f"{CHECKPOINT_DIR}-v")
            if suffix.isdigit() and p.is_dir() and not p.is_symlink():
                found.append((int(suffix), p))
        return [p for _, p in sorted(found)]

    def resume(self) -> bool:
        """Restore the last checkpoint of ``run_dir`` if there is one; True if resumed.

        Units that were in flight when the checkpoint was written are recorded as dropped:
        the sampler continues after them and none is counted twice.
        """
        folder = self.run_dir / CHECKPOINT_DIR
        if not folder.exists():
            return False
        extra = self.learner.load_checkpoint(folder)
        self.sampler.load_state_dict(extra["sampler"])
        self.mixture_ledger.load_state_dict(extra["ledger"])
        for unit_id in list(self.mixture_ledger.state_dict()["in_flight"]):
            self.mixture_ledger.record_dropped(unit_id)
        self.history = list(extra.get("history", []))
        self.totals = {**self.totals, **dict(extra.get("totals", {}))}
        self.trained_units = Counter(extra.get("trained_units", {}))
        return True
