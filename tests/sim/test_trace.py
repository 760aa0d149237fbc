"""The JSONL trace format: round trip, writer, and errors naming the line and the field."""

from __future__ import annotations

import io
import json

import pytest

from router.sim.errors import SimError
from router.sim.trace import TraceWriter, parse_trace_lines, read_trace, write_trace
from router.sim.workload import WorkloadConfig, generate_trace


def test_generated_trace_round_trips_through_jsonl(tmp_path):
    sessions = generate_trace(WorkloadConfig(units=40, seed=1))
    path = tmp_path / "t.jsonl"
    n = write_trace(sessions, path)
    back = read_trace(path)
    assert n == sum(len(s.requests) for s in sessions)
    assert [(s.session_id, len(s.requests)) for s in back] == [(s.session_id, len(s.requests)) for s in sessions]
    assert back[0].requests[0].prompt_tokens == sessions[0].requests[0].prompt_tokens


def test_malformed_line_error_names_line_and_field():
    good = json.dumps({"session_id": "s", "workload_class": "agent", "turn": 0, "prompt_tokens": 10,
                       "output_tokens": 5})
    bad = json.dumps({"session_id": "s", "workload_class": "agent", "turn": 1, "prompt_tokens": "ten",
                      "output_tokens": 5})
    with pytest.raises(SimError, match=r"t\.jsonl:2: field 'prompt_tokens'"):
        parse_trace_lines([good, bad], source="t.jsonl")


def test_missing_field_and_bad_json_are_reported_with_the_line():
    with pytest.raises(SimError, match=r"x:1: field 'output_tokens' is missing"):
        parse_trace_lines(['{"session_id": "s", "workload_class": "a", "turn": 0, "prompt_tokens": 3}'], "x")
    with pytest.raises(SimError, match=r"x:1: not valid JSON"):
        parse_trace_lines(["{nope"], "x")


def test_prompt_hashes_need_a_block_size():
    line = json.dumps({"session_id": "s", "workload_class": "a", "turn": 0, "prompt_tokens": 32,
                       "output_tokens": 1, "prompt_hashes": [1, 2]})
    with pytest.raises(SimError, match="block_size"):
        parse_trace_lines([line], "x")


def test_writer_counts_turns_and_reader_derives_tool_gaps_from_timestamps():
    buf = io.StringIO()
    w = TraceWriter(buf)
    w.record(session_id="s", workload_class="agent", prompt_tokens=100, output_tokens=10, arrival_s=0.0,
             finish_s=2.0, prompt_hashes=[7], block_size=64)
    w.record(session_id="s", workload_class="agent", prompt_tokens=150, output_tokens=10, arrival_s=5.5,
             finish_s=7.0, session_end=True)
    (session,) = parse_trace_lines(buf.getvalue().splitlines(), "rec")
    assert [r.turn for r in session.requests] == [0, 1]
    assert session.requests[0].tool_gap_s == pytest.approx(3.5)
    assert session.requests[1].session_end


def test_writer_refuses_a_bad_record_without_writing():
    buf = io.StringIO()
    with pytest.raises(SimError, match="prompt_tokens"):
        TraceWriter(buf).record(session_id="s", workload_class="a", prompt_tokens=0, output_tokens=1)
    assert buf.getvalue() == ""


def test_a_trace_that_is_a_directory_binary_or_empty_is_named_as_such(tmp_path):
    import pytest

    from router.sim.errors import SimError

    with pytest.raises(SimError, match="is a directory"):
        read_trace(tmp_path)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(SimError, match="not a UTF-8 text"):
        read_trace(binary)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(SimError, match="is empty"):
        read_trace(empty)


def test_router_sim_refuses_a_binary_trace_with_exit_2_and_no_run_folder(tmp_path):
    import subprocess
    import sys

    from common.config import REPO_ROOT

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    runs = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "router.sim", f"trace={binary}", "experiment=run",
                        f"out_dir={runs}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "not a UTF-8 text" in r.stderr and "Traceback" not in r.stderr
    assert not runs.exists()
