"""The session ledger (MISA-T section 4.4): who holds protected KV capacity where.

Per instance w it keeps the active set O_w (sessions visible in a cache snapshot), the
pending set P_w (admitted, not yet visible: MISA-T Eq. 6), and globally the held sessions
(per workload class, in arrival order) and a bounded record of finished ones. Each
session carries its class, group, observed KV blocks (max over its requests of
(prompt + completion tokens) / block size) and timestamps (first seen, admission, first
start, last activity, end). Completed sessions feed per-class bounded histories of
KV footprint and residency seconds (admission -> end, tool gaps included).

The footprint history holds, per ``footprint``:
- ``time_averaged`` (default): the session's block-seconds divided by its residency,
  Z_s / T_s of MISA-T Eq. 2 (Z_s = ∫ k_s(t) dt). k_s(t) is taken as piecewise linear
  between the ledger's observations of the session's *largest* footprint so far (a
  running max: a later, shorter prompt does not lower it): 0 at admission, the prompt
  blocks when a request starts, prompt + completion blocks when it finishes, and constant
  from the last observation to the end. Decode growth is thus linear within a request;
  across a tool gap the line ramps from the turn's end size to the next prompt (which
  holds the tool output), counting the tool output from the gap's start, a slight
  overestimate on the conservative side. A session closed by the idle timeout includes
  the idle wait at its final size, which pulls its average toward that size. This is
  what an admitted session holds on average, so k̄_b T_b approximates the class's
  block-time demand as Eq. 2 intends.
- ``final``: the largest observed footprint (by the running max, its size at the end),
  which overstates the time average 2-3x for sessions that grow (agents) or decode long
  (RLVR).

Every operation is O(1) amortised except :meth:`SessionLedger.mark_visible` (O(|P_w|))
and :meth:`SessionLedger.unbind_instance` (O(|O_w| + |P_w|)). Idle expiry is O(expired):
protected or rebound sessions with no request in flight sit in one insertion-ordered
dict by last activity, so the oldest is always first; held sessions leave by admission,
by :meth:`SessionLedger.abandon_hold` when their client leaves, or, if nobody re-decides
them, by :meth:`SessionLedger.forget_abandoned_holds`. The ledger never reads a clock: callers pass
``now`` (seconds).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

from router.estimators import BoundedHistory

NEW, HELD, PENDING, ACTIVE, REBOUND = "new", "held", "pending", "active", "rebound"
"""Session states: NEW (seen, never decided), HELD, PENDING (in P_w), ACTIVE (in O_w),
REBOUND (its instance was lost; it must re-acquire admission)."""

HOLD_CAP, HOLD_CACHE, HOLD_NO_INSTANCE = "cap", "cache", "no_instance"
"""Why a session is held: no cap headroom (FIFO within its class), waiting for its cached
instance (MISA-T Eq. 7), or no healthy instance."""


class SessionRecord:
    """One unfinished session. Mutable; owned by the ledger (read it, do not write it)."""

    __slots__ = (
        "session_id", "workload_class", "group_id", "state", "instance", "cached_instance",
        "first_seen_s", "admitted_s", "started_s", "last_activity_s", "turn_starts_s", "turns", "in_flight",
        "observed_blocks", "end_requested", "held_since_s", "hold_reason", "last_decided_s",
        "floor_admitted", "block_seconds", "last_observed_s", "last_observed_blocks",
    )  # fmt: skip

    def __init__(self, session_id: str, workload_class: str, *, group_id: str | None, now: float) -> None:
        self.session_id = session_id
        self.workload_class = workload_class
        self.group_id = group_id
        self.state = NEW
        self.instance: str | None = None  # bound instance while PENDING/ACTIVE
        self.cached_instance: str | None = None  # last bound instance (REBOUND / re-acquiring)
        self.first_seen_s = now
        self.admitted_s: float | None = None
        self.started_s: float | None = None  # first request started (pending -> visible)
        self.last_activity_s = now
        self.turn_starts_s = array("d")  # start time of each turn (8 bytes per turn)
        self.turns = 0
        self.in_flight = 0
        self.observed_blocks = 0
        self.end_requested = False
        self.held_since_s: float | None = None
        self.hold_reason: str | None = None
        self.last_decided_s = now
        self.floor_admitted = False
        self.block_seconds = 0.0  # ∫ k_s(t) dt since admission up to last_observed_s (Eq. 2)
        self.last_observed_s: float | None = None
        self.last_observed_blocks = 0

    def time_averaged_blocks(self, now: float) -> float | None:
        """Z_s / T_s (MISA-T Eq. 2): mean KV blocks held from admission to ``now``; None
        before admission. Piecewise linear between observations, constant after the last."""
        if self.admitted_s is None or self.last_observed_s is None:
            return None
        residency = now - self.admitted_s
        if residency <= 0:
            return float(self.observed_blocks)
        tail = self.last_observed_blocks * max(0.0, now - self.last_observed_s)
        return (self.block_seconds + tail) / residency

    def _integrate(self, now: float, blocks: int) -> None:
        """Add the trapezoid from the last observation to (now, blocks) to ``block_seconds``."""
        if self.last_observed_s is None:
            return
        dt = now - self.last_observed_s
        if dt > 0:
            self.block_seconds += 0.5 * (self.last_observed_blocks + blocks) * dt
            self.last_observed_s = now
        self.last_observed_blocks = blocks

    @property
    def protected(self) -> bool:
        """In O_w or P_w of its instance."""
        return self.state in (PENDING, ACTIVE)


def _joins(candidate: SessionRecord | None, workload_class: str | None) -> bool:
    """``candidate`` is an unprotected session with observed blocks, of ``workload_class``
    (any class for None): admitting it adds it to the protected mean."""
    return (candidate is not None and not candidate.protected and candidate.observed_blocks > 0
            and (workload_class is None or candidate.workload_class == workload_class))


@dataclass(frozen=True)
class FinishedSession:
    """A closed session: where it ran, why it closed, its KV blocks and residency seconds."""

    session_id: str
    workload_class: str
    instance: str | None
    reason: str
    observed_blocks: int
    residency_s: float | None
    time_averaged_blocks: float | None
    turns: int
    ended_s: float


class SessionLedger:
    """Active / pending / held / finished sessions, with per-class completed histories.

    Args:
        history_len: samples kept per class (and over all classes) of completed-session
            KV footprint (blocks) and residency seconds.
        finished_keep: finished sessions remembered (to recognise a re-acquiring
            continuation after an idle timeout, and for /state).
        footprint: what the footprint histories hold per completed session:
            ``time_averaged`` (Z_s / T_s, MISA-T Eq. 2) or ``final`` (its largest observed
            blocks); see the module docstring.

    Raises:
        ValueError: ``footprint`` is neither.
    """

    def __init__(self, history_len: int = 256, finished_keep: int = 4096, footprint: str = "time_averaged") -> None:
        if footprint not in ("time_averaged", "final"):
            raise ValueError(f"footprint must be 'time_averaged' or 'final', got {footprint!r}")
        self.footprint = footprint
        self.history_len = history_len
        self.finished_keep = finished_keep
        self._sessions: dict[str, SessionRecord] = {}
        self._pending: dict[str, dict[str, SessionRecord]] = {}
        self._active: dict[str, dict[str, SessionRecord]] = {}
        self._class_n: dict[str, dict[str, int]] = {}  # instance -> class -> |O ∪ P| of that class
        self._held: dict[str, OrderedDict[str, SessionRecord]] = {}  # class -> arrival order
        # protected, nothing in flight; oldest first (OrderedDict: O(1) first item after pops)
        self._idle: OrderedDict[str, SessionRecord] = OrderedDict()
        self._group_visible: dict[str, int] = {}
        # class -> sum of observed blocks / number of protected sessions with observed blocks > 0
        self._protected_blocks: dict[str, int] = {}
        self._protected_n: dict[str, int] = {}
        self._finished: OrderedDict[str, FinishedSession] = OrderedDict()
        self.blocks_history: dict[str, BoundedHistory] = {}
        self.residency_history: dict[str, BoundedHistory] = {}
        self.blocks_history_all = BoundedHistory(history_len)
        self.ended_by_reason: dict[str, int] = {}
        self.abandoned_holds = 0

    # ------------------------------------------------------------------ lookups

    def session(self, session_id: str) -> SessionRecord | None:
        """The unfinished session ``session_id``, or None."""
        return self._sessions.get(session_id)

    def finished(self, session_id: str) -> FinishedSession | None:
        """The remembered finished session ``session_id``, or None."""
        return self._finished.get(session_id)

    def class_counts(self, instance: str) -> dict[str, int]:
        """``{class: |O_w ∪ P_w| of that class}`` on ``instance`` (do not mutate)."""
        return self._class_n.get(instance, {})

    def protected_count(self, instance: str) -> int:
        """|O_w| + |P_w| (MISA-T Eq. 6)."""
        return len(self._pending.get(instance, ())) + len(self._active.get(instance, ()))

    def active_count(self, instance: str) -> int:
        return len(self._active.get(instance, ()))

    def pending_count(self, instance: str) -> int:
        return len(self._pending.get(instance, ()))

    def held_counts(self) -> dict[str, int]:
        """``{class: held sessions}``."""
        return {b: len(q) for b, q in self._held.items() if q}

    def held_sessions(self) -> list[SessionRecord]:
        """Held sessions, class by class, each class in arrival order."""
        return [rec for q in self._held.values() for rec in q.values()]

    def earlier_cap_hold(self, rec: SessionRecord) -> SessionRecord | None:
        """The earliest session of ``rec``'s class held for cap headroom, if it is not ``rec``.

        Within a class, cap-held sessions are admitted in arrival order: a later one must
        not jump an earlier one.
        """
        for other in self._held.get(rec.workload_class, {}).values():
            if other.hold_reason == HOLD_CAP:
                return None if other is rec else other
        return None

    def visible_siblings(self, group_id: str | None) -> int:
        """Active (visible) sessions of GRPO group ``group_id``."""
        return self._group_visible.get(group_id, 0) if group_id is not None else 0

    def protected_mean_blocks(self, workload_class: str, candidate: SessionRecord | None = None) -> float | None:
        """Mean observed KV blocks of the class's protected sessions (all instances), or None.

        Only sessions with observed blocks count: a session admitted but not yet started
        has no footprint to average (counting it as 0 would lower the estimate).
        ``candidate``: an unprotected session evaluated for admission; its observed blocks
        (a rebound or re-acquiring session has some) count as if it were admitted, so the
        mean seen at the decision is the one that holds right after it.
        """
        n = self._protected_n.get(workload_class, 0)
        blocks = self._protected_blocks.get(workload_class, 0)
        if _joins(candidate, workload_class):
            n, blocks = n + 1, blocks + candidate.observed_blocks
        return blocks / n if n else None

    def protected_mean_blocks_all(self, candidate: SessionRecord | None = None) -> float | None:
        """Mean observed KV blocks of all protected sessions with observed blocks (and of
        ``candidate``, as in :meth:`protected_mean_blocks`), or None if there are none."""
        n = sum(self._protected_n.values())
        blocks = sum(self._protected_blocks.values())
        if _joins(candidate, None):
            n, blocks = n + 1, blocks + candidate.observed_blocks
        return blocks / n if n else None

    def protected_sessions(self, instance: str) -> list[SessionRecord]:
        return [*self._pending.get(instance, {}).values(), *self._active.get(instance, {}).values()]

    def __len__(self) -> int:
        """Unfinished sessions tracked."""
        return len(self._sessions)

    # ------------------------------------------------------------------ transitions

    def open(self, session_id: str, workload_class: str, group_id: str | None, now: float) -> SessionRecord:
        """The session's record, created (state NEW) if unknown."""
        rec = self._sessions.get(session_id)
        if rec is None:
            rec = self._sessions[session_id] = SessionRecord(session_id, workload_class, group_id=group_id, now=now)
        return rec

    def hold(self, rec: SessionRecord, reason: str, now: float) -> None:
        """Hold ``rec`` (it stays in the demand ledger); keeps its place in its class queue."""
        if rec.state != HELD:
            rec.cached_instance = rec.instance or rec.cached_instance
            if rec.protected:
                self._unprotect(rec)
            self._idle.pop(rec.session_id, None)  # held sessions leave by admission or abandonment
            rec.state, rec.held_since_s = HELD, now
            self._held.setdefault(rec.workload_class, OrderedDict())[rec.session_id] = rec
        rec.hold_reason, rec.last_decided_s = reason, now

    def admit(self, rec: SessionRecord, instance: str, now: float, floor: bool = False) -> None:
        """Bind ``rec`` to ``instance`` as pending (P_w). ``floor``: admitted by the max(1, .) floor."""
        if rec.state == HELD:
            del self._held[rec.workload_class][rec.session_id]
        rec.state, rec.instance, rec.hold_reason = PENDING, instance, None
        rec.floor_admitted = floor
        rec.last_decided_s = now
        if rec.admitted_s is None:
            rec.admitted_s = now
            rec.last_observed_s, rec.last_observed_blocks = now, 0
        self._pending.setdefault(instance, {})[rec.session_id] = rec
        counts = self._class_n.setdefault(instance, {})
        counts[rec.workload_class] = counts.get(rec.workload_class, 0) + 1
        if rec.observed_blocks:
            b = rec.workload_class
            self._protected_n[b] = self._protected_n.get(b, 0) + 1
            self._protected_blocks[b] = self._protected_blocks.get(b, 0) + rec.observed_blocks
        if rec.in_flight == 0:
            self._touch_idle(rec, now)

    def request_started(self, session_id: str, now: float, prompt_blocks: int) -> None:
        """A request of ``session_id`` was forwarded at ``now`` with ``prompt_blocks`` KV blocks."""
        rec = self._sessions.get(session_id)
        if rec is None:
            return
        rec.in_flight += 1
        rec.turns += 1
        rec.turn_starts_s.append(now)
        rec.last_activity_s = now
        if rec.started_s is None:
            rec.started_s = now
        self._idle.pop(session_id, None)
        self._observe_blocks(rec, prompt_blocks, now)

    def request_finished(self, session_id: str, now: float, blocks: int, session_end: bool) -> FinishedSession | None:
        """A request of ``session_id`` finished; ``blocks`` = (prompt + completion) KV blocks.

        Returns the finished session if this closed it (``session_end`` and nothing else
        in flight), else None.
        """
        rec = self._sessions.get(session_id)
        if rec is None:
            return None
        rec.in_flight = max(0, rec.in_flight - 1)
        rec.last_activity_s = now
        rec.end_requested = rec.end_requested or session_end
        self._observe_blocks(rec, blocks, now)
        if rec.in_flight:
            return None
        if rec.end_requested:
            return self.end(session_id, now, "end")
        if rec.protected or rec.state == REBOUND:
            self._touch_idle(rec, now)
        return None

    def abandon_hold(self, session_id: str, now: float) -> FinishedSession | None:
        """A held request of ``session_id`` was dropped before admission (its client left).

        A held session with nothing in flight is not a live session: it is closed at once
        (reason ``abandoned_hold``), so it neither counts as demand nor keeps later sessions
        of its class queued behind it until ``forget_abandoned_holds``. One with another
        request still in flight only leaves the held queue (state REBOUND: it re-acquires
        admission if it continues, and idles out otherwise). A session that is not held is
        left as it is (the dropped request never started, so it changes no count).

        Returns:
            The finished session if this closed it, else None.
        """
        rec = self._sessions.get(session_id)
        if rec is None or rec.state != HELD:
            return None
        if rec.in_flight:
            del self._held[rec.workload_class][session_id]
            rec.state, rec.hold_reason, rec.held_since_s = REBOUND, None, None
            return None
        self.abandoned_holds += 1
        return self.end(session_id, now, "abandoned_hold")

    def mark_visible(self, instance: str, snapshot_s: float) -> int:
        """A metric or KV snapshot of ``instance`` taken at ``snapshot_s``: pending sessions whose
        first request started before it become active (P_w -> O_w). Returns how many moved."""
        pending = self._pending.get(instance)
        if not pending:
            return 0
        moved = [r for r in pending.values() if r.started_s is not None and r.started_s < snapshot_s]
        active = self._active.setdefault(instance, {})
        for rec in moved:
            del pending[rec.session_id]
            active[rec.session_id] = rec
            rec.state = ACTIVE
            if rec.group_id is not None:
                self._group_visible[rec.group_id] = self._group_visible.get(rec.group_id, 0) + 1
        return len(moved)

    def unbind(self, rec: SessionRecord) -> None:
        """``rec``'s instance is unhealthy or gone: it leaves O_w/P_w and must re-acquire admission."""
        if rec.protected:
            rec.cached_instance = rec.instance
            self._unprotect(rec)
            rec.state = REBOUND
            if rec.in_flight == 0:  # a rebound session nobody continues idles out like any other
                self._touch_idle(rec, rec.last_activity_s)

    def unbind_instance(self, instance: str) -> int:
        """Unbind every protected session of ``instance``; returns how many."""
        recs = self.protected_sessions(instance)
        for rec in recs:
            self.unbind(rec)
        return len(recs)

    def end(self, session_id: str, now: float, reason: str) -> FinishedSession | None:
        """Close ``session_id`` (``reason``: "end", "idle_timeout", ...); feeds the class histories."""
        rec = self._sessions.pop(session_id, None)
        if rec is None:
            return None
        instance = rec.instance or rec.cached_instance
        if rec.protected:
            self._unprotect(rec)
        elif rec.state == HELD:
            del self._held[rec.workload_class][session_id]
        self._idle.pop(session_id, None)
        residency = now - rec.admitted_s if rec.admitted_s is not None else None
        averaged = rec.time_averaged_blocks(now)
        if residency is not None and rec.observed_blocks > 0:
            b = rec.workload_class
            footprint = rec.observed_blocks if self.footprint == "final" else averaged
            self.blocks_history.setdefault(b, BoundedHistory(self.history_len)).append(footprint)
            self.residency_history.setdefault(b, BoundedHistory(self.history_len)).append(residency)
            self.blocks_history_all.append(footprint)
        done = FinishedSession(session_id, rec.workload_class, instance, reason, rec.observed_blocks, residency,
                               averaged, rec.turns, now)
        self._finished[session_id] = done
        self._finished.move_to_end(session_id)
        while len(self._finished) > self.finished_keep:
            self._finished.popitem(last=False)
        self.ended_by_reason[reason] = self.ended_by_reason.get(reason, 0) + 1
        return done

    def expire_idle(self, now: float, idle_timeout_s: float) -> list[FinishedSession]:
        """Close protected sessions with nothing in flight and no activity for ``idle_timeout_s``."""
        out = []
        while self._idle:
            session_id, rec = next(iter(self._idle.items()))
            if now - rec.last_activity_s < idle_timeout_s:
                break
            del self._idle[session_id]  # progress even if the record is already gone
            done = self.end(session_id, now, "idle_timeout")
            if done is not None:
                out.append(done)
        return out

    def forget_abandoned_holds(self, now: float, bound_s: float) -> int:
        """Drop held sessions not re-decided for ``bound_s`` (their caller gave up); returns how many.

        Only queue heads are examined, so an abandoned request cannot block its class.
        """
        dropped = 0
        for queue in self._held.values():
            while queue:
                session_id, rec = next(iter(queue.items()))
                if now - rec.last_decided_s < bound_s:
                    break
                del queue[session_id]
                rec.state = NEW  # no longer in a held queue
                self.end(session_id, now, "abandoned_hold")
                dropped += 1
        self.abandoned_holds += dropped
        return dropped

    # ------------------------------------------------------------------ internals

    def _touch_idle(self, rec: SessionRecord, now: float) -> None:
        self._idle.pop(rec.session_id, None)
        rec.last_activity_s = max(rec.last_activity_s, now)
        self._idle[rec.session_id] = rec

    def _observe_blocks(self, rec: SessionRecord, blocks: int, now: float) -> None:
        rec._integrate(now, max(blocks, rec.observed_blocks))
        if blocks > rec.observed_blocks:
            if rec.protected:
                b = rec.workload_class
                if not rec.observed_blocks:  # its first observation: it joins the protected mean
                    self._protected_n[b] = self._protected_n.get(b, 0) + 1
                self._protected_blocks[b] = self._protected_blocks.get(b, 0) + blocks - rec.observed_blocks
            rec.observed_blocks = blocks

    def _unprotect(self, rec: SessionRecord) -> None:
        w, b = rec.instance, rec.workload_class
        if rec.state == ACTIVE:
            del self._active[w][rec.session_id]
            if rec.group_id is not None:
                left = self._group_visible[rec.group_id] - 1
                if left:
                    self._group_visible[rec.group_id] = left
                else:
                    del self._group_visible[rec.group_id]
        else:
            del self._pending[w][rec.session_id]
        counts = self._class_n[w]
        counts[b] -= 1
        if not counts[b]:
            del counts[b]
        if rec.observed_blocks:
            self._protected_n[b] -= 1
            self._protected_blocks[b] -= rec.observed_blocks
        self._idle.pop(rec.session_id, None)
        rec.instance = None

    def state(self, now: float) -> dict:
        """Sizes for /state: per instance active/pending, held per class, oldest hold age."""
        instances = sorted(set(self._pending) | set(self._active))
        held = self.held_sessions()
        return {
            "sessions_tracked": len(self._sessions),
            "active": {w: self.active_count(w) for w in instances},
            "pending": {w: self.pending_count(w) for w in instances},
            "held": self.held_counts(),
            "held_total": len(held),
            "oldest_hold_age_s": max((now - r.held_since_s for r in held), default=0.0),
            "finished_remembered": len(self._finished),
            "ended_by_reason": dict(self.ended_by_reason),
            "abandoned_holds": self.abandoned_holds,
            "history_samples": {b: len(h) for b, h in self.blocks_history.items()},
        }
