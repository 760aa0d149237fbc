"""Sandboxed workspaces for agent tools and task tests (bubblewrap isolation, rlimits).

Public API: ``Workspace`` (create / run / apply_patch / diff / destroy), ``CommandResult``,
``Limits``, ``IsolationConfig``, ``SandboxError``.
"""

from sandbox.errors import SandboxError
from sandbox.isolation import SANDBOX_WORKDIR, IsolationConfig
from sandbox.limits import Limits
from sandbox.workspace import CommandResult, Workspace, unified_diff

__all__ = ["CommandResult", "IsolationConfig", "Limits", "SANDBOX_WORKDIR", "SandboxError",
           "Workspace", "unified_diff"]
