"""The rich console the commands print their progress and tables on."""

from __future__ import annotations

import sys

from rich.console import Console

LOG_WIDTH = 160
"""Columns when the output is not a terminal (a log file, a pipe): rich's default of 80
broke the commands' one-line progress messages and table cells in two."""


def output_console() -> Console:
    """A console for stdout: the terminal's width on a terminal, :data:`LOG_WIDTH` columns otherwise."""
    return Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)
