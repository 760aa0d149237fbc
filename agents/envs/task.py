"""SWE tasks in the SWE-bench format, and their reward: do the right tests pass?

One task is one JSON line::

    {"instance_id": "toolz__mut-0007", "repo": "toolz", "base_commit": "toolz-1.2.0",
     "snapshot": "snapshots/toolz__mut-0007",        # folder, relative to the JSONL file
     "problem_statement": "...", "FAIL_TO_PASS": ["toolz/tests/test_x.py::test_a"],
     "PASS_TO_PASS": [...], "test_cmd": "python -m pytest", "patch": "<gold fix diff>"}

Reward (SWE-bench): 1.0 when every FAIL_TO_PASS test passes and every PASS_TO_PASS test
still passes, else 0.0. Tests are pytest node ids, run in the episode's sandbox.
"""

from __future__ import annotations

import json
import shlex
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from sandbox import CommandResult, Limits, SandboxError, Workspace

DEFAULT_TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -p no:cacheprovider"
"""Pytest without the host's plugins (a task's tests need none of them)."""

_REPORT_FILE = ".misa-test-report.xml"


class TaskError(ValueError):
    """A task file, or a task in it, is malformed; the message names the task and the field."""


@dataclass(frozen=True)
class Task:
    """One SWE-style task (SWE-bench's task fields plus where its snapshot lies).

    Attributes:
        instance_id: unique id, ``<repo>__<name>``.
        repo: project name.
        base_commit: version or commit of the project the snapshot was made from.
        snapshot: absolute folder holding the repository as the agent first sees it.
        problem_statement: the issue text shown to the agent.
        FAIL_TO_PASS: pytest node ids that fail on the snapshot and must pass.
        PASS_TO_PASS: node ids that pass on the snapshot and must keep passing.
        test_cmd: shell prefix that runs pytest in the workspace.
        patch: a gold fix (unified diff), '' when unknown.
        metadata: free-form build information (mutation kind, seed, ...).
    """

    instance_id: str
    repo: str
    base_commit: str
    snapshot: str
    problem_statement: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...] = ()
    test_cmd: str = DEFAULT_TEST_CMD
    patch: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, obj: dict[str, Any], base_dir: Path | None = None) -> "Task":
        """Build from a JSON object; a relative ``snapshot`` is taken from ``base_dir``.

        Raises:
            TaskError: a required field is missing or has the wrong type.
        """
        name = obj.get("instance_id", "<no instance_id>")
        for key in ("instance_id", "repo", "snapshot", "problem_statement", "FAIL_TO_PASS"):
            if key not in obj:
                raise TaskError(f"task {name}: field {key!r} is missing (SWE-bench format, "
                                "see agents/envs/task.py).")
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            if not isinstance(obj.get(key, []), list):
                raise TaskError(f"task {name}: {key} must be a list of pytest node ids.")
        snapshot = Path(obj["snapshot"])
        if not snapshot.is_absolute() and base_dir is not None:
            snapshot = base_dir / snapshot
        return cls(
            instance_id=obj["instance_id"], repo=obj["repo"],
            base_commit=str(obj.get("base_commit", "")), snapshot=str(snapshot),
            problem_statement=obj["problem_statement"],
            FAIL_TO_PASS=tuple(obj["FAIL_TO_PASS"]), PASS_TO_PASS=tuple(obj.get("PASS_TO_PASS", [])),
            test_cmd=obj.get("test_cmd", DEFAULT_TEST_CMD), patch=obj.get("patch", ""),
            metadata=dict(obj.get("metadata", {})),
        )

    def to_dict(self, base_dir: Path | None = None) -> dict[str, Any]:
        """JSON-ready dict; ``snapshot`` relative to ``base_dir`` when under it."""
        obj = asdict(self)
        obj["FAIL_TO_PASS"], obj["PASS_TO_PASS"] = list(self.FAIL_TO_PASS), list(self.PASS_TO_PASS)
        if base_dir is not None and Path(self.snapshot).is_relative_to(base_dir):
            obj["snapshot"] = str(Path(self.snapshot).relative_to(base_dir))
        return obj


def load_tasks(path: str | Path) -> dict[str, Task]:
    """Read a JSONL file of tasks: instance_id -> Task.

    Raises:
        TaskError: the file is missing, a line is not JSON or not an object, or a task is malformed.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist; build tasks with "
                        "`python -m agents.envs.build` or point tasks_path at a JSONL file.")
    tasks: dict[str, Task] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{lineno}: not JSON ({e.msg}).") from None
        if not isinstance(obj, dict):
            raise TaskError(f"{path}:{lineno}: not a task object (a JSON {type(obj).__name__}).")
        task = Task.from_dict(obj, base_dir=path.parent)
        tasks[task.instance_id] = task
    return tasks


def write_tasks(tasks: Iterable[Task], path: Path) -> None:
    """Write tasks as JSONL, snapshot paths relative to the file's folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for task in tasks:
            f.write(json.dumps(task.to_dict(base_dir=path.parent)) + "\n")


@dataclass(frozen=True)
class TestReport:
    """Outcome of one pytest run.

    Attributes:
        outcomes: node id -> ``passed``, ``failed``, ``error`` or ``skipped``.
        messages: node id -> first line of the failure message (failed/error only).
        command: the CommandResult of the run (exit code, output, timing).
        reported: pytest wrote its report (False: the command did not start, collection
            crashed or it timed out; every requested id is then ``error``).
    """

    outcomes: dict[str, str]
    messages: dict[str, str]
    command: CommandResult
    reported: bool = True

    def passed(self, node_id: str) -> bool:
        """True when ``node_id`` ran and passed."""
        return self.outcomes.get(node_id) == "passed"

    @property
    def failing(self) -> list[str]:
        """Node ids that failed or errored, sorted."""
        return sorted(k for k, v in self.outcomes.items() if v in ("failed", "error"))


def _node_id(case: ET.Element) -> str:
    # junit xunit1 gives file, classname (module path + class) and name.
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    cls = classname[len(module) + 1:] if module and classname.startswith(module + ".") else ""
    if not file:
        file = classname.replace(".", "/") + ".py"
    return "::".join(p for p in (file, cls, name) if p)


def parse_junit(xml_text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(outcomes, messages) from pytest's ``--junitxml`` report (xunit1 family)."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    root = ET.fromstring(xml_text)
    for case in root.iter("testcase"):
        node = _node_id(case)
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                if outcome != "skipped":
                    text = (child.get("message") or child.text or "").strip()
                    messages[node] = text.splitlines()[0][:300] if text else ""
                break
        outcomes[node] = outcome
    return outcomes, messages


async def run_tests(ws: Workspace, test_cmd: str, node_ids: Iterable[str] = (),
                    limits: Limits | None = None, extra_args: str = "") -> TestReport:
    """Run pytest in ``ws`` on ``node_ids`` (all tests when empty) and read its report.

    Node ids that pytest could not find are reported as ``error``. A run that produced no
    report (collection crash, timeout) marks every requested id ``error``.
    """
    ids = list(node_ids)
    cmd = (f"{test_cmd} -q --tb=line -o junit_family=xunit1 --junitxml={_REPORT_FILE} "
           f"{extra_args} {' '.join(shlex.quote(i) for i in ids)}")
    result = await ws.run(cmd, limits=limits)
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    reported = False
    try:
        report = ws.resolve(_REPORT_FILE)
        if report.is_file():
            outcomes, messages = parse_junit(report.read_text(errors="replace"))
            reported = True
            report.unlink()
    except (SandboxError, ET.ParseError):
        pass
    for node in ids:
        if node not in outcomes:
            outcomes[node] = "error"
            messages.setdefault(node, "test did not run (not found, collection error or timeout)")
    return TestReport(outcomes, messages, result, reported)


async def evaluate(ws: Workspace, task: Task, limits: Limits | None = None) -> tuple[float, TestReport]:
    """The task's reward in ``ws`` now: 1.0 iff all FAIL_TO_PASS and PASS_TO_PASS pass."""
    report = await run_tests(ws, task.test_cmd, [*task.FAIL_TO_PASS, *task.PASS_TO_PASS], limits)
    ok = all(report.passed(t) for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS))
    return (1.0 if ok else 0.0), report


async def task_problem(task: Task, test_patch: str = "", isolation=None, limits: Limits | None = None,
                       root: str | Path | None = None) -> str:
    """Why ``task`` cannot be rewarded ('' when it can): its tests on the unchanged snapshot.

    PASS_TO_PASS tests must pass and FAIL_TO_PASS tests must not all pass already. A test
    command that wrote no report at all (it could not start, e.g. exit 127 for a command not
    found in the sandbox) is named with its exit status and the end of its output: then no
    task can be rewarded in this sandbox, whatever an agent does.

    Args:
        task: the task; its snapshot is copied into a fresh workspace.
        test_patch: a diff applied before the tests (SWE-bench's new tests); '' for none.
        isolation: the sandbox's :class:`sandbox.IsolationConfig` (None: the default).
        limits: the test run's limits.
        root: the folder workspaces are made in (None: the default).

    Raises:
        SandboxError: the sandbox cannot start.
    """
    async with Workspace.create(task.snapshot, root=root, isolation=isolation, limits=limits) as ws:
        try:
            await ws.apply_patch(test_patch)
        except SandboxError as e:
            return f"task {task.instance_id}: its test_patch does not apply: {e}"
        _reward, report = await evaluate(ws, task, limits)
    broken = [t for t in task.PASS_TO_PASS if not report.passed(t)]
    if broken:
        why = (f"PASS_TO_PASS {describe_outcomes(report, broken)} not passing on the unchanged snapshot")
        if not report.reported:
            tail = (report.command.stderr or report.command.stdout).strip()[-400:]
            why += (f"; the test command `{task.test_cmd}` wrote no report (exit status "
                    f"{report.command.exit_code}{', timed out' if report.command.timed_out else ''}: {tail!r})")
        return f"task {task.instance_id}: its tests do not run: {why}; check test_cmd, the snapshot, the test ids and the sandbox"
    if task.FAIL_TO_PASS and all(report.passed(t) for t in task.FAIL_TO_PASS):
        return (f"task {task.instance_id}: every FAIL_TO_PASS test already passes on the "
                "unchanged snapshot; the task is not a bug")
    return ""


def describe_outcomes(report: TestReport, ids: list[str]) -> str:
    """The first three of ``ids`` with their outcome and message, for an error."""
    return "; ".join(f"{t} ({report.outcomes.get(t)}: {report.messages.get(t, '')})" for t in ids[:3])

