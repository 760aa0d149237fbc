"""The agent's tools, run against one episode's sandboxed workspace.

``bash``, ``read_file``, ``write_file``, ``str_replace``, ``run_tests`` and ``submit``.
Each returns an ``Observation`` (text for the model, whether the episode ends). A tool
misuse (no such file, ambiguous replacement, path outside the workspace) becomes an
observation that says what to fix, never an exception.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from agents.envs.task import Task, run_tests
from agents.toolcall import ToolCall, ToolSpec
from sandbox import Limits, SandboxError, Workspace

TOOL_SPECS: dict[str, ToolSpec] = {s.name: s for s in (
    ToolSpec("bash", "Run a shell command in the repository root (no network).",
             required={"command": "the shell command"}),
    ToolSpec("read_file", "Show a file with line numbers.",
             required={"path": "path relative to the repository root"},
             optional={"start_line": "first line to show (1-based)",
                       "end_line": "last line to show"}),
    ToolSpec("write_file", "Create or overwrite a file.",
             required={"path": "path relative to the repository root",
                       "content": "the whole new content"}),
    ToolSpec("str_replace", "Replace one exact, unique occurrence of old_str by new_str in a file.",
             required={"path": "path relative to the repository root",
                       "old_str": "text to replace; must occur exactly once",
                       "new_str": "replacement text"}),
    ToolSpec("run_tests", "Run the task's tests (or the given pytest node ids) and report results.",
             optional={"tests": "space-separated pytest node ids or files"}),
    ToolSpec("submit", "Finish: your changes in the repository are the answer."),
)}
"""The tools every episode offers, by name."""


@dataclass(frozen=True)
class Observation:
    """What a tool call returned.

    Attributes:
        text: shown to the model (capped at the toolbox's ``max_observation_chars``).
        ends_episode: the call was ``submit``.
        tool_s: wall-clock seconds the tool took.
        error: the call could not be carried out (bad path, no match, ...).
    """

    text: str
    ends_episode: bool = False
    tool_s: float = 0.0
    error: bool = False


class Toolbox:
    """Runs tool calls for one episode.

    Args:
        workspace: the episode's sandboxed workspace.
        task: the task (its test command and FAIL_TO_PASS/PASS_TO_PASS for ``run_tests``).
        command_limits: limits of ``bash`` and ``run_tests`` commands.
        max_observation_chars: longer observations keep their head and tail.
    """

    def __init__(self, workspace: Workspace, task: Task, command_limits: Limits,
                 *, max_observation_chars: int = 4000) -> None:
        self.ws = workspace
        self.task = task
        self.limits = command_limits
        self.max_observation_chars = max_observation_chars
        self._handlers: dict[str, Callable[..., Awaitable[str]]] = {
            "bash": self._bash, "read_file": self._read_file, "write_file": self._write_file,
            "str_replace": self._str_replace, "run_tests": self._run_tests,
        }

    async def call(self, call: ToolCall) -> Observation:
        """Run one parsed call (its name and arguments were checked against TOOL_SPECS)."""
        started = time.monotonic()
        if call.name == "submit":
            return Observation("Submitted.", ends_episode=True)
        try:
            text, error = await self._handlers[call.name](**call.arguments), False
        except SandboxError as e:
            text, error = f"Error: {e}", True
        except ValueError as e:  # bad argument values (line numbers, ...)
            text, error = f"Error in {call.name}: {e}", True
        return Observation(self._cap(text), tool_s=time.monotonic() - started, error=error)

    def _cap(self, text: str) -> str:
        n = self.max_observation_chars
        if len(text) <= n:
            return text
        return f"{text[:n // 2]}\n[... {len(text) - n} characters cut ...]\n{text[-n // 2:]}"

    async def _bash(self, command: str) -> str:
        r = await self.ws.run(command, limits=self.limits)
        parts = [f"exit code: {r.exit_code}"]
        if r.timed_out:
            parts.append(f"(killed: the command ran longer than {self.limits.timeout_s:g} s)")
        if r.stdout:
            parts.append(r.stdout.rstrip("\n"))
        if r.stderr:
            parts.append("stderr:\n" + r.stderr.rstrip("\n"))
        return "\n".join(parts)

    async def _read_file(self, path: str, start_line: str = "1", end_line: str = "") -> str:
        lines = self.ws.read_text(path).splitlines()
        start = max(1, int(start_line))
        end = min(len(lines), int(end_line)) if end_line else len(lines)
        if start > max(end, 1):
            raise ValueError(f"start_line {start} is after the end ({len(lines)} lines)")
        width = len(str(end))
        return "\n".join(f"{i:>{width}}  {lines[i - 1]}" for i in range(start, end + 1)) or "(empty file)"

    async def _write_file(self, path: str, content: str) -> str:
        self.ws.write_text(path, content)
        return f"Wrote {len(content.splitlines())} lines to {path}."

    async def _str_replace(self, path: str, old_str: str, new_str: str) -> str:
        text = self.ws.read_text(path)
        count = text.count(old_str) if old_str else 0
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise ValueError(f"old_str {where} in {path}; give an exact snippet that occurs once "
                             "(read_file shows the current text).")
        self.ws.write_text(path, text.replace(old_str, new_str, 1))
        line = text[:text.index(old_str)].count("\n") + 1
        return f"Replaced 1 occurrence in {path} at line {line}."

    async def _run_tests(self, tests: str = "") -> str:
        ids = shlex.split(tests) if tests.strip() else [*self.task.FAIL_TO_PASS, *self.task.PASS_TO_PASS]
        report = await run_tests(self.ws, self.task.test_cmd, ids, limits=self.limits)
        lines = [f"{node}: {outcome}" + (f" - {report.messages[node]}" if node in report.messages else "")
                 for node, outcome in sorted(report.outcomes.items())]
        n_pass = sum(v == "passed" for v in report.outcomes.values())
        head = f"{n_pass} of {len(report.outcomes)} tests passed."
        if report.command.timed_out:
            head += " (the test run was killed at the time limit)"
        return "\n".join([head, *lines])
