"""``python -m rl.eval``: pass@k of a model on SWE-style, code and math benchmarks.

    python -m rl.eval                                   # packaged model, engines + router
    python -m rl.eval model.path=/ckpt router=misa-t eval.n=8 eval.ks=[1,4,8]
    python -m rl.eval eval.router_url=http://127.0.0.1:8000    # a stack that already runs
    python -m rl.eval eval.benchmarks.swe.path=swebench_lite.jsonl \\
        eval.benchmarks.swe.snapshots_dir=/data/checkouts eval.benchmarks.gsm8k.enabled=false
    python -m rl.eval eval.predictions=preds.jsonl     # grade a predictions file, no model

With ``eval.predictions`` set, no engine or router starts: the SWE-bench predictions file
is graded against ``eval.benchmarks.swe`` by its grader (``rl.evaluation.predictions``)
and the same results files are written; the other benchmarks (they need a model) are
not run.

Every value of the ``eval`` section is checked first (``check_config``): a bad one (a
missing file, k > n, a URL that is no URL, an unknown benchmark) is one message naming
its key and exit code 1, before any engine starts. A given ``eval.router_url`` must
answer (and serve the model) before sampling starts. Then it starts the serving stack
of the config (the same model, engine and router groups as training) unless
``eval.router_url`` is given, runs ``rl.evaluation.evaluate``, prints the markdown table,
and writes everything to ``eval.out_dir``; rerunning with the same ``eval.out_dir``
continues a killed evaluation. An evaluation in which no problem could be scored (every
one errored: the router went away, every instance is broken) exits with code 1 after
writing its report. With ``eval.wandb.run`` set, the figures are logged to wandb
(offline unless WANDB_MODE says otherwise). SWE patches are graded by the official
``swebench`` harness or in the local sandbox (``eval.benchmarks.swe.grader``); the
output says which.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import httpx
from omegaconf import DictConfig, ListConfig, OmegaConf

from agents.chat import ByteTokenizer, ChatFormat, HFTokenizer, Tokenizer
from agents.envs.task import TaskError
from agents.server import HANDMADE_TASKS, AgentServerError, episode_config
from common.config import EXIT_FAILURE, SEED_RULE, RunFailedError, check_values, hydra_entry, register_user_error
from rl.data.gsm8k import looks_like_hub_id
from rl.evaluation.base import Benchmark, EvalError
from rl.evaluation.humaneval import HumanEvalBenchmark
from rl.evaluation.math_answers import arithmetic_heldout_benchmark, gsm8k_benchmark
from rl.evaluation.predictions import grade_predictions_async
from rl.evaluation.results import flat_metrics, markdown_table
from rl.evaluation.runner import EvalSettings, evaluate
from rl.evaluation.swe import SweBenchmark
from rl.evaluation.swebench_harness import (GRADERS, GraderChoice, HarnessSettings, choose_grader,
                                            harness_unavailable)
from common.urls import url_problem
from sandbox import Limits, SandboxError

register_user_error(EvalError)  # a bad value, a missing file, a router that does not answer: exit 2
register_user_error(AgentServerError)
register_user_error(TaskError)
register_user_error(SandboxError, exit_code=EXIT_FAILURE)  # at run time: exit 1

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("swe", "humaneval", "gsm8k", "arithmetic")
"""The benchmarks under ``eval.benchmarks``."""

log = logging.getLogger("rl.eval")


def _repo_path(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (REPO_ROOT / p).resolve()


def _typed(node: DictConfig, key: str, where: str, kind: type, *, minimum: float | None = None,
           positive: bool = False, optional: bool = False) -> Any:
    """``node[key]`` as ``kind`` (int, float, bool or str), at least ``minimum`` (above 0
    with ``positive``); None allowed when ``optional``.

    Raises:
        EvalError: the value has another type or is too small; the message names
            ``<where>.<key>``.
    """
    name = f"{where}.{key}"
    value = node.get(key)
    if value is None:
        if optional:
            return None
        raise EvalError(f"{name} is not set; give a value ({kind.__name__}).")
    if kind is bool:
        if not isinstance(value, bool):
            raise EvalError(f"{name}={value!r}: must be true or false.")
        return value
    if kind is str:
        if not isinstance(value, str) or not value.strip():
            raise EvalError(f"{name}={value!r}: must be a non-empty string.")
        return value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and ok and float(value) != int(value):
        ok = False
    if not ok:
        raise EvalError(f"{name}={value!r}: must be {'an integer' if kind is int else 'a number'}.")
    value = kind(value)
    if minimum is not None and value < minimum:
        raise EvalError(f"{name}={value}: must be >= {minimum}.")
    if positive and value <= 0:
        raise EvalError(f"{name}={value}: must be > 0.")
    return value


def _request_seeds(cfg: DictConfig) -> bool:
    """``eval.request_seeds``: true, false, or auto (= the engines are not vLLM CPU engines).

    Raises:
        EvalError: another value.
    """
    value = cfg.eval.get("request_seeds", "auto")
    if isinstance(value, bool):
        return value
    if value == "auto":
        return str(cfg.get("engine", {}).get("kind", "cpu")) != "cpu"
    raise EvalError(f"eval.request_seeds={value!r}: must be true, false or auto.")


def settings_of(cfg: DictConfig) -> EvalSettings:
    """``EvalSettings`` from the ``eval`` section.

    Raises:
        EvalError: n, ks, sampling settings or concurrency missing, of the wrong type or
            out of range (the message names the key).
    """
    e = cfg.eval
    ks = e.get("ks")
    if not isinstance(ks, (list, ListConfig)) or not all(
            isinstance(k, int) and not isinstance(k, bool) for k in ks):
        raise EvalError(f"eval.ks={OmegaConf.to_container(ks) if isinstance(ks, ListConfig) else ks!r}: "
                        "must be a list of integers (the budgets k), e.g. eval.ks=[1,2,4].")
    return EvalSettings(
        n=_typed(e, "n", "eval", int), ks=tuple(int(k) for k in ks),
        temperature=_typed(e, "temperature", "eval", float),
        top_p=_typed(e, "top_p", "eval", float), max_tokens=_typed(e, "max_tokens", "eval", int),
        seed=_typed(e, "seed", "eval", int, minimum=0), request_seeds=_request_seeds(cfg),
        concurrency=_typed(e, "concurrency", "eval", int),
        retry_errors=_typed(e, "retry_errors", "eval", bool),
        request_timeout_s=_typed(e, "request_timeout_s", "eval", float),
        run_id=f"eval-{Path(str(e.out_dir)).parent.name or 'run'}")


def router_url_of(cfg: DictConfig) -> str | None:
    """``eval.router_url`` checked and normalised (no trailing ``/`` or ``/v1``); None when unset.

    Raises:
        EvalError: not an http(s) URL with a host (and a numeric port, if any).
    """
    raw = cfg.eval.get("router_url")
    if raw is None:
        return None
    url = str(raw).strip()
    problem = url_problem(url)
    if problem is not None:
        what = "is not a valid URL" if problem.startswith("it does not parse") else "is not an http(s) URL"
        raise EvalError(f"eval.router_url={raw!r} {what}: {problem}; give the router's "
                        "base URL, e.g. eval.router_url=http://127.0.0.1:8100, or leave it null to start "
                        "engines and a router here.")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def check_router(url: str, model: str, timeout_s: float = 10.0) -> None:
    """Check that a router (or engine) answers at ``url`` and serves ``model``.

    Asks ``GET <url>/v1/models``. A server that answers without listing models (no such
    route) is accepted: the samples will tell.

    Raises:
        EvalError: nothing answers (refused, unknown host, timeout), the router answers
            that no engine behind it is healthy, or its model list lacks ``model``.
    """
    try:
        r = httpx.get(f"{url}/v1/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise EvalError(f"eval.router_url={url}: no router answers there ({type(e).__name__}: "
                        f"{e or 'no detail'}). Start the stack (python -m rollout.serve) or fix the "
                        "URL; leave eval.router_url null to start engines and a router here.") from None
    if r.status_code in (502, 503, 504):
        raise EvalError(f"eval.router_url={url} answers, but no engine behind it does (HTTP "
                        f"{r.status_code} on /v1/models: {r.text[:200]}); check the engines.")
    if r.status_code != 200:
        log.warning("%s/v1/models answered HTTP %d; the served model name is not checked",
                    url, r.status_code)
        return
    try:
        served = [str(m["id"]) for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        log.warning("%s/v1/models did not list models; the served model name is not checked", url)
        return
    if served and model not in served:
        raise EvalError(f"eval.router_url={url} serves {served}, not {model!r}; set "
                        "eval.served_model_name to one of them.")


def _check_path(value: Any, key: str, *, folder: bool) -> Path:
    p = _repo_path(str(value))
    if not (p.is_dir() if folder else p.is_file()):
        raise EvalError(f"{key}={value}: {'folder' if folder else 'file'} {p} does not exist.")
    return p


def check_config(cfg: DictConfig) -> EvalSettings:
    """Check every value of the ``eval`` section before anything starts.

    Returns:
        The evaluation settings (``settings_of``).

    Raises:
        ConfigError: ``seed`` is not a whole number >= 0.
        EvalError: the first bad value, its key named: a type or range (n < 1, k > n,
            negative limits), an unknown benchmark name, no benchmark enabled, a missing
            file or folder, a malformed ``eval.router_url``, an unknown grader.
        AgentServerError, SandboxError: a bad ``eval.agent`` or sandbox limit.
    """
    e = cfg.eval
    check_values(cfg, {"seed": SEED_RULE})  # before eval.seed, which is ${seed} unless given
    settings = settings_of(cfg)
    router_url_of(cfg)
    b = e.benchmarks
    unknown = sorted(set(map(str, b)) - set(BENCHMARKS))
    if unknown:
        raise EvalError(f"eval.benchmarks: unknown benchmark(s) {unknown}; the benchmarks are "
                        f"{', '.join(BENCHMARKS)}.")
    enabled = [name for name in BENCHMARKS if _typed(b[name], "enabled", f"eval.benchmarks.{name}", bool)]
    if not enabled:
        raise EvalError("no benchmark enabled; set eval.benchmarks.<name>.enabled=true for one of "
                        f"{', '.join(BENCHMARKS)}.")
    for name in ("swe", "humaneval", "gsm8k"):
        _typed(b[name], "limit", f"eval.benchmarks.{name}", int, minimum=1, optional=True)
    for key in ("single_turn", "swe"):
        _typed(e.workload_class, key, "eval.workload_class", str)
    _typed(e, "served_model_name", "eval", str, optional=True)
    _typed(e, "predictions", "eval", str, optional=True)
    _typed(e, "progress", "eval", bool)
    out_dir = Path(str(e.out_dir))
    if out_dir.exists() and not out_dir.is_dir():
        raise EvalError(f"eval.out_dir={out_dir} is a file; give a folder for the results.")
    tok = e.get("tokenizer")
    if tok is not None and tok != "byte" and str(tok).startswith(("/", ".", "~")):
        if not Path(str(tok)).expanduser().is_dir():  # read as given (HFTokenizer), not repo-relative
            raise EvalError(f"eval.tokenizer={tok}: folder {Path(str(tok)).expanduser()} does not "
                            "exist; give the served model's local folder, or 'byte'.")
    if "arithmetic" in enabled:
        a, where = b.arithmetic, "eval.benchmarks.arithmetic"
        _typed(a, "num_problems", where, int, minimum=1)
        _typed(a, "holdout_buckets", where, int, minimum=1)
        _typed(a, "seed", where, int)
    if "humaneval" in enabled:
        h, where = b.humaneval, "eval.benchmarks.humaneval"
        if h.path:
            _check_path(h.path, f"{where}.path", folder=False)
        _typed(h, "timeout_s", where, float, positive=True)
        _typed(h, "cpu_s", where, int, minimum=1)
        _typed(h, "memory_bytes", where, int, minimum=1)
    if "gsm8k" in enabled:
        _typed(b.gsm8k, "path", "eval.benchmarks.gsm8k", str)
        _typed(b.gsm8k, "split", "eval.benchmarks.gsm8k", str)
    if "swe" in enabled:
        s, where = b.swe, "eval.benchmarks.swe"
        swe_path(cfg)
        if s.snapshots_dir:
            _check_path(s.snapshots_dir, f"{where}.snapshots_dir", folder=True)
        _typed(s, "validate", where, bool)
        if s.grader not in GRADERS:
            raise EvalError(f"{where}.grader={s.grader!r}: must be one of {', '.join(GRADERS)}.")
        harness_settings(cfg)
        episode_config(e.agent)
    return settings


def single_turn_benchmarks(cfg: DictConfig) -> list[Benchmark]:
    """The enabled math and code benchmarks (their files are checked now).

    Raises:
        EvalError: a file is missing or malformed.
    """
    b, wc = cfg.eval.benchmarks, cfg.eval.workload_class.single_turn
    out: list[Benchmark] = []
    if b.humaneval.enabled:
        h = b.humaneval
        try:
            limits = Limits(timeout_s=h.timeout_s, cpu_s=h.cpu_s, memory_bytes=h.memory_bytes,
                            max_processes=16)
        except SandboxError as e:
            raise EvalError(f"eval.benchmarks.humaneval: {e}") from None
        out.append(HumanEvalBenchmark(
            problems_path=str(_repo_path(h.path)) if h.path else None, limit=h.limit,
            limits=limits, isolation=episode_config(cfg.eval.agent).isolation, workload_class=wc))
    if b.gsm8k.enabled:
        g = b.gsm8k
        local = _repo_path(str(g.path))
        spec = str(g.path) if not local.exists() and looks_like_hub_id(str(g.path)) else local
        out.append(gsm8k_benchmark(spec, g.limit, wc, split=str(g.split), hub_config=g.hub_config))
    if b.arithmetic.enabled:
        a = b.arithmetic
        levels = a.levels if isinstance(a.levels, (list, ListConfig)) else [a.levels]
        try:
            out.append(arithmetic_heldout_benchmark(a.num_problems, a.seed, tuple(levels),
                                                    a.holdout_buckets, workload_class=wc))
        except EvalError as e:
            raise EvalError(f"eval.benchmarks.arithmetic: {e}") from None
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


def harness_settings(cfg: DictConfig) -> HarnessSettings:
    """How the official harness runs (``eval.benchmarks.swe.harness``).

    Raises:
        EvalError: a value of the wrong type or out of range (the key named).
    """
    h, where = cfg.eval.benchmarks.swe.harness, "eval.benchmarks.swe.harness"
    return HarnessSettings(dataset_name=_typed(h, "dataset_name", where, str, optional=True),
                           split=_typed(h, "split", where, str),
                           max_workers=_typed(h, "max_workers", where, int, minimum=1),
                           timeout_s=_typed(h, "timeout_s", where, int, minimum=1))


def swe_grader(cfg: DictConfig, path: Path) -> GraderChoice:
    """Who grades the SWE patches (``eval.benchmarks.swe.grader``) and why.

    Raises:
        EvalError: ``swebench`` asked for where the official harness cannot run.
    """
    settings = harness_settings(cfg)
    return choose_grader(str(cfg.eval.benchmarks.swe.grader),
                         lambda: harness_unavailable(path, settings))


def swe_benchmark(cfg: DictConfig, path: Path, tokenizer: Tokenizer,
                  grader: GraderChoice | None = None) -> SweBenchmark:
    """The SWE benchmark with the episode settings of ``eval.agent``.

    Args:
        grader: who grades (None = ``swe_grader(cfg, path)``).
    """
    s, agent = cfg.eval.benchmarks, cfg.eval.agent
    grader = grader or swe_grader(cfg, path)
    return SweBenchmark(
        path=str(path), tokenizer=tokenizer, episode=episode_config(agent),
        chat_format=ChatFormat(**OmegaConf.to_container(agent.chat_format, resolve=True)),
        snapshots_dir=str(_repo_path(s.swe.snapshots_dir)) if s.swe.snapshots_dir else None,
        limit=s.swe.limit, validate=bool(s.swe.validate), model_timeout_s=agent.model_timeout_s,
        model_retries=agent.model_retries, workload_class=cfg.eval.workload_class.swe,
        grader=grader.grader, harness=harness_settings(cfg))


def load_tokenizer(spec: str) -> Tokenizer:
    """``"byte"`` -> ByteTokenizer (scripted servers), else a local HF tokenizer folder.

    Raises:
        EvalError: the tokenizer cannot be loaded (the message names eval.tokenizer).
    """
    if spec == "byte":
        return ByteTokenizer()
    try:
        return HFTokenizer(spec)
    except (OSError, ValueError) as e:
        raise EvalError(f"eval.tokenizer={spec}: cannot load a tokenizer from it ({type(e).__name__}: "
                        f"{str(e)[:200]}); give the served model's local folder, or 'byte'.") from None


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
                  single_turn: list[Benchmark] | None = None,
                  grader: GraderChoice | None = None) -> list[Benchmark]:
    """All enabled benchmarks of a composed ``eval`` config (the trainer's periodic
    evaluation builds its benchmarks with this too).

    Args:
        cfg: a config composed from ``recipes/eval.yaml`` (or holding its ``eval`` section).
        tokenizer: the served model's tokenizer for SWE episodes (a local HF folder or
            ``"byte"``); needed only when the SWE benchmark is enabled.
        single_turn: the math and code benchmarks when already built
            (``single_turn_benchmarks``).
        grader: who grades the SWE patches (None = ``swe_grader``).

    Raises:
        EvalError: a benchmark file is missing or malformed, or no tokenizer for SWE.
    """
    benchmarks = list(single_turn if single_turn is not None else single_turn_benchmarks(cfg))
    swe = swe_path(cfg)
    if swe is not None:
        if tokenizer is None:
            raise EvalError("the swe benchmark needs the served model's tokenizer; set "
                            "eval.tokenizer or disable eval.benchmarks.swe.")
        benchmarks.append(swe_benchmark(cfg, swe, load_tokenizer(tokenizer), grader))
    return benchmarks


def harness_hint(report: dict[str, dict[str, Any]], cfg: DictConfig,
                 grader: GraderChoice | None = None) -> str:
    """Who graded the SWE predictions; after local grading, how to run the official harness."""
    swe = report.get("swe", {})
    files = swe.get("predictions") or []
    if not files:
        return ""
    lines = [grader.describe()] if grader else []
    lines.append(f"SWE predictions (swebench format): {', '.join(files)}")
    if swe.get("grader") == "swebench":
        lines.append(f"official harness reports: {Path(files[0]).parent / 'swebench'}")
        return "\n".join(lines) + "\n"
    lines.append("to grade them with the official harness (needs `pip install swebench` and Docker; "
                 "or set eval.benchmarks.swe.grader=swebench):")
    dataset = harness_settings(cfg).dataset_name or swe_path(cfg)
    lines += [f"  python -m swebench.harness.run_evaluation --dataset_name {dataset} "
              f"--predictions_path {f} --run_id {Path(f).stem}" for f in files]
    return "\n".join(lines) + "\n"


def grade_predictions(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """Grade the file ``eval.predictions`` with the SWE benchmark's grader; no model needed.

    Raises:
        EvalError: the SWE benchmark is disabled, the file or the instances file is missing.
        RunFailedError: no instance could be graded (after the report is written).
    """
    swe = swe_path(cfg)
    if swe is None:
        raise EvalError("eval.predictions grades SWE-bench predictions against "
                        "eval.benchmarks.swe; set eval.benchmarks.swe.enabled=true.")
    path = _check_path(cfg.eval.predictions, "eval.predictions", folder=False)
    grader = swe_grader(cfg, swe)
    print(grader.describe(), flush=True)
    out_dir = Path(str(cfg.eval.out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    # the tokenizer renders episodes only; grading a given patch runs none
    bench = swe_benchmark(cfg, swe, ByteTokenizer(), grader)
    report = asyncio.run(grade_predictions_async(bench, path, out_dir))
    errors = report["swe"]["prediction_errors"]
    for line in errors:
        print(f"not graded: {line}", flush=True)
    print(markdown_table(report, [1]), end="", flush=True)
    print(f"results: {out_dir}/report.json, report.md", flush=True)
    if not report["swe"]["num_scored"]:
        raise RunFailedError(f"no prediction in {path} could be graded ({len(errors)} line(s) not "
                             "graded, listed above; instance errors in the table). Fix the file and rerun.")
    return report


def run(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """Evaluate as configured; returns the report (see ``rl.evaluation.evaluate``).

    With ``eval.predictions`` set: ``grade_predictions`` instead (no model).

    Raises:
        EvalError, TaskError, SandboxError, AgentServerError: bad input (files, options,
        an unreachable router); the serving stack's errors (engines, model) when it
        cannot start.
        RunFailedError: no problem could be scored (after the report is written).
    """
    settings = check_config(cfg)
    if cfg.eval.predictions:
        return grade_predictions(cfg)
    router_url = router_url_of(cfg)
    single_turn = single_turn_benchmarks(cfg)
    swe = swe_path(cfg)
    grader = swe_grader(cfg, swe) if swe is not None else None
    out_dir = Path(str(cfg.eval.out_dir))
    # every check first: a refused command prints its one error line and writes nothing
    if router_url:
        model = cfg.eval.served_model_name or str(cfg.model.name)
        check_router(router_url, model)
    else:
        from rollout.serve import ServingStack, stop_on_sigterm

        stack = ServingStack(cfg, Path(str(cfg.run_dir)))
        stack.check()  # (Hydra's files are removed on a refusal)
    if grader is not None:
        print(grader.describe(), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if router_url:
        tokenizer = cfg.eval.tokenizer
        if tokenizer is None and swe is not None:
            from rollout.model import resolve_model_path
            tokenizer = resolve_model_path(cfg.model)
        report = evaluate(benchmarks_of(cfg, tokenizer, single_turn, grader), router_url,
                          model, settings, out_dir, progress=bool(cfg.eval.progress))
    else:
        stop_on_sigterm()
        with stack:
            report = evaluate(benchmarks_of(cfg, cfg.eval.tokenizer or stack.model_path, single_turn,
                                            grader),
                              stack.router_url, stack.served_model_name, settings, out_dir,
                              progress=bool(cfg.eval.progress))
    print(markdown_table(report, list(settings.ks)), end="", flush=True)
    print(harness_hint(report, cfg, grader), end="")
    print(f"results: {out_dir}/report.json, report.md, passk.png", flush=True)
    if cfg.eval.wandb.run:
        log_wandb(cfg, report, out_dir)
    if not any(r["num_scored"] for r in report.values()):
        raise RunFailedError("no problem could be scored: every one ended in an error (listed above), "
                        "so nothing was measured. Fix the cause and rerun on the same "
                        f"eval.out_dir={out_dir} to draw the errored samples again.")
    return report


@hydra_entry("eval")
def main(cfg: DictConfig) -> None:
    """``python -m rl.eval``: see the module docstring."""
    run(cfg)


if __name__ == "__main__":
    main()
