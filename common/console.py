"""The rich console the commands print their progress and tables on."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

LOG_WIDTH = 160
"""Columns when the output is not a terminal (a log file, a pipe): rich's default of 80
broke the commands' one-line progress messages and table cells in two."""


class LogConsole(Console):
    """A console for a log file or a pipe: a message (text only) is printed as one line
    however long it is (rich's ``soft_wrap``), so a grep for its start finds all of it; a
    table or other renderable is laid out in ``width`` columns as usual."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 -- rich's name
        if "soft_wrap" not in kwargs and objects and all(isinstance(o, str) for o in objects):
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)


def output_console() -> Console:
    """A console for stdout: the terminal's width on a terminal; otherwise a
    :class:`LogConsole` of :data:`LOG_WIDTH` columns."""
    return Console() if sys.stdout.isatty() else LogConsole(width=LOG_WIDTH)
