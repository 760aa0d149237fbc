"""``python -m rl.train recipe=mixed_step router=misa-t``: the main job.

Brings up the serving stack of the config (packaged model, real vLLM engines, the chosen
router) and the agent server, then runs asynchronous GRPO over mixed rollouts
(``rl/trainer.py``): rlvr (math, code), rlhf (instructions scored by a reward model or the
zero-shot judge) and agent units (SWE-style tasks in the sandbox), released at the target
mixture. Every process it starts logs to the run folder and is stopped at the end, on
Ctrl-C or on SIGTERM. A run folder that holds a checkpoint resumes from it
(``run_dir=runs/<that run>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from common.config import (EXIT_FAILURE, SEED_RULE, ConfigError, check_values, hydra_entry, number,
                           register_user_error)
from common.console import output_console
from rl.report import (eval_scores_text, plot_run, progress_line, rlvr_settings_table, rollout_progress_line,
                       summary_table)
from rollout.serve import ServingStack, stop_on_sigterm

REPO_ROOT = Path(__file__).resolve().parent.parent


def _register_errors() -> None:
    from agents.client import AgentClientError
    from rl.data.base import DataError
    from rl.distributed import RankError, RankFailure
    from rl.grpo import GRPOError
    from rl.learner import LearnerError
    from rl.mixture import MixtureError
    from rl.rewards import RewardError
    from rl.trainer import TrainerError
    from rollout.weight_sync import WeightSyncError
    from sandbox import SandboxError

    for e in (DataError, GRPOError, MixtureError, RankError):  # a bad value in the config: exit 2
        register_user_error(e)
    for e in (AgentClientError, LearnerError, RankFailure, RewardError, TrainerError, WeightSyncError,
              SandboxError):
        register_user_error(e, exit_code=EXIT_FAILURE)  # at run time: exit 1


@contextlib.contextmanager
def reward_server(cfg: DictConfig, run_dir: Path, model_path: str):
    """Start ``python -m rl.reward_server`` with the recipe's rlhf scorer; yield its URL."""
    import httpx

    from common.process import ManagedProcess, free_port

    port = free_port()
    rcfg = cfg.trainer.rewards
    argv = [sys.executable, "-m", "rl.reward_server", f"run_dir={run_dir / 'reward_server'}",
            f"trainer.rewards.server.port={port}", f"trainer.rewards.rlhf_scorer={rcfg.rlhf_scorer}",
            f"model.path={model_path}", f"trainer.rewards.device={rcfg.device}"]
    if rcfg.reward_model_path:
        argv.append(f"trainer.rewards.reward_model_path={rcfg.reward_model_path}")
    proc = ManagedProcess("reward-server", argv, run_dir / "logs" / "reward_server.log",
                          health_url=f"http://127.0.0.1:{port}/health", cwd=REPO_ROOT)
    proc.start()
    try:
        proc.wait_healthy(300, poll_s=1.0)
        yield httpx.URL(f"http://127.0.0.1:{port}")
    finally:
        proc.stop(grace_s=5)


def repo_path(p: str | os.PathLike) -> Path:
    """A recipe path: absolute as given, relative ones from the repository root."""
    path = Path(str(p)).expanduser()
    return path if path.is_absolute() else (REPO_ROOT / path).resolve()


def agent_task_sets_override(task_sets) -> str:
    """The agent server's ``extra_tasks_paths=[...]`` override for ``agents.task_sets``:
    built-in set names kept, task files made absolute from the repository root.

    Raises:
        ConfigError: an entry is neither a built-in set nor an existing file.
    """
    from agents.server import BUILTIN_TASK_SETS

    entries = []
    for spec in task_sets:
        if str(spec) in BUILTIN_TASK_SETS:
            entries.append(str(spec))
        elif repo_path(spec).is_file():
            entries.append(str(repo_path(spec)))
        else:
            raise ConfigError(f"agents.task_sets: {spec!r} is neither a built-in task set "
                              f"({', '.join(BUILTIN_TASK_SETS)}) nor a task file")
    return f"extra_tasks_paths=[{','.join(entries)}]"


def check_tasks_path(tasks_path) -> None:
    """Refuse an ``agents.tasks_path`` the agent server could not load, before anything
    starts: it must be null, a built-in set name or a task file (JSONL, read from the
    repository root when relative) that ``agents.envs.task.load_tasks`` reads and that holds
    at least one task.

    Raises:
        ConfigError: the message says how to build a task file.
    """
    from agents.envs.task import TaskError, load_tasks
    from agents.server import BUILTIN_TASK_SETS

    if tasks_path is None or str(tasks_path) in BUILTIN_TASK_SETS:
        return
    path = repo_path(tasks_path)
    given = f"agents.tasks_path={tasks_path}"
    build = ("Build tasks with `python -m agents.envs.build` (it writes ~/.cache/misa-rl/tasks/tasks.jsonl) "
             "and give that file, or set agents.tasks_path=null and train on agents.task_sets "
             f"(built-in sets: {', '.join(BUILTIN_TASK_SETS)}).")
    if not path.is_file():
        what = "is a folder, not a task file" if path.is_dir() else "does not exist"
        raise ConfigError(f"{given}: {path} {what}. {build}")
    try:
        tasks = load_tasks(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{given}: cannot read {path} ({e}). {build}") from None
    except TaskError as e:  # a line that is not JSON or not a task object, a field missing
        raise ConfigError(f"{given}: {path} is not a task file: {e} {build}") from None
    if not tasks:
        raise ConfigError(f"{given}: {path} holds no tasks. {build}")


def iteration_progress(console: Console):
    """The training bar: iterations done, elapsed time, and as its description the last
    iteration's line with the next step's rollouts beside it in brackets, shown as typed
    (not read as rich markup, which took ``[rollouts ...]`` for a style tag and showed
    nothing). Off where ``console`` is not a terminal. Returns a ``rich.progress.Progress``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}", markup=False), console=console,
                    disable=not console.is_terminal)


async def train(cfg: DictConfig, stack: ServingStack, agent_url: str | None, reward_cfg: dict,
                run_dir: Path, console: Console, group=None) -> list[dict]:
    """Build the trainer's parts around a running stack and train; returns the metrics.
    ``group``: the learner's ranks (``rl.distributed.RankGroup``) when it is sharded."""
    import httpx
    import wandb
    from transformers import AutoTokenizer

    from agents.client import AgentServerClient
    from rollout.client import ModelClient
    from rl.data.agent_tasks import AgentTaskSource
    from rl.learner import learner_config
    from rl.learner_launch import make_learner
    from rl.mixture import MixtureLedger
    from rl.reward_pool import RewardPool
    from rl.sampler import sampler_from_config
    from rl.trainer import Trainer, trainer_config
    from rollout.weight_sync import job_shm_dir, make_weight_sync, remove_stale_shm_dirs, weight_sync_config
    from rl.workers import AgentWorker, SingleTurnWorker

    tcfg = cfg.trainer
    ours = cfg.router.get("impl", "ours") != "vllm"
    name = stack.served_model_name
    tokenizer = AutoTokenizer.from_pretrained(stack.model_path)

    # The data path, in order. Sampler (rl/sampler.py): prompts from the domains, released
    # as rollout units at the target mixture rho; the mixture ledger (rl/mixture.py) counts them.
    agent_client = (AgentServerClient(agent_url, timeout_s=float(tcfg.agent_timeout_s))
                    if agent_url else None)
    extra = {}
    if agent_client is not None:
        extra["agent"] = {"swe": (AgentTaskSource(await agent_client.tasks()), 1.0)}
    sampler = sampler_from_config(tcfg, int(cfg.seed), run_id=run_dir.name, extra_sources=extra)
    mixture_ledger = MixtureLedger(tcfg.rho)
    # Client (rollout/client.py): model calls through the router, with the session headers.
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
    client = ModelClient(http, stack.router_url, name,
                         sampling=OmegaConf.to_container(tcfg.sampling, resolve=True),
                         timeout_s=float(tcfg.request_timeout_s))
    # Workers (rl/workers.py) with the rewards (rl/reward_pool.py): a unit -> one completion
    # and its reward (rlvr, rlhf), or an episode on the agent server (agents/server.py).
    rewards = RewardPool(reward_cfg, stack.model_path)
    single = SingleTurnWorker(client, tokenizer, rewards, max_tokens=tcfg.max_tokens,
                              max_model_len=int(cfg.model.max_model_len))
    workers = {"rlvr": single.run, "rlhf": single.run}
    if agent_client is not None:
        workers["agent"] = AgentWorker(agent_client, stack.router_url, name,
                                       limits=OmegaConf.to_container(tcfg.agent_limits, resolve=True),
                                       sampling=OmegaConf.to_container(tcfg.sampling, resolve=True)).run
    # Learner (rl/learner.py, rl/grpo.py): the GRPO update on the finished samples.
    console.print("loading the learner ...")
    if not console.is_terminal:  # into a log: no weight-loading bar redrawn with carriage returns
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    learner = await asyncio.to_thread(make_learner, stack.model_path, learner_config(tcfg), group)
    keep_last = int(tcfg.checkpoint_keep_last)
    disk = learner.disk_estimate(keep_last)
    gb = 1e9
    # One line per figure, never wrapped (a long run folder broke it in two in a log).
    console.print(f"disk: about {disk.checkpoints_bytes / gb:.1f} GB for checkpoints in {run_dir} "
                  f"({disk.checkpoint_bytes / gb:.1f} GB each, trainer.checkpoint_keep_last={keep_last}, "
                  "plus the one being written)", soft_wrap=True)
    if tcfg.weight_sync.method == "http_reload":
        console.print(f"disk: about {disk.weight_sync_bytes / gb:.1f} GB for the weight sync under "
                      f"{tcfg.weight_sync.shm_dir}", soft_wrap=True)
    # Weight sync (rollout/weight_sync.py): the new weights into the running engines, their
    # prefix caches reset, the router told.
    wcfg = weight_sync_config(tcfg.weight_sync, stack.router_url if ours else None)
    shm_parent = wcfg.shm_dir
    remove_stale_shm_dirs(shm_parent)  # weights left by jobs that were killed
    wcfg.shm_dir = str(job_shm_dir(shm_parent, run_dir.name))  # this job's own; removed by sync.close()
    sync = make_weight_sync(wcfg, stack.engines.urls, int(cfg.engine.tensor_parallel_size),
                            device=str(learner.device))
    if wcfg.method == "nccl":
        console.print("joining the engines' NCCL weight-sync group ...")
        await asyncio.to_thread(sync.connect)

    run = wandb.init(project=str(cfg.logging.wandb_project), name=run_dir.name, dir=str(run_dir),
                     mode=os.environ.get("WANDB_MODE", str(cfg.logging.wandb_mode)),
                     config=OmegaConf.to_container(cfg, resolve=True), reinit="finish_previous")
    # Into a log the bar is off (rich would print its last state at the end, repeating the
    # last iteration's line); the iteration and rollout lines below say it all.
    progress = iteration_progress(console)
    bar = progress.add_task("", total=int(tcfg.iterations))

    last_line = {"text": "", "printed_s": time.monotonic()}
    every_s = float(cfg.logging.rollout_line_every_s)

    def on_rollout(p: dict) -> None:
        # Minutes pass between two iteration lines; say how the next step's rollouts go:
        # beside the bar in a terminal, a line at most every logging.rollout_line_every_s in a log.
        text = rollout_progress_line(p)
        if console.is_terminal:
            progress.update(bar, description=f"{last_line['text']}  [{text}]".lstrip())
        elif time.monotonic() - last_line["printed_s"] >= every_s:
            console.print(f"  {text}", soft_wrap=True)
            last_line["printed_s"] = time.monotonic()

    def log(m: dict) -> None:
        flat = {k: v for k, v in m.items() if isinstance(v, (int, float)) and v is not None}
        for b, v in (m.get("consumed_mixture") or {}).items():
            flat[f"mixture/{b}"] = v
        for b, v in (m.get("trained_mixture") or {}).items():
            flat[f"trained_mixture/{b}"] = v
        for b, v in (m.get("reward_by_class") or {}).items():
            flat[f"reward/{b}"] = v
        for b, v in (m.get("rollout_reward_by_class") or {}).items():
            flat[f"rollout_reward/{b}"] = v
        run.log(flat, step=int(m["iteration"]))
        if "iteration_s" not in m:  # the step-0 evaluation line
            scores = eval_scores_text(flat)
            console.print(f"step 0 (initial weights): {scores or 'evaluated'}; rollouts for iteration 1 ...")
            last_line["printed_s"] = time.monotonic()
            return
        line = last_line["text"] = progress_line(m)
        last_line["printed_s"] = time.monotonic()
        progress.update(bar, completed=int(m["iteration"]), description=line)
        if not console.is_terminal:  # a log file: no bar (disabled above); one line per iteration
            console.print(f"GRPO iteration {int(m['iteration'])}/{int(tcfg.iterations)}  {line}".rstrip())

    async def evaluate(version: int) -> dict[str, float]:
        from rl.evaluation import EvalSettings, arithmetic_heldout_benchmark, evaluate_async

        ec = tcfg.eval
        res = await evaluate_async(
            [arithmetic_heldout_benchmark(int(ec.problems), seed=int(cfg.seed),
                                          levels=tuple(int(x) for x in ec.levels))],
            stack.router_url, name,
            EvalSettings(n=int(ec.n), ks=tuple(int(k) for k in ec.ks),
                         temperature=float(ec.temperature), top_p=float(ec.top_p),
                         max_tokens=int(ec.max_tokens), seed=int(cfg.seed),
                         # seeded requests kill a vLLM 0.32 CPU engine core (rl.eval's
                         # eval.request_seeds=auto makes the same choice)
                         request_seeds=cfg.engine.kind != "cpu",
                         run_id=f"{run_dir.name}-eval-v{version}"),
            out_dir=run_dir / "eval" / f"v{version}", progress=False)
        return {f"eval/{bench}/{metric}": v["mean"] for bench, r in res.items()
                for metric, v in r["metrics"].items()}

    trainer = Trainer(trainer_config(tcfg), sampler=sampler, mixture_ledger=mixture_ledger, learner=learner,
                      workers=workers, engine_urls=stack.engines.urls,
                      router_url=stack.router_url if ours else None, weight_sync=sync,
                      run_dir=run_dir, log=log, evaluate=evaluate, model_source=stack.model_path,
                      on_rollout=on_rollout)
    resumed = trainer.resume()
    if resumed:
        console.print(f"resumed from {run_dir / 'checkpoint'} at iteration {learner.version}")
        progress.update(bar, completed=learner.version)
    try:
        if resumed:  # the engines started with the initial weights: serve the resumed ones
            await asyncio.to_thread(sync.sync, learner, learner.version)
        if not resumed and tcfg.eval_every:
            console.print("evaluating the initial weights on the held-out problems (step 0) ...")
        with progress:
            await trainer.evaluate_baseline()
            history = await trainer.run()
        trainer.save_checkpoint()
    finally:
        run.finish()
        sync.close()
        with contextlib.suppress(OSError):  # absent, or holds another job's folder
            Path(shm_parent).rmdir()
        rewards.close()
        await http.aclose()
        if agent_client is not None:
            await agent_client.aclose()
    return history


def job_gpu_placement(cfg: DictConfig):
    """The GPUs of the local engines and of the trainer process
    (``rollout.engines.GpuPlacement``), from ``engine`` and ``trainer.learner.gpus`` over
    this job's ``CUDA_VISIBLE_DEVICES``; None when the engines run on CPU.

    Raises:
        EngineError: the trainer's GPUs overlap the engines', or the job has too few.
    """
    from rollout.engines import EngineError, gpu_placement

    ecfg = cfg.engine
    if ecfg.kind != "gpu":
        return None
    gpus = cfg.trainer.learner.get("gpus")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        count = visible_gpu_count()
        if count == 0:
            raise EngineError("engine=gpu, but this machine has no GPU that torch can see; "
                              "use engine=cpu here, or run the job on a GPU machine")
        visible = ",".join(str(i) for i in range(count))
    return gpu_placement(0 if ecfg.urls else int(ecfg.num_engines), int(ecfg.tensor_parallel_size),
                         None if gpus is None else [int(g) for g in gpus], visible=visible)


def visible_gpu_count() -> int:
    """GPUs torch sees on this machine, counted in a child process: initialising CUDA here
    would fix this process's devices before ``use_trainer_gpus`` narrows them."""
    import subprocess

    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, timeout=120)
    try:
        return int(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return 0


def use_trainer_gpus(placement) -> None:
    """Narrow this process's ``CUDA_VISIBLE_DEVICES`` to the trainer's GPUs, so the learner
    (``cuda`` = ``cuda:0``), DeepSpeed (``cuda:LOCAL_RANK``), the NCCL weight sync and the
    reward server started from here never touch an engine's GPU. Call it after the engines
    started (their split is computed from the job's full list) and before anything uses
    CUDA here.

    Raises:
        ConfigError: CUDA was already initialised in this process (too late to narrow).
    """
    import torch

    if torch.cuda.is_initialized():
        raise ConfigError("CUDA was initialised in the trainer before its GPUs were chosen; "
                          "the learner could land on an engine's GPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = placement.trainer


def validate_job_cfg(cfg: DictConfig):
    """Everything about the composed config that can be checked before engines start:
    ``seed``, ``model.path`` given where the recipe requires it, the agent task files
    (``agents.tasks_path``, ``agents.task_sets``), the ``trainer``, ``engine`` and
    ``router`` groups (``router.launch.check_router_cfg``), the GPU placement, and that the
    weight sync fits the engines.

    Returns:
        the GPU placement (``job_gpu_placement``), or None with engines on CPU.

    Raises:
        ConfigError, EngineError, ModelPrepareError, RouterConfigError: the message names
            the key and what to give instead.
    """
    from rollout.engines import validate_engine_cfg
    from rollout.model import check_model_path
    from rollout.weight_sync import WORKER_EXTENSION
    from router.launch import check_router_cfg

    from agents.server import TOOL_LISTING_RULE

    check_values(cfg, {"seed": SEED_RULE, "agents.tool_listing": TOOL_LISTING_RULE,
                       "logging.rollout_line_every_s": (number(at_least=0), "seconds >= 0, e.g. 30 (0: a line per unit)")})
    check_model_path(cfg.model)
    validate_trainer_cfg(cfg.trainer)
    check_tasks_path(cfg.agents.get("tasks_path"))
    agent_task_sets_override(cfg.agents.get("task_sets") or [])
    check_learner_ranks(cfg)
    validate_engine_cfg(cfg.engine)
    check_router_cfg(cfg.router)
    placement = job_gpu_placement(cfg)
    tcfg, ecfg = cfg.trainer, cfg.engine
    if tcfg.weight_sync.method == "nccl":
        if ecfg.kind != "gpu":
            raise ConfigError("trainer.weight_sync.method=nccl needs GPU engines (engine=gpu); "
                              "with engine=cpu use trainer.weight_sync.method=http_reload")
        if str(tcfg.learner.device) == "cpu":
            raise ConfigError("trainer.weight_sync.method=nccl broadcasts from the learner's "
                              "GPU: set trainer.learner.device=cuda (or auto)")
        extra = [str(a) for a in ecfg.extra_args]
        if not ecfg.urls and WORKER_EXTENSION not in extra:
            raise ConfigError(
                "trainer.weight_sync.method=nccl needs the engines' worker extension: add "
                f"'engine.extra_args=[--worker-extension-cls,{WORKER_EXTENSION}]' (as "
                "recipes/recipe/mixed_step_gpu.yaml does)")
    device = str(tcfg.rewards.get("device", "cpu"))
    if placement is not None and device.startswith("cuda"):
        try:
            index = int(device.partition(":")[2] or 0)
        except ValueError:
            raise ConfigError(f"trainer.rewards.device={device}: use cpu, cuda or cuda:N") from None
        have = len(placement.trainer.split(",")) if placement.trainer else 0
        if index >= have:
            raise ConfigError(
                f"trainer.rewards.device={device}, but the trainer process has {have} GPU(s) "
                f"(trainer.learner.gpus={tcfg.learner.get('gpus')}; "
                "cuda:0 is the learner's): add a GPU there or use a lower index")
    return placement


def check_learner_ranks(cfg: DictConfig) -> None:
    """The launcher's ranks fit ``trainer.learner`` (``rl.distributed.check_learner_ranks``),
    and several ranks on GPUs have the engines elsewhere (``engine.urls``): each rank takes
    ``cuda:LOCAL_RANK``, which would be an engine's GPU on this node.

    Raises:
        RankError, ConfigError: the message names the key.
    """
    from rl.distributed import check_learner_ranks as check, rank_from_env

    info = rank_from_env()
    lcfg = cfg.trainer.learner
    check(lcfg.get("world_size"), str(lcfg.backend), info)
    if info.world_size > 1 and cfg.engine.kind == "gpu" and not cfg.engine.urls:
        raise ConfigError(f"{info.world_size} learner ranks on GPUs with engines started here: "
                          "each rank uses cuda:LOCAL_RANK; run the engines on other nodes and "
                          "give engine.urls=[...] engine.kv_event_endpoints=[...]")


def trainer_value_rules(plain: dict) -> dict:
    """The ``check_values`` rules of the ``trainer`` knobs no part checks when built: every
    class's group size G and output-token limit (whole numbers >= 1; a class is switched off
    by its weight in ``trainer.rho``, not by G=0), the sampling fields (temperature >= 0,
    0 = greedy; 0 < top_p <= 1) of the rollouts and of the evaluation, and the agent
    episode limits."""
    whole = number(at_least=1, whole=True)
    temperature = (number(at_least=0), "a number >= 0 (0 = greedy)")
    top_p = (number(above=0, at_most=1), "a number in (0, 1]")
    rules = {f"trainer.group_size.{b}": (whole, "a whole number >= 1 (units per prompt; "
                                                f"trainer.rho.{b}=0 switches the class off)")
             for b in plain.get("group_size") or {}}
    rules.update({f"trainer.max_tokens.{b}": (whole, "a whole number of tokens >= 1")
                  for b in plain.get("max_tokens") or {}})
    rules.update({f"trainer.agent_limits.{k}": (whole, "a whole number >= 1")
                  for k in ("max_turns", "max_tokens_per_turn", "max_context_tokens")})
    rules.update({"trainer.sampling.temperature": temperature, "trainer.sampling.top_p": top_p,
                  "trainer.eval.temperature": temperature, "trainer.eval.top_p": top_p})
    rules.update({f"trainer.eval.{k}": (whole, "a whole number >= 1") for k in ("problems", "n", "max_tokens")})
    return rules


def validate_trainer_cfg(tcfg: DictConfig) -> None:
    """Build every part of ``trainer`` that needs no running stack (mixture, loss, learner,
    limits, weight sync, and each prompt domain with its data), so a bad value is refused
    before engines start.

    Raises:
        ConfigError: the message names the ``trainer.`` section and what is wrong.
    """
    from rl.data import DataError, make_source
    from rl.grpo import loss_config
    from rl.learner import learner_config
    from rl.mixture import normalize_mixture
    from rl.sampler import active_domains, check_sources
    from rl.trainer import TrainerError, check_group_fits, trainer_config
    from rollout.weight_sync import weight_sync_config

    plain = OmegaConf.to_container(tcfg, resolve=True)
    try:  # the domains switched on (weight > 0); one of weight 0 is not built, its data not read
        domains = active_domains(plain.get("domains"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # prompt sources: trainer.domains, and the agent server's task sets for class agent (_main)
    sourced = list(domains) + ["agent"]
    checks = (("trainer.rho", lambda: check_sources(plain.get("rho"), sourced)),
              ("trainer.loss", lambda: loss_config(plain["loss"])),
              ("trainer.learner", lambda: learner_config(plain)),
              ("trainer", lambda: trainer_config(plain)),  # the loop's settings and limits
              ("trainer.weight_sync", lambda: weight_sync_config(plain["weight_sync"])))
    for where, build in checks:
        try:
            build()
        except TypeError as e:
            raise ConfigError(f"{where}: a value has the wrong type ({e}); numbers must be "
                              f"numbers: check the values under {where}") from None
        except (ValueError, RuntimeError) as e:  # the parts' own error types
            message = str(e)  # build_options already names the section
            raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None
    for key in ("request_timeout_s", "agent_timeout_s"):
        v = plain.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(f"trainer.{key}={v!r}: give a number of seconds > 0")
    check_values({"trainer": plain}, trainer_value_rules(plain))
    try:  # a group is released whole: max_in_flight holds the largest one drawn
        check_group_fits(int(plain["max_in_flight"]), plain.get("group_size") or {},
                         normalize_mixture(plain["rho"]))
    except TrainerError as e:
        raise ConfigError(str(e)) from None
    for b, doms in domains.items():  # e.g. the GSM8K file is there and readable
        for name, (opts, _weight) in doms.items():
            try:
                make_source(name, opts)
            except DataError as e:
                where = f"give trainer.domains.{b}.{name}.path=..., " if "path" in opts else ""
                raise ConfigError(f"trainer.domains.{b}.{name}: {e}; {where}or switch the domain off with "
                                  f"trainer.domains.{b}.{name}.weight=0") from None


def router_label(router_cfg) -> str:
    """What routes the run, in words: ``vllm-router (cache_aware)`` for the real vLLM Router
    program (``router=vllm``), ``our router (kv_horizon)`` for ours; the policy alone named
    the vLLM Router's run after the policy of ours with the same name."""
    impl, policy = router_cfg.get("impl", "ours"), router_cfg.get("policy")
    return f"vllm-router ({policy})" if impl == "vllm" else f"our router ({policy})"


@hydra_entry("train")
def main(cfg: DictConfig) -> None:
    from rl.distributed import RankGroup, rank_from_env
    from rl.learner_launch import worker_main

    stop_on_sigterm()
    _register_errors()
    info = rank_from_env()
    lcfg = cfg.trainer.learner
    if info.rank > 0:  # a learner rank under torchrun: it only trains, on rank 0's commands
        sys.exit(worker_main(info, str(lcfg.device), float(lcfg.collective_timeout_s)))
    placement = validate_job_cfg(cfg)
    group = None
    if info.world_size > 1 or lcfg.backend == "fsdp":
        # joined before the engines start, so the other ranks' rendezvous does not wait on them
        on_gpu = cfg.engine.kind == "gpu" and str(lcfg.device) != "cpu"
        group = RankGroup(info, "nccl" if on_gpu else "gloo", float(lcfg.collective_timeout_s))
        group.stop_on_sigterm()  # torchrun stopping the job: name a dead rank first
        group.publish("run_dir", str(Path(cfg.run_dir).resolve()))
    try:
        _main(cfg, placement, group)
    finally:
        if group is not None:
            group.post("stop")
            group.close()


def _main(cfg: DictConfig, placement, group) -> None:
    from agents.client import launch_agent_server

    console = output_console()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    console.print(f"run folder: {run_dir}")
    if cfg.engine.kind == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed on CPU (gloo)
    os.environ.setdefault("WANDB_SILENT", "true")  # the progress bar and summary say enough
    with ServingStack(cfg, run_dir) as stack:
        console.print(f"engines up in {stack.timings_s.get('engines_s', 0):.0f} s: "
                      f"{stack.engines.urls}; {router_label(cfg.router)} at "
                      f"{stack.router_url}")
        if placement is not None:
            use_trainer_gpus(placement)
            console.print(f"engines on GPUs {' | '.join(placement.engines) or '(elsewhere)'}; "
                          f"trainer on GPUs {placement.trainer or '(none)'}")
        with contextlib.ExitStack() as services:
            reward_cfg = OmegaConf.to_container(cfg.trainer.rewards, resolve=True)
            if float(cfg.trainer.rho.get("rlhf", 0)) > 0 and reward_cfg["rlhf_scorer"] != "http":
                url = services.enter_context(reward_server(cfg, run_dir, stack.model_path))
                reward_cfg.update(rlhf_scorer="http", server={"host": url.host, "port": url.port})
            agent_url = None
            if float(cfg.trainer.rho.get("agent", 0)) > 0:
                # (the agent server reads the served model name from the router's /v1/models)
                overrides = [f"router_url={stack.router_url}", f"tokenizer={stack.model_path}",
                             f"max_concurrent_episodes={int(cfg.trainer.max_in_flight)}"]
                if cfg.agents.tasks_path:
                    overrides.append(f"tasks_path={repo_path(cfg.agents.tasks_path)}")
                overrides.append(agent_task_sets_override(cfg.agents.get("task_sets") or []))
                overrides.append(f"episode.tool_listing={cfg.agents.tool_listing}")
                _, agent_url = services.enter_context(launch_agent_server(run_dir / "logs", overrides))
            history = asyncio.run(train(cfg, stack, agent_url, reward_cfg, run_dir, console, group))
    console.print(summary_table(history, title=f"{cfg.recipe.name} / {router_label(cfg.router)}"))
    if float(cfg.trainer.rho.get("rlvr", 0)) > 0:
        console.print(rlvr_settings_table(cfg.trainer))
    for p in plot_run(history, dict(cfg.trainer.rho), run_dir / "plots"):
        console.print(f"plot: {p}")
    console.print(f"metrics: {run_dir / 'metrics.jsonl'}; logs: {run_dir / 'logs'}")


if __name__ == "__main__":
    main()
