"""``evaluate``: draw n samples per problem through a running router, grade, report pass@k.

This is the library function both ``python -m rl.eval`` and the trainer call (the
trainer passes its own router URL every N iterations)::

    report = evaluate([gsm8k_benchmark(path, limit=20)], router_url, "smollm2-135m",
                      EvalSettings(n=4, ks=(1, 2, 4)), out_dir=run_dir / "eval" / "it0100")
    report["gsm8k"]["metrics"]["pass@1"]["mean"]

Samples run concurrently (``EvalSettings.concurrency``), each finished one is appended to
``<out_dir>/samples.jsonl`` at once, and a rerun on the same folder draws only what is
missing (``rl.evaluation.results``). Samples a benchmark records ``ungraded`` (SWE with
the official harness) are graded after sampling by its ``grade_pending`` and appended too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from rl.evaluation.base import (ERROR, UNGRADED, Benchmark, EvalError, EvalProblem, SampleContext,
                                SampleResult)
from rl.evaluation.results import (ResultsLog, benchmark_report, check_settings, markdown_table,
                                   plot_passk, summarize_problems)
from rl.evaluation.swe import SweBenchmark, write_predictions
from rollout.client import RolloutClient

log = logging.getLogger("rl.eval")


@dataclass(frozen=True)
class EvalSettings:
    """How many samples, which k, how to sample.

    Attributes:
        n: samples per problem.
        ks: budgets k of pass@k and pass^k; each in 1..n.
        temperature, top_p: sampling settings of every model call.
        max_tokens: completion budget of a single-turn sample (math, code).
        seed: base seed of the per-sample seeds.
        request_seeds: send each sample's seed with its model calls. Off for vLLM CPU
            engines: vLLM 0.32 on CPU kills the engine core when a seeded request's sampled
            token is discarded in a chunked prefill ("CPU Generator does not use offset").
        concurrency: samples in flight at once.
        retry_errors: on a rerun, draw again the samples that ended in an error.
        request_timeout_s: limit of one single-turn model call (router hold, queue and
            generation); a call that exceeds it makes its sample an ``error``.
        run_id: prefix of the session ids (X-Session-Id) of this evaluation.
    """

    n: int = 1
    ks: tuple[int, ...] = (1,)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int = 0
    request_seeds: bool = True
    concurrency: int = 8
    retry_errors: bool = True
    request_timeout_s: float = 600.0
    run_id: str = "eval"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise EvalError(f"eval.n={self.n}: need at least 1 sample per problem.")
        bad = [k for k in self.ks if not 1 <= k <= self.n]
        if not self.ks or bad:
            raise EvalError(f"eval.ks={list(self.ks)}: every k must be in 1..n={self.n} "
                            "(pass@k needs k samples); raise eval.n or drop those k.")
        if self.concurrency < 1:
            raise EvalError(f"eval.concurrency={self.concurrency}: must be >= 1.")
        if self.temperature < 0:
            raise EvalError(f"eval.temperature={self.temperature}: must be >= 0.")
        if not 0 < self.top_p <= 1:
            raise EvalError(f"eval.top_p={self.top_p}: must be in (0, 1].")
        if self.max_tokens < 1:
            raise EvalError(f"eval.max_tokens={self.max_tokens}: must be >= 1.")
        if self.request_timeout_s <= 0:
            raise EvalError(f"eval.request_timeout_s={self.request_timeout_s}: must be > 0.")

    def sampling(self) -> dict[str, Any]:
        """The settings that change what a sample is (a results folder is tied to them)."""
        return {"temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens, "seed": self.seed if self.request_seeds else None}


async def _one(bench: Benchmark, problem: EvalProblem, i: int, ctx: SampleContext,
               sem: asyncio.Semaphore) -> SampleResult:
    async with sem:
        try:
            return await bench.sample(problem, i, ctx)
        except Exception as e:  # a bug or a surprise in one instance must not stop the rest
            log.warning("%s %s sample %d: %s: %s", bench.name, problem.problem_id, i,
                        type(e).__name__, e)
            return SampleResult(bench.name, problem.problem_id, i, ERROR,
                                error=f"{type(e).__name__}: {e}")


async def evaluate_async(benchmarks: Sequence[Benchmark], router_url: str, model: str,
                         settings: EvalSettings, out_dir: str | Path | None = None,
                         progress: bool = True) -> dict[str, dict[str, Any]]:
    """Evaluate ``benchmarks`` through the router at ``router_url``; see ``evaluate``."""
    if not benchmarks:
        raise EvalError("no benchmark selected; enable at least one under eval.benchmarks.")
    names = [b.name for b in benchmarks]
    if len(set(names)) != len(names):
        raise EvalError(f"benchmark names repeat: {names}")
    tmp = tempfile.TemporaryDirectory(prefix="eval-") if out_dir is None else None
    out = Path(tmp.name if tmp else out_dir)
    check_settings(out / "settings.json", {"model": model, **settings.sampling()})
    problems = {b.name: await b.problems() for b in benchmarks}
    client = RolloutClient(router_url, model, timeout_s=settings.request_timeout_s)
    ctx = SampleContext(client, router_url, model, settings.temperature, settings.top_p,
                        settings.max_tokens, settings.seed if settings.request_seeds else None, settings.run_id)
    sem = asyncio.Semaphore(settings.concurrency)
    with ResultsLog(out / "samples.jsonl", replace_errors=settings.retry_errors) as results:
        todo = [(b, p, i) for b in benchmarks for p in problems[b.name] if not p.error
                for i in range(settings.n)
                if not results.has(b.name, p.problem_id, i)]
        bar = tqdm(total=len(todo), desc="eval samples", unit="sample", disable=not progress)
        tasks = [asyncio.ensure_future(_one(b, p, i, ctx, sem)) for b, p, i in todo]
        try:
            for next_done in asyncio.as_completed(tasks):
                result = await next_done
                results.append(result)
                bar.update(1)
                bar.set_postfix_str(f"{result.benchmark} {result.outcome}")
            for b in benchmarks:
                await grade_ungraded(b, results, model, out, settings.run_id)
        finally:
            # stopped early (SIGTERM, Ctrl-C, an error): the samples still in flight are
            # cancelled and waited for before their client closes, so none fails afterwards
            # with an exception nobody retrieves (asyncio prints those as a traceback)
            left = [t for t in tasks if not t.done()]
            for t in left:
                t.cancel()
            if left:
                await asyncio.gather(*left, return_exceptions=True)
            bar.close()
            await client.aclose()
            for b in benchmarks:
                await b.aclose()
        report = {b.name: benchmark_report(
            summarize_problems(problems[b.name], results.results, b.name, settings.n),
            list(settings.ks), settings.n) for b in benchmarks}
        for b in benchmarks:
            if isinstance(b, SweBenchmark):
                report[b.name]["predictions"] = [
                    str(p) for p in write_predictions(results.results.values(), model, out, b.name)]
                report[b.name]["grader"] = b.grader
                report[b.name]["graded_by"] = graded_by(results.results.values(), b.name)
    write_report(report, settings, model, out)
    if tmp is not None:
        tmp.cleanup()
    return report


async def grade_ungraded(bench: Benchmark, results: ResultsLog, model: str, out: Path,
                         run_id: str) -> None:
    """Grade the benchmark's ``ungraded`` samples (its ``grade_pending``) and record them."""
    pending = [r for r in results.results.values()
               if r.benchmark == bench.name and r.outcome == UNGRADED]
    grade = getattr(bench, "grade_pending", None)
    if not pending or grade is None:
        return
    log.info("%s: grading %d drawn samples", bench.name, len(pending))
    try:
        graded = await grade(pending, model, out, run_id)
    except Exception as e:  # a grader that breaks makes its samples errors, not the run stop
        log.warning("%s: grading failed: %s: %s", bench.name, type(e).__name__, e)
        graded = [SampleResult(r.benchmark, r.problem_id, r.sample_index, ERROR, r.answer, r.detail,
                               f"grading failed: {type(e).__name__}: {e}") for r in pending]
    for r in graded:
        results.append(r)


def graded_by(results, benchmark: str) -> dict[str, int]:
    """How many samples of ``benchmark`` each grader graded (``detail["grader"]``)."""
    counts: dict[str, int] = {}
    for r in results:
        if r.benchmark == benchmark and r.outcome != UNGRADED and "grader" in r.detail:
            counts[r.detail["grader"]] = counts.get(r.detail["grader"], 0) + 1
    return counts


def write_report(report: dict[str, dict[str, Any]], settings: EvalSettings, model: str,
                 out_dir: Path) -> None:
    """``report.json`` (settings, figures, every per-problem result), ``report.md``
    (the table) and ``passk.png`` (the plot) in ``out_dir``."""
    ks = list(settings.ks)
    (out_dir / "report.json").write_text(json.dumps(
        {"model": model, "settings": asdict(settings), "benchmarks": report}, indent=2))
    (out_dir / "report.md").write_text(markdown_table(report, ks))
    if any(r["metrics"] for r in report.values()):
        plot_passk(report, ks, out_dir / "passk.png")


def evaluate(benchmarks: Sequence[Benchmark], router_url: str, model: str,
             settings: EvalSettings, out_dir: str | Path | None = None,
             progress: bool = True) -> dict[str, dict[str, Any]]:
    """Draw ``settings.n`` samples per problem of each benchmark, grade them, report pass@k.

    Args:
        benchmarks: e.g. ``[gsm8k_benchmark(...), HumanEvalBenchmark(limit=20), SweBenchmark(...)]``.
        router_url: base URL of the running router (or one engine), without ``/v1``.
        model: the served model name.
        settings: n, ks, sampling, concurrency.
        out_dir: results folder (resumable: rerunning on it draws only missing samples);
            None = a temporary folder, removed afterwards.
        progress: show a progress bar.

    Returns:
        benchmark name -> ``results.benchmark_report`` dict (``metrics`` with pass@k and
        pass^k for each k and their 95% intervals, ``num_scored``, ``num_errors``,
        ``problems``; for SWE benchmarks ``predictions`` files, ``grader`` (this run's) and
        ``graded_by`` (samples per grader, when a results folder was continued with another)).

    Raises:
        EvalError: bad settings, a benchmark file missing, or ``out_dir`` holding results
            made with another model or other sampling settings.
    """
    return asyncio.run(evaluate_async(benchmarks, router_url, model, settings, out_dir, progress))
