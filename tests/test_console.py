"""common.console: one-line messages stay one line in a log file."""

from __future__ import annotations

from rich.table import Table

from common.console import LOG_WIDTH, output_console


def test_output_into_a_file_is_not_wrapped_at_80_columns(capsys):
    console = output_console()  # pytest captures stdout: not a terminal
    assert console.width == LOG_WIDTH
    line = "GRPO iteration 2/8  iter 43s  update only (no rollout finished during it)  TV 0.026"
    console.print(line)
    assert capsys.readouterr().out == line + "\n"


def test_a_message_longer_than_the_width_stays_one_line_and_a_table_keeps_its_layout(capsys):
    console = output_console()
    scores = ", ".join(f"arithmetic/pass@{k} 0.{k}00" for k in range(1, 12))
    line = f"GRPO iteration 8/8  iter 96s  samples/min 18.2  held-out {scores}"
    assert len(line) > LOG_WIDTH
    console.print(line)
    assert capsys.readouterr().out == line + "\n"  # the held-out scores are not cut onto a second line
    table = Table(title="summary")
    table.add_column("a long column name " * 6)
    table.add_row("cell " * 40)
    console.print(table)
    out = capsys.readouterr().out.splitlines()
    assert len(out) > 5 and max(map(len, out)) <= LOG_WIDTH  # wrapped inside its cells, as before
    assert out[0].strip() == "summary" and out[0].startswith(" ")  # the title still centred
