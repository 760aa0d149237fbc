"""common.console: one-line messages stay one line in a log file."""

from __future__ import annotations

from common.console import LOG_WIDTH, output_console


def test_output_into_a_file_is_not_wrapped_at_80_columns(capsys):
    console = output_console()  # pytest captures stdout: not a terminal
    assert console.width == LOG_WIDTH
    line = "GRPO iteration 2/8  iter 43s  update only (no rollout finished during it)  TV 0.026"
    console.print(line)
    assert capsys.readouterr().out == line + "\n"
