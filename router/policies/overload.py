"""The overload controller of the admission policies (MISA-T Eq. 8, section 4.1).

Per instance: metric samples are grouped into windows (``router.estimators.MetricWindows``);
each closed window gives the hit rate h_hat and whether the engine queue persisted. The gap
G_w = max(0, h* - h_hat) to the reference hit rate h* (mean of recent healthy windows) is
pressure when it exceeds ``pressure_gap``; pressure confirmed over ``confirm_windows``
windows while h_hat is not recovering (or a persistent queue over as many windows)
contracts the operating cap multiplicatively; healthy windows grow it back by
``recovery_step`` until it reaches the base cap. ``session_admission`` (and the policies
built on it: ``misa``, ``misa_t``) hold one :class:`OverloadControl` per instance.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

from router.estimators import MetricWindow, MetricWindows
from router.policies.base import InstanceMetrics


class OverloadConfig(Protocol):
    """The options the controller reads (``SessionAdmissionConfig`` has them, with the
    reason for each default)."""

    window_s: float
    min_window_queries_tokens: float
    reference_windows: int
    min_reference_windows: int
    pressure_gap: float
    confirm_windows: int
    max_recovery_slope: float
    contraction_factor: float
    recovery_step: int
    prefill_rate_windows: int


def _slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (0 for fewer than 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(values))
    return num / sum((i - mean_x) ** 2 for i in range(n))


class OverloadControl:
    """One instance's overload detector and operating cap (MISA-T Eq. 8, section 4.1).

    ``cap_limit`` is None while uncontracted (K_w = K_base), else the contracted K_w.
    """

    def __init__(self, config: OverloadConfig) -> None:
        self.config = config
        self.windows = MetricWindows(config.window_s, config.min_window_queries_tokens)
        self.healthy_hit_rates: deque[float] = deque(maxlen=config.reference_windows)
        self.recent_hit_rates: deque[float] = deque(maxlen=config.confirm_windows)
        self.prefill_rates: deque[float] = deque(maxlen=config.prefill_rate_windows)
        self.cap_limit: int | None = None
        self.pressure_streak = self.queue_streak = self.healthy_streak = 0
        self.h_star: float | None = None
        self.h_hat: float | None = None
        self.gap: float | None = None
        self.contractions = self.recoveries = 0

    def on_sample(self, metrics: InstanceMetrics, now: float, cap: int, base_cap: int) -> MetricWindow | None:
        """Take one metric sample; on a closed window update pressure and the cap. ``cap``
        is the current K_w, ``base_cap`` K_base."""
        window = self.windows.add(metrics, now)
        if window is not None:
            self.on_window(window, cap, base_cap)
        return window

    def on_window(self, window: MetricWindow, cap: int, base_cap: int) -> None:
        """Eq. 8 with confirmation, slope check, contraction and recovery (see module doc)."""
        cfg = self.config
        if window.prefill_tokens_per_s > 0:
            self.prefill_rates.append(window.prefill_tokens_per_s)
        h_hat = self.h_hat = window.hit_rate
        enough = len(self.healthy_hit_rates) >= cfg.min_reference_windows
        h_star = self.h_star = sum(self.healthy_hit_rates) / len(self.healthy_hit_rates) if enough else None
        # G_w = max(0, h*_w - h_hat_w)  (MISA-T Eq. 8)
        self.gap = max(0.0, h_star - h_hat) if h_star is not None and h_hat is not None else None
        hit_pressure = self.gap is not None and self.gap > cfg.pressure_gap
        if h_hat is not None:
            self.recent_hit_rates.append(h_hat)
        self.pressure_streak = self.pressure_streak + 1 if hit_pressure else 0
        self.queue_streak = self.queue_streak + 1 if window.queue_persistent else 0
        not_recovering = _slope(list(self.recent_hit_rates)) <= cfg.max_recovery_slope
        confirmed = (self.pressure_streak >= cfg.confirm_windows and not_recovering) or (
            self.queue_streak >= cfg.confirm_windows
        )
        if confirmed:
            self.cap_limit = max(1, math.floor(cfg.contraction_factor * cap))
            self.contractions += 1
            self.pressure_streak = self.queue_streak = self.healthy_streak = 0
        elif not hit_pressure and not window.queue_persistent:
            if h_hat is not None:
                self.healthy_hit_rates.append(h_hat)
            self.healthy_streak += 1
            if self.cap_limit is not None and self.healthy_streak >= cfg.confirm_windows:
                self.cap_limit += cfg.recovery_step
                self.recoveries += 1
                if self.cap_limit >= base_cap:
                    self.cap_limit = None
        else:
            self.healthy_streak = 0

    def prefill_tokens_per_s(self) -> float | None:
        """F_w: best measured prefill throughput over recent windows, or None."""
        return max(self.prefill_rates) if self.prefill_rates else None
