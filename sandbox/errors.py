"""The sandbox part's one exception type."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """A sandbox could not be set up or used; the message says what was wrong and what to do.

    Raised for: bubblewrap missing, a snapshot folder that does not exist, a path that
    leaves the workspace, a patch that does not apply, use of a destroyed workspace.
    A command that fails, times out or hits a limit inside the sandbox is *not* an error:
    it is reported in its ``CommandResult``.
    """
