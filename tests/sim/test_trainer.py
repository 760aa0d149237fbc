"""The trainer model: mixture-following releases under the ceiling, unit completion, backlog."""

from __future__ import annotations

import pytest

from router.sim.errors import SimError
from router.sim.trace import TraceRecord, TraceSession
from router.sim.trainer import Trainer


def pool(cls: str, groups: int, g: int) -> list[TraceSession]:
    out = []
    for i in range(groups):
        for k in range(g):
            sid = f"{cls}-{i}-{k}"
            out.append(TraceSession(sid, cls, sid, f"{cls}-{i}", [TraceRecord(sid, cls, 0, 10, 10)]))
    return out


def test_releases_follow_the_target_mixture_and_respect_the_ceiling():
    t = Trainer(pool("a", 100, 1) + pool("b", 100, 1), {"a": 3, "b": 1}, ceiling=8)
    out = t.release(0.0)
    assert len(out) == 8 and t.in_flight == 8
    done = 0
    while not t.done and done < 150:
        s = out.pop(0)
        t.complete(s.unit_id, float(done))
        out += t.release(float(done))
        assert t.in_flight <= 8
        done += 1
    assert t.released["a"] / sum(t.released.values()) == pytest.approx(0.75, abs=0.02)


def test_groups_are_released_whole_and_backlog_counts_unfinished_units():
    t = Trainer(pool("a", 10, 4), {"a": 1}, ceiling=10)
    out = t.release(0.0)
    assert len(out) == 8  # two whole groups of 4; a third would pass the ceiling
    t.complete(out[0].unit_id, 1.0)
    assert t.backlog() == {"a": 7}


def test_stops_releasing_when_a_class_pool_runs_dry():
    t = Trainer(pool("a", 2, 1) + pool("b", 100, 1), {"a": 1, "b": 1}, ceiling=100)
    t.release(0.0)
    assert t.stopped_s == 0.0
    assert t.released["a"] == 2 and t.released["b"] <= 3


def test_a_mixture_class_without_sessions_is_an_error():
    with pytest.raises(SimError, match="no 'c' sessions; give mixture.c=0"):
        Trainer(pool("a", 1, 1), {"a": 1, "c": 1}, ceiling=4)


def test_a_session_class_the_mixture_does_not_name_is_an_error_not_dropped():
    with pytest.raises(SimError, match=r"class 'b', which the target mixture .* does not name; .*mixture.b=10"):
        Trainer(pool("a", 1, 1) + pool("b", 1, 1), {"a": 1}, ceiling=4)
    t = Trainer(pool("a", 2, 1) + pool("b", 2, 1), {"a": 1, "b": 0}, ceiling=4)  # share 0: left out, on purpose
    t.release(0.0)
    assert t.released == {"a": 2}
