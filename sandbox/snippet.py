"""Run one self-contained Python program in a fresh, empty sandboxed workspace.

What code rewards (``rl.data.code``) and code benchmarks (HumanEval) need: the program
and its tests in one file, run isolated, never in the caller's process.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from sandbox.isolation import IsolationConfig
from sandbox.limits import Limits
from sandbox.workspace import CommandResult, Workspace

PROGRAM_FILE = "program.py"


def empty_workspace(isolation: IsolationConfig | None = None, limits: Limits | None = None) -> Workspace:
    """A new workspace with nothing in it (``Workspace.create`` of an empty snapshot).

    The empty snapshot is a temporary folder removed as soon as it is copied, so nothing
    is left in the temp folder however the process ends.

    Raises:
        SandboxError: see ``Workspace.create``.
    """
    with tempfile.TemporaryDirectory(prefix="sandbox-empty-") as folder:
        os.chmod(folder, 0o755)  # mkdtemp makes it 0700; the sandbox user must enter the copy
        return Workspace.create(folder, isolation=isolation, limits=limits)


async def run_python_program(source: str, limits: Limits | None = None,
                             isolation: IsolationConfig | None = None) -> CommandResult:
    """Write ``source`` to ``program.py`` in a new empty workspace, run it, destroy the workspace.

    Returns:
        the command's result (exit code 0 = every assert passed).

    Raises:
        SandboxError: bubblewrap is missing and isolation was not explicitly turned off.
    """
    async with empty_workspace(isolation, limits) as ws:
        ws.write_text(PROGRAM_FILE, source)
        return await ws.run(f"python {PROGRAM_FILE}")


def run_tests_in_sandbox(limits: Limits | None = None, isolation: IsolationConfig | None = None):
    """A ``run_tests(program, tests) -> bool`` (``rl.data.code.RunTests``) backed by the sandbox.

    Safe to call from a worker thread (it runs its own event loop).
    """

    def run_tests(program: str, tests: str) -> bool:
        result = asyncio.run(run_python_program(f"{program}\n\n{tests}\n", limits, isolation))
        return result.exit_code == 0 and not result.timed_out

    return run_tests
