"""Grade an existing SWE-bench predictions file: no model, no engine, no router.

A predictions file is JSONL, one line per instance, in the official harness's format (the
``swe_predictions.sample<j>.jsonl`` files an evaluation writes)::

    {"instance_id": "handmade__stats_mean", "model_name_or_path": "m", "model_patch": "diff ..."}

Each usable line becomes one sample (index 0) of its instance, graded by the benchmark's
grader (``SweBenchmark.grade_pending``: the local sandbox or the official harness) and
written to the same results files as a sampled evaluation (``samples.jsonl``,
``report.json``, ``report.md``, ``swe_predictions.sample0.jsonl``). Only the instances
the file names are reported. A line that cannot be graded never stops the others: a line
that is not a JSON object, lacks ``instance_id``, names an instance the instances file
does not hold, or repeats one is listed under ``prediction_errors`` in the report; a line
of a known instance whose ``model_patch`` is missing or not text is that instance's error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.evaluation.base import ERROR, UNGRADED, EvalError, SampleResult
from rl.evaluation.results import ResultsLog, benchmark_report, check_settings, summarize_problems
from rl.evaluation.runner import EvalSettings, grade_ungraded, graded_by, write_report
from rl.evaluation.swe import SweBenchmark, write_predictions


@dataclass
class Predictions:
    """The lines of a predictions file, read.

    Attributes:
        patches: instance_id -> the model's patch, or None where the line had no usable
            ``model_patch`` (see ``patch_errors``).
        patch_errors: instance_id -> why its line cannot be graded.
        line_errors: ``<file>:<line>: <why>`` for each line not attributable to an instance.
        model: the ``model_name_or_path`` of the lines (the file's stem where none or several).
    """

    patches: dict[str, str | None] = field(default_factory=dict)
    patch_errors: dict[str, str] = field(default_factory=dict)
    line_errors: list[str] = field(default_factory=list)
    model: str = ""


def read_predictions(path: str | Path, known_ids: set[str]) -> Predictions:
    """Read a predictions file against the instance ids of the instances file.

    Raises:
        EvalError: the file does not exist or cannot be read as UTF-8 text.
    """
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"eval.predictions={path}: file {p} does not exist; give a JSONL of "
                        "{instance_id, model_name_or_path, model_patch} lines.")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise EvalError(f"eval.predictions={path}: cannot read it as UTF-8 text ({e}).") from None
    out, models = Predictions(), set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p.name}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            out.line_errors.append(f"{where}: not JSON ({e.msg})")
            continue
        iid = row.get("instance_id") if isinstance(row, dict) else None
        if not isinstance(iid, str) or not iid:
            out.line_errors.append(f"{where}: no instance_id (each line is a JSON object with "
                                   "instance_id, model_name_or_path, model_patch)")
            continue
        if iid not in known_ids:
            out.line_errors.append(f"{where}: unknown instance_id {iid!r} (not in the instances file)")
            continue
        if iid in out.patches:
            out.line_errors.append(f"{where}: instance_id {iid!r} repeats an earlier line (that one is graded)")
            continue
        patch = row.get("model_patch")
        if isinstance(patch, str):
            out.patches[iid] = patch
        else:
            out.patches[iid] = None
            out.patch_errors[iid] = (f"{where}: model_patch is missing or not text "
                                     f"({type(patch).__name__}); give the patch as a string")
        if isinstance(row.get("model_name_or_path"), str):
            models.add(row["model_name_or_path"])
    out.model = models.pop() if len(models) == 1 else p.stem
    return out


async def grade_predictions_async(bench: SweBenchmark, path: str | Path, out_dir: str | Path,
                                  run_id: str = "eval") -> dict[str, dict[str, Any]]:
    """Grade the predictions file at ``path`` with ``bench``'s grader into ``out_dir``.

    A rerun on the same ``out_dir`` grades only what is not graded yet.

    Returns:
        ``{bench.name: report}`` as ``evaluate`` returns it (n = 1, k = 1), the report with
        ``predictions``, ``grader``, ``graded_by`` and ``prediction_errors`` (the lines
        that could not be graded).

    Raises:
        EvalError: the file is missing or unreadable, or ``out_dir`` holds results of
            another model or predictions file.
    """
    out = Path(out_dir)
    problems = {p.problem_id: p for p in await bench.problems()}
    preds = read_predictions(path, set(problems))
    settings = EvalSettings(n=1, ks=(1,), run_id=run_id)
    check_settings(out / "settings.json", {"model": preds.model, "predictions": str(Path(path).resolve())})
    with ResultsLog(out / "samples.jsonl", replace_errors=True) as results:
        for iid, patch in preds.patches.items():
            if results.has(bench.name, iid, 0):
                continue
            if patch is None:
                results.append(SampleResult(bench.name, iid, 0, ERROR, error=preds.patch_errors[iid]))
            else:
                results.append(SampleResult(bench.name, iid, 0, UNGRADED, answer=patch,
                                            detail={"source": str(path)}))
        try:
            await grade_ungraded(bench, results, preds.model, out, run_id)
        finally:
            await bench.aclose()
        graded = [problems[iid] for iid in preds.patches]
        report = benchmark_report(summarize_problems(graded, results.results, bench.name, 1), [1], 1)
        report["predictions"] = [str(p) for p in write_predictions(
            results.results.values(), preds.model, out, bench.name)]
        report["grader"] = bench.grader
        report["graded_by"] = graded_by(results.results.values(), bench.name)
        report["prediction_errors"] = preds.line_errors
    write_report({bench.name: report}, settings, preds.model, out)
    return {bench.name: report}
