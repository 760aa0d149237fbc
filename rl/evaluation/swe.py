"""SWE-style benchmarks: tasks in the SWE-bench format run as agent episodes.

Input: a JSONL of tasks (``agents/envs/task.py``: the project's tasks, or SWE-bench
Lite / Verified rows). SWE-bench rows carry ``FAIL_TO_PASS``/``PASS_TO_PASS`` as
JSON-encoded strings and no local ``snapshot``; both are accepted: the lists are decoded,
and a missing snapshot is looked up as ``<snapshots_dir>/<instance_id>`` (a checkout of
the repository at ``base_commit``, prepared by the user). A ``test_patch`` (SWE-bench's
new tests) is applied before grading.

Each sample is one episode of the agent loop (``agents.loop.run_episode``) through the
router. Grading is SWE-bench's resolved rule, run locally in the sandbox: the episode's
patch is applied to a fresh copy of the snapshot (then the ``test_patch``), and the
task is resolved when every FAIL_TO_PASS test passes and every PASS_TO_PASS test
still passes. The patches are also written in the SWE-bench predictions format
(``instance_id``, ``model_name_or_path``, ``model_patch``; one file per sample index) so
that the official harness can grade them where Docker exists:

    python -m swebench.harness.run_evaluation --dataset_name <tasks.jsonl> \\
        --predictions_path <out_dir>/swe_predictions.sample0.jsonl --run_id eval0

With ``grader="swebench"`` the official harness grades instead (``rl.evaluation.swebench_harness``):
each episode's patch is recorded ``ungraded``, and after sampling ``grade_pending`` runs the
harness on them and reads its report back into per-sample results.

Before sampling, each task is checked on its unchanged snapshot: PASS_TO_PASS tests
must pass and FAIL_TO_PASS tests must not all pass already; a task whose tests do not
run is reported as an error, never as a failed or passed sample. (Not with the official
harness: SWE-bench repositories' tests need their Docker environment to run; the harness
reports a task whose environment fails as an error itself.)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import httpx

from agents.chat import ChatFormat, ChatRenderer, Tokenizer
from agents.envs.task import Task, TaskError, evaluate, task_problem
from agents.loop import EpisodeConfig, run_episode
from rollout.client import ModelClient
from router.headers import SessionHeaders
from rl.evaluation.base import (ERROR, FAIL, PASS, UNGRADED, EvalError, EvalProblem,
                                SampleContext, SampleResult, sample_key, sample_seed)
from rl.evaluation.swebench_harness import HarnessSettings, grade_with_harness
from sandbox import Limits, SandboxError, Workspace

_LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")


def _task_dict(obj: Any, snapshots_dir: Path | None, base_dir: Path) -> dict[str, Any]:
    """Normalise one SWE-bench row to the project's task format.

    Raises:
        TaskError: not an object, list fields that are not JSON lists, no snapshot found.
    """
    if not isinstance(obj, dict):
        raise TaskError("task is not a JSON object")
    obj = dict(obj)
    name = obj.get("instance_id", "<no instance_id>")
    for key in _LIST_FIELDS:
        if isinstance(obj.get(key), str):
            try:
                obj[key] = json.loads(obj[key])
            except json.JSONDecodeError:
                raise TaskError(f"task {name}: {key} is a string but not a JSON list") from None
    if "snapshot" not in obj and snapshots_dir is not None and "instance_id" in obj:
        obj["snapshot"] = str(snapshots_dir / str(obj["instance_id"]))
    if "snapshot" not in obj:
        raise TaskError(f"task {name}: no 'snapshot' folder; give one per task or set "
                        "eval.benchmarks.swe.snapshots_dir to a folder of <instance_id>/ "
                        "checkouts at base_commit")
    snapshot = Path(obj["snapshot"])
    if not snapshot.is_absolute():
        snapshot = base_dir / snapshot
    if not snapshot.is_dir():
        raise TaskError(f"task {name}: snapshot folder {snapshot} does not exist")
    return obj


def load_task_problems(path: str | Path, snapshots_dir: str | Path | None = None) -> list[EvalProblem]:
    """Read a JSONL of SWE-style tasks; a bad line becomes a problem with its error.

    Args:
        path: the JSONL file.
        snapshots_dir: where snapshots of tasks without a ``snapshot`` field lie.

    Returns:
        Problems in file order; ``payload`` = the task dict (``Task.to_dict``) plus
        ``test_patch``; ``error`` set for a line that is not JSON, a task missing a
        field, a snapshot that does not exist, or a repeated instance_id.

    Raises:
        EvalError: the file does not exist.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise EvalError(f"swe benchmark: tasks file {path} does not exist; give a JSONL "
                        "of SWE-bench-format tasks (eval.benchmarks.swe.path).")
    snaps = Path(snapshots_dir).expanduser() if snapshots_dir else None
    problems: list[EvalProblem] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        fallback_id = f"{path.name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(EvalProblem(fallback_id, error=f"{path}:{lineno}: not JSON ({e.msg})"))
            continue
        iid = str(obj.get("instance_id", fallback_id)) if isinstance(obj, dict) else fallback_id
        if iid in seen:
            problems.append(EvalProblem(f"{iid}@{lineno}",
                                        error=f"{path}:{lineno}: instance_id {iid} repeated"))
            continue
        seen.add(iid)
        try:
            obj = _task_dict(obj, snaps, path.parent)
            task = Task.from_dict(obj, base_dir=path.parent)
        except (TaskError, TypeError, ValueError) as e:
            problems.append(EvalProblem(iid, error=f"{path}:{lineno}: {e}"))
            continue
        problems.append(EvalProblem(iid, {**task.to_dict(), "test_patch": obj.get("test_patch") or ""}))
    return problems


def task_of(problem: EvalProblem) -> Task:
    """The ``Task`` of a problem built by ``load_task_problems``."""
    return Task.from_dict({k: v for k, v in problem.payload.items() if k != "test_patch"})


async def grade_patch(task: Task, patch: str, test_patch: str = "",
                      isolation=None, limits: Limits | None = None) -> tuple[bool, dict[str, Any]]:
    """SWE-bench's resolved rule for ``patch``, run in a fresh sandboxed copy of the snapshot.

    Args:
        task: the task.
        patch: the model's unified diff ('' = no change).
        test_patch: the task's new tests, applied after ``patch``.
        isolation, limits: sandbox settings of the test run.

    Returns:
        (resolved, detail): resolved iff every FAIL_TO_PASS and PASS_TO_PASS test passes;
        detail holds the per-test outcomes and ``patch_applied_with`` (which of
        ``HARNESS_APPLY_COMMANDS`` applied it), ``empty_patch: True`` for an empty patch (no
        test is run, as in the SWE-bench harness), or ``patch_error`` when no command applies
        it (not resolved: the model's fault). A patch without a final newline gets one
        (as the harness does) first.

    Raises:
        SandboxError: the snapshot is missing or the sandbox cannot start, or the
            task's own ``test_patch`` does not apply (the task's fault).
    """
    if not patch.strip():  # as the SWE-bench harness: no tests run, reported as such
        return False, {"empty_patch": True}
    if not patch.endswith("\n"):  # the harness ensures the trailing newline git apply needs
        patch += "\n"
    async with Workspace.create(task.snapshot, isolation=isolation, limits=limits) as ws:
        try:
            applied_with = await apply_like_harness(ws, patch)
        except SandboxError as e:
            return False, {"patch_error": str(e)[:1000]}
        await ws.apply_patch(test_patch)
        reward, report = await evaluate(ws, task, limits)
    return reward > 0, {"test_outcomes": report.outcomes, "patch_applied_with": applied_with}


HARNESS_APPLY_COMMANDS = ("git apply --verbose", "git apply --verbose --reject",
                          "patch --batch --fuzz=5 -p1")
"""How the SWE-bench harness applies a model patch, tried in this order (the harness passes
``patch`` a file with ``-i``; here the patch comes on standard input)."""


async def apply_like_harness(ws: Workspace, patch: str) -> str:
    """Apply ``patch`` in ``ws`` with the first of ``HARNESS_APPLY_COMMANDS`` that succeeds.

    As in the harness, a failed ``--reject`` attempt leaves the hunks it could apply (and
    ``.rej`` files) for ``patch`` to work on.

    Returns:
        The command that applied it.

    Raises:
        SandboxError: none applies it; the message holds each command's reason.
    """
    reasons = []
    for command in HARNESS_APPLY_COMMANDS:
        result = await ws.run(command, stdin=patch.encode())
        if result.ok:
            return command
        reasons.append(f"{command}: {(result.stderr or result.stdout).strip()[-600:]}")
    raise SandboxError(f"patch does not apply to workspace {ws.path}: " + " | ".join(reasons))


@dataclass
class SweBenchmark:
    """SWE-style tasks run as agent episodes and graded by the resolved rule.

    Args:
        path: JSONL of tasks.
        tokenizer: the served model's tokenizer (token-exact episodes, ``agents.chat``).
        episode: limits, sandbox and prompt settings of each episode.
        chat_format: the model's chat template pieces.
        snapshots_dir: folder of ``<instance_id>/`` snapshots for rows without one.
        limit: first ``limit`` tasks only (None = all).
        validate: check each task's tests on its unchanged snapshot first (local
            grader only).
        validate_concurrency: tasks checked (and, in ``grade_pending``, patches
            graded) at once.
        model_timeout_s, model_retries: per model call.
        workload_class: X-Workload-Class of the episodes' requests.
        grader: ``local`` (the resolved rule in the sandbox, per sample) or ``swebench``
            (the official harness, in one batch after sampling; ``choose_grader`` picks).
        harness: how the official harness is run.

    Raises:
        EvalError (from ``problems``): the file does not exist.
    """

    path: str
    tokenizer: Tokenizer
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    chat_format: ChatFormat = field(default_factory=ChatFormat)
    snapshots_dir: str | None = None
    limit: int | None = None
    validate: bool = True
    validate_concurrency: int = 4
    model_timeout_s: float = 600.0
    model_retries: int = 2
    workload_class: str = "agent"
    grader: str = "local"
    harness: HarnessSettings = field(default_factory=HarnessSettings)
    name: str = "swe"

    def __post_init__(self) -> None:
        if self.grader not in ("local", "swebench"):
            raise EvalError(f"swe benchmark: grader {self.grader!r} is neither local nor swebench")
        self.renderer = ChatRenderer(self.tokenizer, self.chat_format)
        self._http: httpx.AsyncClient | None = None
        self._problems: dict[str, EvalProblem] = {}

    async def problems(self) -> list[EvalProblem]:
        """Instances in file order, each checked (``validate``) on its snapshot."""
        problems = load_task_problems(self.path, self.snapshots_dir)
        if self.limit is not None:
            problems = problems[: self.limit]
        self._problems = {p.problem_id: p for p in problems}
        if not self.validate or self.grader == "swebench":
            return problems
        sem = asyncio.Semaphore(self.validate_concurrency)

        async def checked(p: EvalProblem) -> EvalProblem:
            if p.error:
                return p
            async with sem:
                try:
                    error = await task_problem(task_of(p), p.payload["test_patch"], self.episode.isolation,
                                               self.episode.test_limits, root=self.episode.workspace_root)
                except SandboxError as e:
                    error = f"task {p.problem_id}: sandbox failed: {e}"
            return EvalProblem(p.problem_id, p.payload, error)

        return list(await asyncio.gather(*(checked(p) for p in problems)))

    async def sample(self, problem: EvalProblem, sample_index: int,
                     ctx: SampleContext) -> SampleResult:
        """One agent episode on the task; its patch graded by the resolved rule."""
        if self._http is None:
            self._http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))
        key = sample_key(self.name, problem.problem_id, sample_index)
        task = task_of(problem)
        client = ModelClient(self._http, ctx.base_url, ctx.model,
                             sampling={"temperature": ctx.temperature, "top_p": ctx.top_p,
                              "seed": sample_seed(ctx.seed, key)},
                             timeout_s=self.model_timeout_s, retries=self.model_retries)
        session = SessionHeaders(f"{ctx.run_id}/{key}", self.workload_class,
                                 group_id=f"{ctx.run_id}/{self.name}/{problem.problem_id}")
        episode = await run_episode(task, session, client, self.renderer, self.episode)
        result = dict(benchmark=self.name, problem_id=problem.problem_id,
                      sample_index=sample_index, answer=episode.patch)
        detail = {"status": episode.status, "turns": len(episode.turns),
                  "model_s": episode.model_s, "tool_s": episode.tool_s}
        if episode.status in ("model_error", "sandbox_error"):
            return SampleResult(**result, outcome=ERROR, detail=detail, error=episode.error)
        if not episode.turns:  # the model was never asked: a setting, not the model, failed
            return SampleResult(**result, outcome=ERROR, detail=detail, error=(
                f"task {problem.problem_id}: the first prompt ({len(episode.prompt_ids)} "
                f"tokens) leaves no room under max_context_tokens="
                f"{self.episode.limits.max_context_tokens}; raise eval.agent.episode.limits."))
        if self.grader == "swebench":  # graded in one batch by grade_pending
            return SampleResult(**result, outcome=UNGRADED, detail=detail)
        test_patch = problem.payload.get("test_patch", "")
        if not test_patch:  # the episode's own reward is the resolved rule on the same tree
            resolved, grading = episode.reward > 0, {"test_outcomes": episode.test_outcomes}
        else:
            try:
                resolved, grading = await grade_patch(task, episode.patch, test_patch,
                                                      self.episode.isolation, self.episode.test_limits)
            except SandboxError as e:
                return SampleResult(**result, outcome=ERROR, detail=detail, error=str(e))
        return SampleResult(**result, outcome=PASS if resolved else FAIL,
                            detail={**detail, **grading, "grader": "local"})

    async def grade_pending(self, pending: list[SampleResult], model: str, out_dir: Path,
                            run_id: str) -> list[SampleResult]:
        """Grade samples recorded ``ungraded`` (their ``answer`` is the episode's patch).

        With ``grader="swebench"`` the official harness grades them (one run per sample
        index, ``rl.evaluation.swebench_harness``); with ``local`` (a results folder
        started with the harness, continued without it) the resolved rule runs here.

        Args:
            pending: the ungraded results of this benchmark.
            model: the served model name (the predictions' ``model_name_or_path``).
            out_dir: the results folder.
            run_id: the evaluation's run id (the harness run ids derive from it).

        Returns:
            One graded result per pending one.
        """
        if self.grader == "swebench":
            return await grade_with_harness(pending, model, out_dir, run_id,
                                            self.harness.dataset_name or str(self.path), self.harness)
        sem = asyncio.Semaphore(self.validate_concurrency)

        async def local(r: SampleResult) -> SampleResult:
            base = dict(benchmark=r.benchmark, problem_id=r.problem_id,
                        sample_index=r.sample_index, answer=r.answer)
            problem = self._problems.get(r.problem_id)
            if problem is None or problem.error:
                return SampleResult(**base, outcome=ERROR, detail=r.detail, error=(
                    f"task {r.problem_id}: " + (problem.error if problem else
                                                    "no longer in the tasks file")))
            async with sem:
                try:
                    resolved, grading = await grade_patch(
                        task_of(problem), r.answer, problem.payload.get("test_patch", ""),
                        self.episode.isolation, self.episode.test_limits)
                except SandboxError as e:
                    return SampleResult(**base, outcome=ERROR, detail=r.detail, error=str(e))
            return SampleResult(**base, outcome=PASS if resolved else FAIL,
                                detail={**r.detail, **grading, "grader": "local"})

        return list(await asyncio.gather(*(local(r) for r in pending)))

    async def aclose(self) -> None:
        """Close the HTTP client of the episodes (a new one is made on the next sample)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def write_predictions(results: Iterable[SampleResult], model_name: str, out_dir: Path,
                      benchmark: str = "swe") -> list[Path]:
    """SWE-bench predictions files, one per sample index: ``swe_predictions.sample<j>.jsonl``.

    Each line is ``{"instance_id", "model_name_or_path", "model_patch"}`` (the official
    harness's input); errored samples are left out.

    Returns:
        The files written, by sample index.
    """
    by_sample: dict[int, list[dict[str, str]]] = {}
    for r in results:
        if r.benchmark != benchmark or r.outcome == ERROR:
            continue
        by_sample.setdefault(r.sample_index, []).append(
            {"instance_id": r.problem_id, "model_name_or_path": model_name, "model_patch": r.answer})
    paths = []
    for j in sorted(by_sample):
        p = out_dir / f"{benchmark}_predictions.sample{j}.jsonl"
        rows = sorted(by_sample[j], key=lambda row: row["instance_id"])
        p.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths.append(p)
    return paths
