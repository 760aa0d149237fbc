"""The JSONL rollout-trace format: read (with validation), write, and record from the live router.

One line per model request, a JSON object:

| field | type | meaning |
|---|---|---|
| ``session_id`` | str, required | session (one agent trajectory or one single-turn sample) |
| ``workload_class`` | str, required | ``agent``, ``rlvr``, ``rlhf``, ... |
| ``unit_id`` | str | trainer-counted rollout unit (default: the session id) |
| ``group_id`` | str or null | GRPO group (siblings from one prompt) |
| ``turn`` | int >= 0, required | position of the request in its session |
| ``prompt_tokens`` | int >= 1, required | L_r, prompt length in tokens |
| ``output_tokens`` | int >= 1, required | tokens the request generated |
| ``tool_gap_s`` | float >= 0 | time between this request's end and the session's next request (tool / orchestration) |
| ``session_end`` | bool | last request of the session (default: the highest turn) |
| ``group_prefix_tokens`` | int >= 0 | leading prompt tokens shared by every session of the group |
| ``class_prefix_tokens`` | int >= 0 | leading prompt tokens shared by every session of the class (system prompt) |
| ``prompt_hashes`` | list[int] | chained hashes of the prompt's full KV blocks (recorded traces) |
| ``block_size`` | int | block size ``prompt_hashes`` were computed at (required with them) |
| ``arrival_s``, ``finish_s`` | float | timestamps as recorded (informational; replay is closed-loop) |

Replay model: a session's context is append-only, so turn k+1's prompt starts with turn
k's prompt and output. Without ``prompt_hashes`` the simulator derives block hashes from
that model (shared class prefix, then group prefix, then the session's own tokens).

A malformed line raises :class:`~router.sim.errors.SimError` naming the line and the field,
before any simulation starts (:func:`read_trace`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from router.sim.errors import SimError


@dataclass
class TraceRecord:
    """One request of a trace (fields as in the module docstring)."""

    session_id: str
    workload_class: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    unit_id: str | None = None
    group_id: str | None = None
    tool_gap_s: float = 0.0
    session_end: bool | None = None
    group_prefix_tokens: int = 0
    class_prefix_tokens: int = 0
    prompt_hashes: list[int] | None = None
    block_size: int | None = None
    arrival_s: float | None = None
    finish_s: float | None = None

    def to_json(self) -> dict:
        """The record as a JSON object, leaving out fields that are None."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class TraceSession:
    """One session: its requests in turn order."""

    session_id: str
    workload_class: str
    unit_id: str
    group_id: str | None
    requests: list[TraceRecord] = field(default_factory=list)


_REQUIRED = {"session_id": str, "workload_class": str, "turn": int, "prompt_tokens": int, "output_tokens": int}
_OPTIONAL = {
    "unit_id": (str,),
    "group_id": (str, type(None)),
    "tool_gap_s": (int, float),
    "session_end": (bool,),
    "group_prefix_tokens": (int,),
    "class_prefix_tokens": (int,),
    "prompt_hashes": (list,),
    "block_size": (int,),
    "arrival_s": (int, float),
    "finish_s": (int, float),
}


def _check_record(obj: object, where: str) -> TraceRecord:
    if not isinstance(obj, dict):
        raise SimError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name, tp in _REQUIRED.items():
        if name not in obj:
            raise SimError(f"{where}: field {name!r} is missing (required: {', '.join(_REQUIRED)})")
        v = obj[name]
        if not isinstance(v, tp) or isinstance(v, bool):
            raise SimError(f"{where}: field {name!r} must be {tp.__name__}, got {v!r}")
    unknown = sorted(set(obj) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise SimError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; see router/sim/trace.py")
    for name, tps in _OPTIONAL.items():
        v = obj.get(name)
        if v is not None and (not isinstance(v, tps) or (isinstance(v, bool) and bool not in tps)):
            raise SimError(f"{where}: field {name!r} has the wrong type: {v!r}")
    if obj["turn"] < 0:
        raise SimError(f"{where}: field 'turn' must be >= 0, got {obj['turn']}")
    for name in ("prompt_tokens", "output_tokens"):
        if obj[name] < 1:
            raise SimError(f"{where}: field {name!r} must be >= 1, got {obj[name]}")
    for name in ("tool_gap_s", "group_prefix_tokens", "class_prefix_tokens"):
        if obj.get(name, 0) < 0:
            raise SimError(f"{where}: field {name!r} must be >= 0, got {obj[name]}")
    if obj.get("prompt_hashes") is not None:
        if obj.get("block_size") is None or obj["block_size"] < 1:
            raise SimError(f"{where}: field 'block_size' (>= 1) is required with 'prompt_hashes'")
        if not all(isinstance(h, int) and not isinstance(h, bool) for h in obj["prompt_hashes"]):
            raise SimError(f"{where}: field 'prompt_hashes' must be a list of integers")
    return TraceRecord(**obj)


def parse_trace_lines(lines: Iterable[str], source: str = "<trace>") -> list[TraceSession]:
    """Parse and validate JSONL lines into sessions (turns sorted, session_end filled in).

    Raises:
        SimError: naming ``source:line`` and the field for any malformed record, a
            repeated (session, turn), or a session whose class/unit/group changes.
    """
    sessions: dict[str, TraceSession] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SimError(f"{where}: not valid JSON ({exc.msg})") from None
        rec = _check_record(obj, where)
        s = sessions.get(rec.session_id)
        if s is None:
            s = sessions[rec.session_id] = TraceSession(
                rec.session_id, rec.workload_class, rec.unit_id or rec.session_id, rec.group_id
            )
        for name, have in (("workload_class", s.workload_class), ("group_id", s.group_id)):
            if getattr(rec, name) != have:
                raise SimError(f"{where}: field {name!r} differs from earlier requests of session {rec.session_id!r}")
        s.requests.append(rec)
    for s in sessions.values():
        s.requests.sort(key=lambda r: r.turn)
        turns = [r.turn for r in s.requests]
        if len(set(turns)) != len(turns):
            raise SimError(f"{source}: session {s.session_id!r} repeats a turn number (field 'turn')")
        for r, nxt in zip(s.requests, s.requests[1:] + [None]):
            if r.session_end is None:
                r.session_end = nxt is None
            # A recorded trace carries timestamps, not gaps: the gap is the time between
            # this request's end and the next request's arrival.
            if nxt is not None and not r.tool_gap_s and r.finish_s is not None and nxt.arrival_s is not None:
                r.tool_gap_s = max(0.0, nxt.arrival_s - r.finish_s)
    return list(sessions.values())


def read_trace(path: str | Path) -> list[TraceSession]:
    """Read and validate a JSONL trace file (see module docstring).

    Raises:
        SimError: the path does not exist or is a directory, the file is not UTF-8 text, is
            empty (no request line), or holds a malformed record.
    """
    p = Path(path)
    if p.is_dir():
        raise SimError(f"trace {str(p)!r} is a directory: give a JSONL trace file")
    if not p.is_file():
        raise SimError(f"trace file {str(p)!r} does not exist")
    try:
        with p.open(encoding="utf-8") as f:
            sessions = parse_trace_lines(f, source=str(p))
    except UnicodeDecodeError as e:
        raise SimError(f"trace file {str(p)!r} is not a UTF-8 text JSONL file "
                       f"(byte {e.start}: {e.reason})") from None
    if not sessions:
        raise SimError(f"trace file {str(p)!r} is empty: it holds no request records")
    return sessions


def write_trace(sessions: Iterable[TraceSession], path: str | Path) -> int:
    """Write sessions as JSONL; returns the number of records written."""
    n = 0
    with Path(path).open("w") as f:
        for s in sessions:
            for r in s.requests:
                f.write(json.dumps(r.to_json()) + "\n")
                n += 1
    return n


class TraceWriter:
    """Records per-request records from the live router (or anything else) in the trace format.

    Usage: ``w = TraceWriter(open(path, "a")); w.record(...); w.close()``. Each call writes
    one validated line and flushes, so a crashed run keeps what it recorded. The turn number
    is counted per session by the writer. Give ``arrival_s`` and ``finish_s`` and leave
    ``tool_gap_s`` out: :func:`read_trace` derives each gap from the next arrival.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._turns: dict[str, int] = {}

    def record(
        self,
        *,
        session_id: str,
        workload_class: str,
        prompt_tokens: int,
        output_tokens: int,
        unit_id: str | None = None,
        group_id: str | None = None,
        prompt_hashes: list[int] | None = None,
        block_size: int | None = None,
        arrival_s: float | None = None,
        finish_s: float | None = None,
        tool_gap_s: float = 0.0,
        session_end: bool | None = None,
    ) -> TraceRecord:
        """Validate and append one request. Raises SimError on a bad value (nothing is written)."""
        turn = self._turns.get(session_id, 0)
        obj = TraceRecord(
            session_id=session_id, workload_class=workload_class, turn=turn, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, unit_id=unit_id, group_id=group_id, tool_gap_s=tool_gap_s,
            session_end=session_end, prompt_hashes=list(prompt_hashes) if prompt_hashes is not None else None,
            block_size=block_size, arrival_s=arrival_s, finish_s=finish_s,
        ).to_json()
        rec = _check_record(obj, f"TraceWriter record for session {session_id!r}")
        self._turns[session_id] = turn + 1
        self._stream.write(json.dumps(obj) + "\n")
        self._stream.flush()
        return rec

    def close(self) -> None:
        """Close the underlying stream."""
        self._stream.close()
