"""Online estimators the admission policies share: bounded histories and metric windows.

- :class:`BoundedHistory`: the last ``maxlen`` samples of a quantity (completed-session
  KV blocks, residency seconds) kept sorted, with O(1) quantile and mean; "moving window" in the
  paper's words (MISA-T section 4.1, 4.2).
- :class:`MetricWindows`: turns one instance's stream of cumulative Prometheus counters
  (``InstanceMetrics``) into fixed-length windows: prefix hit rate h_hat over the window
  (differenced hits / differenced queries, MISA-T Eq. 8), whether the waiting queue stayed
  non-empty, and the prefill throughput (differenced prompt tokens per second).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing router.policies here would be circular (policies use this module)
    from router.policies.base import InstanceMetrics


class BoundedHistory:
    """The last ``maxlen`` float samples, kept in arrival order and sorted.

    An append costs O(maxlen) memory moves (``bisect.insort`` and the removal of the
    evicted sample) and no sort; :meth:`quantile` and :meth:`mean` are O(1). The live
    router appends once per finished session and reads on every decision.
    """

    __slots__ = ("_samples", "_sorted", "_sum", "_appends")

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError(f"history length must be >= 1, got {maxlen}")
        self._samples: deque[float] = deque(maxlen=maxlen)
        self._sorted: list[float] = []
        self._sum = 0.0
        self._appends = 0

    def append(self, value: float) -> None:
        value = float(value)
        samples = self._samples
        if len(samples) == samples.maxlen:
            old = samples[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
            self._sum -= old
        samples.append(value)
        bisect.insort(self._sorted, value)
        self._appends += 1
        if self._appends % (4 * samples.maxlen) == 0:  # type: ignore[operator]
            self._sum = math.fsum(samples)  # no drift from long runs of += and -=
        else:
            self._sum += value

    def __len__(self) -> int:
        return len(self._samples)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0-1, nearest rank, upper side: conservative). Raises ValueError if empty."""
        if not self._samples:
            raise ValueError("quantile of an empty history")
        n = len(self._sorted)
        return self._sorted[min(n - 1, max(0, math.ceil(q * n) - 1))]

    def mean(self) -> float:
        """Arithmetic mean. Raises ValueError if empty."""
        if not self._samples:
            raise ValueError("mean of an empty history")
        return self._sum / len(self._samples)


@dataclass(frozen=True)
class MetricWindow:
    """One closed metric window of an instance.

    Attributes:
        start_s, end_s: window bounds on the caller's clock.
        hit_rate: prefix hit rate h_hat over the window (hits/queries, tokens), or None
            when fewer than ``min_queries_tokens`` prompt tokens were queried.
        queue_persistent: ``num_requests_waiting > 0`` in every sample of the window.
        prefill_tokens_per_s: prompt tokens the engine processed per second.
    """

    start_s: float
    end_s: float
    hit_rate: float | None
    queue_persistent: bool
    prefill_tokens_per_s: float


class MetricWindows:
    """Cut one instance's metric samples into windows of at least ``window_s`` seconds."""

    def __init__(self, window_s: float, min_queries_tokens: float) -> None:
        self.window_s = window_s
        self.min_queries_tokens = min_queries_tokens
        self._start: tuple[float, InstanceMetrics] | None = None
        self._queue_always = True

    def add(self, metrics: InstanceMetrics, now: float) -> MetricWindow | None:
        """Take one sample; return the window it closes, or None.

        A counter that went backwards (engine restart) discards the open window.
        """
        if self._start is None:
            self._start, self._queue_always = (now, metrics), metrics.num_requests_waiting > 0
            return None
        start_s, first = self._start
        self._queue_always = self._queue_always and metrics.num_requests_waiting > 0
        if now - start_s < self.window_s:
            return None
        queries = metrics.prefix_cache_queries_total - first.prefix_cache_queries_total
        hits = metrics.prefix_cache_hits_total - first.prefix_cache_hits_total
        prompt = metrics.prompt_tokens_total - first.prompt_tokens_total
        queue = self._queue_always
        self._start, self._queue_always = (now, metrics), metrics.num_requests_waiting > 0
        if queries < 0 or hits < 0 or prompt < 0:
            return None  # counters reset: engine restarted
        hit_rate = hits / queries if queries >= self.min_queries_tokens and queries > 0 else None
        return MetricWindow(start_s, now, hit_rate, queue, prompt / (now - start_s))
