"""Grading SWE predictions with the official SWE-bench harness (Docker), and choosing it.

``eval.benchmarks.swe.grader`` says who grades the episodes' patches:

- ``local``: SWE-bench's resolved rule run here in the sandbox (``rl.evaluation.swe``).
- ``swebench``: the official harness, ``python -m swebench.harness.run_evaluation``, which
  builds one Docker image per instance and runs its tests there. Needs the ``swebench``
  package, a Docker daemon that answers, and instances the harness knows (a SWE-bench
  dataset, or a JSONL of its rows: ``repo`` and ``version`` in its specs table).
- ``auto``: ``swebench`` when all of that holds, else ``local``; the output says which.

The harness is run once per sample index j on the predictions of that index, with
``--run_id <run_id>.sample<j>`` and its working folder ``<out_dir>/swebench/``; its
summary ``<model>.<run_id>.json`` (SWE-bench's run report: ``resolved_ids``,
``unresolved_ids``, ``empty_patch_ids``, ``error_ids``, ...) and per-instance
``logs/run_evaluation/<run_id>/<model>/<instance_id>/report.json`` are read back into
one ``SampleResult`` per prediction. A rerun with the same run id skips the instances
the harness already finished (it keeps their reports). Outcomes: resolved -> ``pass``;
unresolved or empty patch -> ``fail``; a patch the harness could not apply -> ``fail``
(the model's fault, as in local grading); any other harness error or a prediction with
no result -> ``error`` (the instance or the harness failed, not the model).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from rl.evaluation.base import ERROR, FAIL, PASS, EvalError, SampleResult

log = logging.getLogger("rl.eval")

GRADERS = ("auto", "local", "swebench")
"""Values of ``eval.benchmarks.swe.grader``."""

APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
"""What the harness writes to an instance's ``run_instance.log`` when the patch does not apply."""


@dataclass(frozen=True)
class HarnessSettings:
    """How the official harness is run.

    Attributes:
        dataset_name: its ``--dataset_name``: a hub id (``SWE-bench/SWE-bench_Lite``) or a
            local JSON/JSONL of SWE-bench rows; None = the instances file of the benchmark.
        split: its ``--split``.
        max_workers: its ``--max_workers`` (instances graded at once).
        timeout_s: its ``--timeout``: the limit of one instance's test run, in seconds.
        python: the interpreter that runs it (the evaluating one by default).
    """

    dataset_name: str | None = None
    split: str = "test"
    max_workers: int = 4
    timeout_s: int = 1800
    python: str = sys.executable


@dataclass(frozen=True)
class GraderChoice:
    """The grader chosen for a run and why.

    Attributes:
        grader: ``local`` or ``swebench``.
        reason: one line for the output (``auto: no working Docker (...)``).
    """

    grader: str
    reason: str

    def describe(self) -> str:
        """``SWE grading: <who> (<reason>)`` for the output."""
        who = ("official swebench harness (Docker)" if self.grader == "swebench"
               else "local sandbox (SWE-bench's resolved rule)")
        return f"SWE grading: {who}; {self.reason}"


def docker_works(timeout_s: float = 20.0) -> tuple[bool, str]:
    """Whether ``docker info`` answers (a daemon runs and this user may use it).

    Returns:
        (works, why not: '' when it works).
    """
    try:
        proc = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return False, "no docker command"
    except subprocess.TimeoutExpired:
        return False, f"`docker info` did not answer within {timeout_s:.0f} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"`docker info` failed: {last[:200]}"
    return True, ""


def unknown_to_harness(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Instance ids whose ``repo``/``version`` the installed harness has no specs for.

    Raises:
        ImportError: ``swebench`` is not installed.
    """
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    out = []
    for row in rows:
        specs = MAP_REPO_VERSION_TO_SPECS.get(str(row.get("repo")), {})
        if str(row.get("version")) not in specs:
            out.append(str(row.get("instance_id", "?")))
    return out


def harness_unavailable(instances_path: str | Path | None, settings: HarnessSettings) -> str:
    """Why the official harness cannot grade these instances here ('' when it can).

    Checks, cheapest first: the ``swebench`` package, a working Docker, and (when the
    harness is to read the instances file itself) that it knows every instance's repo
    and version.
    """
    if importlib.util.find_spec("swebench") is None:
        return "the swebench package is not installed (pip install swebench)"
    works, why = docker_works()
    if not works:
        return f"no working Docker ({why})"
    if settings.dataset_name is None and instances_path is not None:
        rows = []
        for line in Path(instances_path).read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a malformed line is reported as that instance's error
        unknown = unknown_to_harness(r for r in rows if isinstance(r, dict))
        if unknown:
            return (f"{len(unknown)} instance(s) are not SWE-bench instances the harness knows "
                    f"(repo/version without specs: {', '.join(unknown[:3])}); set "
                    "eval.benchmarks.swe.harness.dataset_name to their SWE-bench dataset")
    return ""


def choose_grader(requested: str, unavailable: Callable[[], str]) -> GraderChoice:
    """The grader for ``eval.benchmarks.swe.grader=requested``.

    Args:
        requested: ``auto``, ``local`` or ``swebench``.
        unavailable: returns why the official harness cannot run here ('' when it can);
            called only when it matters (``harness_unavailable`` bound to the run).

    Raises:
        EvalError: an unknown value, or ``swebench`` asked for where it cannot run.
    """
    if requested not in GRADERS:
        raise EvalError(f"eval.benchmarks.swe.grader={requested!r}: must be one of "
                        f"{', '.join(GRADERS)}.")
    if requested == "local":
        return GraderChoice("local", "asked for (eval.benchmarks.swe.grader=local)")
    why = unavailable()
    if requested == "swebench":
        if why:
            raise EvalError(f"eval.benchmarks.swe.grader=swebench: the official harness cannot "
                            f"run here: {why}. Use eval.benchmarks.swe.grader=local (or auto) to "
                            "grade in the sandbox.")
        return GraderChoice("swebench", "asked for (eval.benchmarks.swe.grader=swebench)")
    if why:
        return GraderChoice("local", f"auto: the official harness is not available ({why})")
    return GraderChoice("swebench", "auto: the swebench package and a working Docker are present")


def harness_command(predictions_path: Path, dataset_name: str, run_id: str,
                    instance_ids: list[str], settings: HarnessSettings) -> list[str]:
    """The argv of one ``swebench.harness.run_evaluation`` run."""
    return [settings.python, "-m", "swebench.harness.run_evaluation",
            "--dataset_name", dataset_name, "--split", settings.split,
            "--predictions_path", str(predictions_path), "--run_id", run_id,
            "--max_workers", str(settings.max_workers), "--timeout", str(settings.timeout_s),
            "--instance_ids", *instance_ids]


def model_dir_name(model: str) -> str:
    """How the harness names a model in file and folder names (``/`` -> ``__``)."""
    return model.replace("/", "__")


def report_path(workdir: Path, model: str, run_id: str) -> Path:
    """Where the harness writes its summary report (its working folder)."""
    return workdir / f"{model_dir_name(model)}.{run_id}.json"


def instance_log_dir(workdir: Path, model: str, run_id: str, instance_id: str) -> Path:
    """The harness's folder of one instance (``report.json``, ``run_instance.log``)."""
    return workdir / "logs" / "run_evaluation" / run_id / model_dir_name(model) / instance_id


async def run_harness(predictions_path: Path, dataset_name: str, run_id: str,
                      instance_ids: list[str], workdir: Path, settings: HarnessSettings) -> tuple[int, Path]:
    """Run the official harness once, in ``workdir``; its output goes to a log file.

    Returns:
        (exit code, the log file).
    """
    log_file = workdir / f"harness.{run_id}.log"
    cmd = harness_command(predictions_path, dataset_name, run_id, instance_ids, settings)
    log.info("grading %d predictions with the swebench harness: %s (log: %s)",
             len(instance_ids), " ".join(cmd[:12]), log_file)
    with open(log_file, "ab") as out:
        proc = await asyncio.create_subprocess_exec(*cmd, cwd=str(workdir), stdout=out,
                                                    stderr=subprocess.STDOUT)
        rc = await proc.wait()
    return rc, log_file


def read_harness_report(workdir: Path, model: str, run_id: str,
                        pending: list[SampleResult], harness_log: Path | None = None
                        ) -> list[SampleResult]:
    """Turn the harness's reports into one graded result per pending prediction.

    Args:
        workdir: the harness's working folder (summary report and ``logs/``).
        model: ``model_name_or_path`` of the predictions.
        run_id: the harness run id.
        pending: the ungraded results of one sample index (their ``answer`` is the patch).
        harness_log: the harness's own output, named in error messages.

    Returns:
        The results with ``pass``/``fail``/``error`` outcomes (see the module docstring);
        ``detail`` gains ``grader: swebench``, the harness run id and, where the
        instance's report has them, its ``tests_status``.
    """
    summary_file = report_path(workdir, model, run_id)
    see = f"see {harness_log}" if harness_log else f"see {workdir}"
    summary: dict[str, Any] = {}
    summary_error = ""
    try:
        summary = json.loads(summary_file.read_text())
    except FileNotFoundError:
        summary_error = f"the swebench harness wrote no report {summary_file}; {see}"
    except ValueError as e:
        summary_error = f"the swebench harness report {summary_file} is not JSON ({e}); {see}"
    ids = {key: set(summary.get(key) or ()) for key in
           ("resolved_ids", "unresolved_ids", "empty_patch_ids", "error_ids")}
    out = []
    for r in pending:
        iid = r.problem_id
        inst_dir = instance_log_dir(workdir, model, run_id, iid)
        detail = {**r.detail, "grader": "swebench", "harness_run_id": run_id}
        inst = _instance_report(inst_dir / "report.json", iid)
        if inst is not None and "tests_status" in inst:
            detail["tests_status"] = inst["tests_status"]
        base = dict(benchmark=r.benchmark, problem_id=iid, sample_index=r.sample_index,
                    answer=r.answer)
        if summary_error:
            out.append(SampleResult(**base, outcome=ERROR, detail=detail, error=summary_error))
        elif iid in ids["resolved_ids"]:
            out.append(SampleResult(**base, outcome=PASS, detail=detail))
        elif iid in ids["unresolved_ids"]:
            out.append(SampleResult(**base, outcome=FAIL, detail=detail))
        elif iid in ids["empty_patch_ids"]:
            out.append(SampleResult(**base, outcome=FAIL, detail={**detail, "empty_patch": True}))
        elif _patch_did_not_apply(inst_dir / "run_instance.log"):
            out.append(SampleResult(**base, outcome=FAIL, detail={
                **detail, "patch_error": "the swebench harness could not apply the patch"}))
        elif iid in ids["error_ids"]:
            out.append(SampleResult(**base, outcome=ERROR, detail=detail, error=(
                f"instance {iid}: the swebench harness could not evaluate it (image build or "
                f"test run failed); see {inst_dir / 'run_instance.log'}")))
        else:
            out.append(SampleResult(**base, outcome=ERROR, detail=detail, error=(
                f"instance {iid}: no result in the swebench harness report {summary_file}; {see}")))
    return out


def _instance_report(path: Path, instance_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())[instance_id]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _patch_did_not_apply(run_log: Path) -> bool:
    try:
        return APPLY_PATCH_FAIL in run_log.read_text(errors="replace")
    except OSError:
        return False


async def grade_with_harness(pending: list[SampleResult], model: str, out_dir: Path,
                             run_id: str, dataset_name: str, settings: HarnessSettings,
                             runner: Callable[..., Any] | None = None) -> list[SampleResult]:
    """Grade ungraded SWE samples with the official harness, one run per sample index.

    Args:
        pending: ungraded results (``answer`` = the patch).
        model: the served model name (``model_name_or_path`` of the predictions).
        out_dir: the evaluation's results folder; the harness works in ``out_dir/swebench``.
        run_id: base run id; sample index j uses ``<run_id>.sample<j>``.
        dataset_name: the harness's ``--dataset_name``.
        settings: how the harness is run.
        runner: replaces ``run_harness`` (same arguments and result; tests pass a fake
            that writes report files).

    Returns:
        One graded result per pending one.
    """
    runner = runner or run_harness
    workdir = out_dir / "swebench"
    workdir.mkdir(parents=True, exist_ok=True)
    by_index: dict[int, list[SampleResult]] = {}
    for r in pending:
        by_index.setdefault(r.sample_index, []).append(r)
    graded: list[SampleResult] = []
    for j, rows in sorted(by_index.items()):
        rid = f"{run_id}.sample{j}"
        preds = workdir / f"predictions.{rid}.jsonl"
        preds.write_text("".join(json.dumps({"instance_id": r.problem_id, "model_name_or_path": model,
                                             "model_patch": r.answer}) + "\n" for r in rows))
        rc, harness_log = await runner(preds, dataset_name, rid, sorted(r.problem_id for r in rows),
                                       workdir, settings)
        if rc != 0:
            graded += [SampleResult(r.benchmark, r.problem_id, r.sample_index, ERROR, r.answer,
                                    {**r.detail, "grader": "swebench", "harness_run_id": rid},
                                    f"the swebench harness exited with code {rc}; see {harness_log}")
                       for r in rows]
            continue
        graded += read_harness_report(workdir, model, rid, rows, harness_log)
    return graded
