"""Finished samples on disk, and the report built from them.

Resumability: every graded sample is appended, as one JSON line keyed by
``<benchmark>/<problem_id>#<sample_index>``, to ``samples.jsonl`` and flushed at once. On
start the file is read back and those keys are not sampled again; a line cut short by a
kill is skipped (that sample is simply drawn again). A key holds one result, so nothing
is counted twice: the first pass/fail record of a key wins; an ``ungraded`` record (drawn,
to be graded in a batch) is replaced by its graded record, and is not drawn again; an
``error`` record is replaced by a later record of the same key when errored samples are
retried.

Report: per benchmark, pass@k and pass^k for each k with their 95% intervals over
problems (``rl.passk``), counts of scored and errored problems, and every per-problem
result; as ``report.json``, a markdown table ``report.md`` and a bar plot ``passk.png``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from rl.evaluation.base import (ERROR, PASS, UNGRADED, EvalError, EvalProblem, SampleResult,
                                sample_key)
from rl.passk import summarize

log = logging.getLogger("rl.eval")


class ResultsLog:
    """The append-only JSONL of finished samples.

    Args:
        path: the file (created with its folder when missing).
        replace_errors: an ``error`` result does not count as finished (``has`` is False
            for it), and a later result of the same key replaces it.

    Attributes:
        results: key -> SampleResult of every finished sample read or written.
        skipped_lines: lines that could not be read back (cut short or malformed).
    """

    def __init__(self, path: str | Path, replace_errors: bool = False) -> None:
        self.path = Path(path)
        self.replace_errors = replace_errors
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, SampleResult] = {}
        self.skipped_lines = 0
        if self.path.exists():
            self._read()
        self._file = open(self.path, "a", encoding="utf-8")
        if self._file.tell() > 0 and not self.path.read_bytes().endswith(b"\n"):
            self._file.write("\n")  # a kill cut the last line: start the next on its own

    def _read(self) -> None:
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    result = SampleResult.from_dict(json.loads(line))
                except (ValueError, KeyError, TypeError) as e:
                    self.skipped_lines += 1
                    log.warning("%s:%d: unreadable sample record skipped (%s); it is sampled again",
                                self.path, lineno, e)
                    continue
                if self._replaceable(result.key):
                    self.results[result.key] = result

    def _redraw(self, old: SampleResult | None) -> bool:
        return old is None or (self.replace_errors and old.outcome == ERROR)

    def _replaceable(self, key: str) -> bool:
        old = self.results.get(key)
        return self._redraw(old) or old.outcome == UNGRADED

    def has(self, benchmark: str, problem_id: str, sample_index: int) -> bool:
        """True when that sample is drawn (an error counts only without ``replace_errors``;
        an ungraded sample counts: it is graded, not drawn again)."""
        return not self._redraw(self.results.get(sample_key(benchmark, problem_id, sample_index)))

    def append(self, result: SampleResult) -> None:
        """Record one finished sample (ignored when its key already holds a final result)."""
        if not self._replaceable(result.key):
            return
        self.results[result.key] = result
        self._file.write(json.dumps(result.to_dict()) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> "ResultsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_settings(path: Path, settings: dict[str, Any]) -> None:
    """Write ``settings`` to ``path`` or check it matches what an earlier run wrote there.

    Samples drawn with another model or other sampling settings must not be mixed into
    one figure, so a results folder is tied to the settings it was started with.

    Raises:
        EvalError: the folder holds results made with different settings.
    """
    if path.exists():
        try:
            before = json.loads(path.read_text())
        except ValueError:
            before = None
        if before != settings:
            diff = sorted(k for k in set(settings) | set(before or {})
                          if (before or {}).get(k) != settings.get(k))
            raise EvalError(f"results folder {path.parent} was started with other settings "
                            f"({', '.join(diff)} differ); use a new eval.out_dir, or delete the "
                            "folder to start over.")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2, sort_keys=True))


@dataclass(frozen=True)
class ProblemSummary:
    """One problem's samples.

    Attributes:
        problem_id: the problem.
        n: samples graded (pass or fail).
        c: samples that passed.
        errors: messages of errored samples, or of the problem itself.
    """

    problem_id: str
    n: int
    c: int
    errors: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        """The problem is left out of pass@k (it or one of its samples errored)."""
        return bool(self.errors)


def summarize_problems(problems: Iterable[EvalProblem], results: dict[str, SampleResult],
                       benchmark: str, n: int) -> list[ProblemSummary]:
    """Per-problem counts from the first ``n`` samples of each problem.

    A problem counts as an error (left out of pass@k, listed with its messages) when it
    is malformed, when one of its samples errored, or when fewer than ``n`` samples are
    finished or graded (an interrupted run): a figure is never made from part of a
    problem's samples.
    """
    out = []
    for p in problems:
        if p.error:
            out.append(ProblemSummary(p.problem_id, 0, 0, (p.error,)))
            continue
        drawn = [results[k] for i in range(n)
                 if (k := sample_key(benchmark, p.problem_id, i)) in results]
        done = [r for r in drawn if r.outcome != UNGRADED]
        errors = tuple(f"sample {r.sample_index}: {r.error}" for r in done if r.outcome == ERROR)
        if len(drawn) > len(done):
            errors += (f"{len(drawn) - len(done)} sample(s) drawn but not graded yet "
                       "(rerun on the same eval.out_dir to grade them)",)
        if len(drawn) < n:
            errors += (f"only {len(drawn)} of {n} samples finished",)
        graded = [r for r in done if r.outcome != ERROR]
        out.append(ProblemSummary(p.problem_id, len(graded), sum(r.outcome == PASS for r in graded),
                                  errors))
    return out


def benchmark_report(summaries: list[ProblemSummary], ks: list[int], n: int) -> dict[str, Any]:
    """pass@k / pass^k over the scored problems, plus counts and the per-problem rows.

    Returns:
        ``{"num_problems", "num_scored", "num_errors", "n", "metrics": {"pass@1":
        {"mean", "ci_low", "ci_high", "num_problems"}, ...}, "problems": [...]}``;
        ``metrics`` is empty when no problem could be scored.
    """
    scored = [s for s in summaries if not s.is_error]
    metrics = {name: est.to_dict()
               for name, est in summarize([(s.n, s.c) for s in scored], ks).items()} if scored else {}
    return {
        "num_problems": len(summaries), "num_scored": len(scored),
        "num_errors": len(summaries) - len(scored), "n": n, "metrics": metrics,
        "problems": [{"problem_id": s.problem_id, "n": s.n, "c": s.c,
                      "status": "error" if s.is_error else "scored", "errors": list(s.errors)}
                     for s in summaries],
    }


def _fmt(m: dict[str, Any] | None) -> str:
    if not m:
        return "-"
    if m["ci_low"] is None:
        return f"{m['mean']:.3f}"
    return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"


def markdown_table(report: dict[str, dict[str, Any]], ks: list[int]) -> str:
    """One row per benchmark: problems scored/errored, then pass@k and pass^k with 95% CI."""
    cols = [f"pass@{k}" for k in ks] + [f"pass^{k}" for k in ks]
    lines = ["| benchmark | problems | scored | errors | n | " + " | ".join(cols) + " |",
             "|---|---:|---:|---:|---:|" + "---|" * len(cols)]
    for name, r in report.items():
        cells = [_fmt(r["metrics"].get(c)) for c in cols]
        lines.append(f"| {name} | {r['num_problems']} | {r['num_scored']} | {r['num_errors']} "
                     f"| {r['n']} | " + " | ".join(cells) + " |")
    errored = [(name, p) for name, r in report.items() for p in r["problems"] if p["errors"]]
    if errored:
        lines += ["", "Errors (left out of the figures):", ""]
        lines += [f"- {name} {p['problem_id']}: {'; '.join(p['errors'])}" for name, p in errored]
    return "\n".join(lines) + "\n"


def plot_passk(report: dict[str, dict[str, Any]], ks: list[int], path: Path) -> None:
    """Bar plot of pass@k per benchmark with 95% interval whiskers (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [n for n, r in report.items() if r["metrics"]]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(names) * len(ks) ** 0.5), 3.2))
    width = 0.8 / max(1, len(ks))
    for j, k in enumerate(ks):
        ms = [report[n]["metrics"][f"pass@{k}"] for n in names]
        means = np.array([m["mean"] for m in ms])
        lo = np.array([m["mean"] - (m["ci_low"] if m["ci_low"] is not None else m["mean"]) for m in ms])
        hi = np.array([(m["ci_high"] if m["ci_high"] is not None else m["mean"]) - m["mean"] for m in ms])
        ax.bar(np.arange(len(names)) + j * width, means, width, yerr=np.vstack([lo, hi]).tolist(), capsize=3,
               label=f"pass@{k}")
    ax.set_xticks(np.arange(len(names)) + width * (len(ks) - 1) / 2, names)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@k (95% CI over problems)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def flat_metrics(report: dict[str, dict[str, Any]], prefix: str = "eval") -> dict[str, float]:
    """``{"eval/gsm8k/pass@1": 0.12, "eval/gsm8k/num_errors": 0, ...}`` for loggers."""
    out: dict[str, float] = {}
    for name, r in report.items():
        for metric, m in r["metrics"].items():
            out[f"{prefix}/{name}/{metric}"] = m["mean"]
        for count in ("num_scored", "num_errors"):
            out[f"{prefix}/{name}/{count}"] = r[count]
    return out
