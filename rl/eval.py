"""``python -m rl.eval``: pass@k of a model on SWE-style, code and math benchmarks.

    python -m rl.eval                                   # packaged model, engines + router
    python -m rl.eval model.path=/ckpt router=misa-t eval.n=8 eval.ks=[1,4,8]
    python -m rl.eval eval.router_url=http://127.0.0.1:8000    # a stack that already runs
    python -m rl.eval eval.benchmarks.swe.path=swebench_lite.jsonl \\
        eval.benchmarks.swe.snapshots_dir=/data/checkouts eval.benchmarks.gsm8k.enabled=false

It starts the serving stack of the config (the same model, engine and router groups as
training) unless ``eval.router_url`` is given, runs ``rl.evaluation.evaluate``, prints
the markdown table, and writes everything to ``eval.out_dir``; rerunning with the same
``eval.out_dir`` continues a killed evaluation. With ``eval.wandb.run`` set, the figures
are logged to wandb (offline unless WANDB_MODE says otherwise).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agents.chat import ByteTokenizer, ChatFormat, HFTokenizer, Tokenizer
from agents.envs.task import TaskError
from agents.server import HANDMADE_TASKS, AgentServerError, episode_config
from rl.config import hydra_entry, register_user_error
from rl.evaluation.base import Benchmark, EvalError
from rl.evaluation.humaneval import HumanEvalBenchmark
from rl.evaluation.math_answers import arithmetic_heldout_benchmark, gsm8k_benchmark
from rl.evaluation.results import flat_metrics, markdown_table
from rl.evaluation.runner import EvalSettings, evaluate
from rl.evaluation.swe import SweBenchmark
from sandbox import Limits, SandboxError

register_user_error(EvalError)
register_user_error(AgentServerError)
register_user_error(TaskError)
register_user_error(SandboxError)

REPO_ROOT = Path(__file__).resolve().parent.parent


def _repo_path(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (REPO_ROOT / p).resolve()


def settings_of(cfg: DictConfig) -> EvalSettings:
    """``EvalSettings`` from the ``eval`` section.

    Raises:
        EvalError: n, ks or concurrency out of range.
    """
    e = cfg.eval
    try:
        return EvalSettings(
            n=int(e.n), ks=tuple(int(k) for k in e.ks), temperature=float(e.temperature),
            top_p=float(e.top_p), max_tokens=int(e.max_tokens), seed=int(e.seed),
            concurrency=int(e.concurrency), retry_errors=bool(e.retry_errors),
            request_timeout_s=float(e.request_timeout_s),
            run_id=f"eval-{Path(str(e.out_dir)).parent.name or 'run'}")
    except (TypeError, ValueError) as err:
        if isinstance(err, EvalError):
            raise
        raise EvalError(f"eval settings: {err}; n, ks, max_tokens, seed and concurrency are "
                        "integers (ks a list), temperature and top_p numbers.") from None


def single_turn_benchmarks(cfg: DictConfig) -> list[Benchmark]:
    """The enabled math and code benchmarks (their files are checked now).

    Raises:
        EvalError: a file is missing or malformed.
    """
    b, wc = cfg.eval.benchmarks, cfg.eval.workload_class.single_turn
    out: list[Benchmark] = []
    if b.humaneval.enabled:
        h = b.humaneval
        out.append(HumanEvalBenchmark(
            problems_path=str(_repo_path(h.path)) if h.path else None, limit=h.limit,
            limits=Limits(timeout_s=h.timeout_s, cpu_s=h.cpu_s, memory_bytes=h.memory_bytes,
                          max_processes=16),
            isolation=episode_config(cfg.eval.agent).isolation, workload_class=wc))
    if b.gsm8k.enabled:
        out.append(gsm8k_benchmark(_repo_path(b.gsm8k.path), b.gsm8k.limit, wc))
    if b.arithmetic.enabled:
        a = b.arithmetic
        out.append(arithmetic_heldout_benchmark(a.num_problems, a.seed, tuple(a.levels),
                                                a.holdout_buckets, workload_class=wc))
    return out


def swe_path(cfg: DictConfig) -> Path | None:
    """The SWE instances file of the config (None when the benchmark is off).

    Raises:
        EvalError: the file does not exist.
    """
    s = cfg.eval.benchmarks.swe
    if not s.enabled:
        return None
    path = HANDMADE_TASKS if s.path == "handmade" else _repo_path(s.path)
    if not path.is_file():
        raise EvalError(f"swe benchmark: instances file {path} does not exist; set "
                        "eval.benchmarks.swe.path to a JSONL of SWE-bench-format instances.")
    return path


def swe_benchmark(cfg: DictConfig, path: Path, tokenizer: Tokenizer) -> SweBenchmark:
    """The SWE benchmark with the episode settings of ``eval.agent``."""
    s, agent = cfg.eval.benchmarks, cfg.eval.agent
    return SweBenchmark(
        path=str(path), tokenizer=tokenizer, episode=episode_config(agent),
        chat_format=ChatFormat(**OmegaConf.to_container(agent.chat_format, resolve=True)),
        snapshots_dir=str(_repo_path(s.swe.snapshots_dir)) if s.swe.snapshots_dir else None,
        limit=s.swe.limit, validate=bool(s.swe.validate), model_timeout_s=agent.model_timeout_s,
        model_retries=agent.model_retries, workload_class=cfg.eval.workload_class.swe)


def load_tokenizer(spec: str) -> Tokenizer:
    """``"byte"`` -> ByteTokenizer (scripted servers), else a local HF tokenizer folder."""
    return ByteTokenizer() if spec == "byte" else HFTokenizer(spec)


def log_wandb(cfg: DictConfig, report: dict[str, dict[str, Any]], out_dir: Path) -> None:
    """Log the figures and the table to wandb run ``eval.wandb.run`` (offline by default)."""
    os.environ.setdefault("WANDB_MODE", "offline")
    import wandb

    run = wandb.init(project=cfg.eval.wandb.project, name=cfg.eval.wandb.run, dir=str(out_dir),
                     config=OmegaConf.to_container(cfg.eval, resolve=True), reinit=True)
    metrics = flat_metrics(report)
    run.log(metrics)
    rows = [[name, metric, m["mean"], m["ci_low"], m["ci_high"]]
            for name, r in report.items() for metric, m in r["metrics"].items()]
    run.log({"eval/table": wandb.Table(columns=["benchmark", "metric", "mean", "ci_low", "ci_high"],
                                       data=rows)})
    run.finish()


def benchmarks_of(cfg: DictConfig, tokenizer: str | None,
                  single_turn: list[Benchmark] | None = None) -> list[Benchmark]:
    """All enabled benchmarks of a composed ``eval`` config (the trainer's periodic
    evaluation builds its benchmarks with this too).

    Args:
        cfg: a config composed from ``recipes/eval.yaml`` (or holding its ``eval`` section).
        tokenizer: the served model's tokenizer for SWE episodes (a local HF folder or
            ``"byte"``); needed only when the SWE benchmark is enabled.
        single_turn: the math and code benchmarks when already built
            (``single_turn_benchmarks``).

    Raises:
        EvalError: a benchmark file is missing or malformed, or no tokenizer for SWE.
    """
    benchmarks = list(single_turn if single_turn is not None else single_turn_benchmarks(cfg))
    swe = swe_path(cfg)
    if swe is not None:
        if tokenizer is None:
            raise EvalError("the swe benchmark needs the served model's tokenizer; set "
                            "eval.tokenizer or disable eval.benchmarks.swe.")
        benchmarks.append(swe_benchmark(cfg, swe, load_tokenizer(tokenizer)))
    return benchmarks


def harness_hint(report: dict[str, dict[str, Any]], cfg: DictConfig) -> str:
    """How to grade the SWE predictions with the official harness (Docker), or why not."""
    files = report.get("swe", {}).get("predictions") or []
    if not files:
        return ""
    docker = shutil.which("docker") is not None
    lines = [f"SWE predictions (swebench format): {', '.join(files)}",
             "official grading (needs Docker" + (")" if docker else "; not found here, the "
                                                   "figures above are the local sandbox grading)") + ":"]
    dataset = swe_path(cfg)
    lines += [f"  python -m swebench.harness.run_evaluation --dataset_name {dataset} "
              f"--predictions_path {f} --run_id {Path(f).stem}" for f in files]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """Evaluate as configured; returns the report (see ``rl.evaluation.evaluate``).

    Raises:
        EvalError, TaskError, SandboxError, AgentServerError: bad input (files, options);
        the serving stack's errors (engines, model) when it cannot start.
    """
    settings = settings_of(cfg)
    swe_path(cfg)  # a missing file fails before any engine starts
    single_turn = single_turn_benchmarks(cfg)
    out_dir = Path(str(cfg.eval.out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.eval.router_url:
        model = cfg.eval.served_model_name or str(cfg.model.name)
        tokenizer = cfg.eval.tokenizer
        if tokenizer is None and cfg.eval.benchmarks.swe.enabled:
            from rollout.model import resolve_model_path
            tokenizer = resolve_model_path(cfg.model)
        report = evaluate(benchmarks_of(cfg, tokenizer, single_turn), str(cfg.eval.router_url),
                          model, settings, out_dir, progress=bool(cfg.eval.progress))
    else:
        from rollout.serve import ServingStack, stop_on_sigterm

        stop_on_sigterm()
        with ServingStack(cfg, Path(str(cfg.run_dir))) as stack:
            report = evaluate(benchmarks_of(cfg, cfg.eval.tokenizer or stack.model_path, single_turn),
                              stack.router_url, stack.served_model_name, settings, out_dir,
                              progress=bool(cfg.eval.progress))
    print(markdown_table(report, list(settings.ks)), end="", flush=True)
    print(harness_hint(report, cfg), end="")
    print(f"results: {out_dir}/report.json, report.md, passk.png", flush=True)
    if cfg.eval.wandb.run:
        log_wandb(cfg, report, out_dir)
    return report


@hydra_entry("eval")
def main(cfg: DictConfig) -> None:
    """``python -m rl.eval``: see the module docstring."""
    run(cfg)


if __name__ == "__main__":
    main()
