"""The mixture contract between trainer and router (MISA-T section 3.3).

The trainer fixes a target mixture rho over workload classes and releases rollout units
at it; the routing layer must not distort it. ``MixtureLedger`` keeps the books per
class: released A_b, completed (delivered to the trainer) N_b, dropped for staleness,
and in flight; from them the consumed mixture, its total-variation distance to rho, and
the class backlog Q_b = A_b - N_b.
"""

from __future__ import annotations

from typing import Any, Mapping

from common.config import value_text

DEFAULT_RHO = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}
"""Target agent/rlvr/rlhf mixture of the paper's end-to-end run (MISA-T section 5), in %.
It sums to 99.9; ``normalize_mixture`` rescales it."""


class MixtureError(ValueError):
    """A mixture or ledger operation is invalid; the message says what to fix."""


def weight_number(value: Any) -> float | None:
    """``value`` as a float when it is a number (a bool is not), else None; the caller checks
    the range and names the key."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def normalize_mixture(weights: Mapping[str, float]) -> dict[str, float]:
    """Rescale non-negative class weights (fractions or percent) to sum to 1.

    Raises:
        MixtureError: not a mapping, no class, a weight that is no number, negative or not
            finite, or all weights zero.
    """
    if not isinstance(weights, Mapping):
        raise MixtureError("the target mixture must map each workload class to a weight, e.g. "
                           f"{{agent: 48.6, rlvr: 33.1, rlhf: 18.2}}; got {weights!r}")
    if not weights:
        raise MixtureError("the target mixture rho names no workload class")
    w = {}
    for k, v in weights.items():
        number = weight_number(v)
        if number is None:
            raise MixtureError(f"the weight of class {str(k)!r} is {value_text(v)}: give a number >= 0 "
                               "(0 switches the class off)")
        if not 0.0 <= number < float("inf"):
            raise MixtureError(f"the weight of class {str(k)!r} is {value_text(v)}: give a finite number >= 0 "
                               "(0 switches the class off)")
        w[str(k)] = number
    total = sum(w.values())
    if total <= 0:
        raise MixtureError(f"mixture weights sum to 0 ({w}); give at least one positive weight")
    return {k: v / total for k, v in w.items()}


def tv_distance(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """Total-variation distance D_TV(p, q) = 1/2 * sum_b |p_b - q_b| (MISA-T section 3.3).

    ``p`` and ``q`` are distributions over classes (missing classes count as 0); the
    result is in [0, 1] (multiply by 100 for percentage points).
    """
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def _fractions(counts: Mapping[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: (v / total if total else 0.0) for k, v in counts.items()}


class MixtureLedger:
    """Per-class books of rollout units: released, completed, dropped, in flight.

    Each unit moves released -> (completed | dropped) exactly once; the ledger keeps the
    ids of units in flight to catch a double report.

    Args:
        rho: target mixture (weights, normalised here); classes outside it may still be
            recorded and count as target 0.

    Raises:
        MixtureError: see ``normalize_mixture``; on recording, a unit id released twice or
            finished without being in flight.
    """

    def __init__(self, rho: Mapping[str, float]):
        self.rho = normalize_mixture(rho)
        classes = list(self.rho)
        self.released_units: dict[str, int] = dict.fromkeys(classes, 0)
        self.completed_units: dict[str, int] = dict.fromkeys(classes, 0)
        self.dropped_units: dict[str, int] = dict.fromkeys(classes, 0)
        self._in_flight: dict[str, str] = {}  # unit_id -> workload class

    def _class(self, workload_class: str) -> None:
        for d in (self.released_units, self.completed_units, self.dropped_units):
            d.setdefault(workload_class, 0)

    def record_released(self, unit_id: str, workload_class: str) -> None:
        """A unit left the trainer (A_b += 1)."""
        if unit_id in self._in_flight:
            raise MixtureError(f"rollout unit {unit_id} released twice")
        self._class(workload_class)
        self.released_units[workload_class] += 1
        self._in_flight[unit_id] = workload_class

    def _finish(self, unit_id: str, book: dict[str, int], what: str) -> str:
        b = self._in_flight.pop(unit_id, None)
        if b is None:
            raise MixtureError(f"rollout unit {unit_id} {what} but it is not in flight "
                               "(never released, or already completed/dropped)")
        book[b] += 1
        return b

    def record_completed(self, unit_id: str) -> str:
        """A complete sample reached the trainer (N_b += 1); returns its class."""
        return self._finish(unit_id, self.completed_units, "completed")

    def record_dropped(self, unit_id: str) -> str:
        """A unit was discarded as too stale to train on; returns its class."""
        return self._finish(unit_id, self.dropped_units, "dropped")

    def in_flight(self, workload_class: str | None = None) -> int:
        """Units released and not yet completed or dropped (of one class, or all)."""
        if workload_class is None:
            return len(self._in_flight)
        return sum(1 for b in self._in_flight.values() if b == workload_class)

    def backlog(self) -> dict[str, int]:
        """Q_b = A_b - N_b per class (MISA-T section 3.3): released, not delivered."""
        return {b: self.released_units[b] - self.completed_units[b] for b in self.released_units}

    def consumed_mixture(self) -> dict[str, float]:
        """Class shares of the completed units (all 0 before the first completion)."""
        return _fractions(self.completed_units)

    def released_mixture(self) -> dict[str, float]:
        """Class shares of the released units."""
        return _fractions(self.released_units)

    def consumed_tv(self) -> float:
        """D_TV(consumed mixture, rho); before the first completion the consumed shares are
        all 0, so it is 1/2 (sum of rho) = 0.5."""
        return tv_distance(self.consumed_mixture(), self.rho)

    def released_tv(self) -> float:
        """D_TV(released mixture, rho)."""
        return tv_distance(self.released_mixture(), self.rho)

    def snapshot(self) -> dict[str, Any]:
        """Everything for a log line: counts, mixtures, distances, backlog."""
        return {"released": dict(self.released_units), "completed": dict(self.completed_units),
                "dropped": dict(self.dropped_units),
                "in_flight": {b: self.in_flight(b) for b in self.released_units},
                "backlog": self.backlog(), "consumed_mixture": self.consumed_mixture(),
                "target_mixture": dict(self.rho), "consumed_tv": self.consumed_tv(),
                "released_tv": self.released_tv()}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint."""
        return {"rho": dict(self.rho), "released": dict(self.released_units),
                "completed": dict(self.completed_units), "dropped": dict(self.dropped_units),
                "in_flight": dict(self._in_flight)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict`` output.

        Raises:
            MixtureError: the saved target mixture differs from this ledger's.
        """
        saved = normalize_mixture(state["rho"])
        if tv_distance(saved, self.rho) > 1e-9:
            raise MixtureError(f"checkpoint was written for rho={saved}, this run has "
                               f"rho={self.rho}; resume with the same mixture")
        self.released_units = dict(state["released"])
        self.completed_units = dict(state["completed"])
        self.dropped_units = dict(state["dropped"])
        self._in_flight = dict(state["in_flight"])
