"""pass@k and pass^k from n samples per problem, with a confidence interval over problems.

For one problem with n samples of which c are correct:

- pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Eq. 1)
  is the probability that at least one of k samples drawn without replacement from the n
  is correct; its unbiased estimator is ``1 - C(n-c, k) / C(n, k)``. The binomials
  overflow for large n, so it is computed as the product
  ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (the numerically stable form of the paper's
  Fig. 3), which is exactly 1 when ``n - c < k`` (every k-subset holds a correct sample).
- pass^k (Yao et al. 2024, tau-bench) is the probability that all k of k samples are
  correct; its unbiased estimator is ``C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c-i)/(n-i)``,
  0 when ``c < k``.

A benchmark's figure is the mean over problems; its 95% confidence interval is the normal
interval ``mean +- z * s / sqrt(P)`` over the P per-problem estimates (s: their sample
standard deviation), clipped to [0, 1]. With one problem there is no spread to estimate
and the interval is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

Z_95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal."""


def _check(n: int, c: int, k: int) -> None:
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 samples and 0 <= c <= n correct, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; k={k} with n={n} samples is undefined "
                         "(draw at least k samples per problem)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, Eq. 1).

    Args:
        n: samples drawn for the problem (>= 1).
        c: correct samples among them (0..n).
        k: budget (1..n).

    Returns:
        A probability in [0, 1]; 1.0 when ``n - c < k``, 0.0 when ``c == 0``.

    Raises:
        ValueError: ``n``, ``c`` or ``k`` out of range (``k > n`` included).
    """
    _check(n, c, k)
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the ratio of binomials as a product of terms in (0, 1].
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one problem: ``C(c, k) / C(n, k)`` (all k samples correct).

    Args and Raises: as ``pass_at_k``.

    Returns:
        A probability in [0, 1]; 0.0 when ``c < k``, 1.0 when ``c == n``.
    """
    _check(n, c, k)
    if c < k:
        return 0.0
    i = np.arange(k, dtype=np.float64)
    return float(np.prod((c - i) / (n - i)))


@dataclass(frozen=True)
class Estimate:
    """A benchmark-level figure: the mean over problems and its 95% interval.

    Attributes:
        mean: mean of the per-problem estimates.
        ci_low, ci_high: normal 95% interval over problems, clipped to [0, 1]; None with
            fewer than two problems.
        num_problems: problems averaged.
    """

    mean: float
    ci_low: float | None
    ci_high: float | None
    num_problems: int

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {"mean": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high,
                "num_problems": self.num_problems}


def mean_with_ci(values: Sequence[float], z: float = Z_95) -> Estimate:
    """Mean of per-problem values with the normal interval ``mean +- z * s / sqrt(P)``.

    Raises:
        ValueError: ``values`` is empty.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no problems to average")
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, None, None, 1)
    half = z * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), int(x.size))


def summarize(counts: Sequence[tuple[int, int]], ks: Sequence[int]) -> dict[str, Estimate]:
    """pass@k and pass^k over problems for every k in ``ks``.

    Args:
        counts: one ``(n, c)`` per problem (samples, correct samples).
        ks: budgets; each must be <= every problem's n.

    Returns:
        ``{"pass@1": Estimate, "pass^1": Estimate, ...}`` in the order of ``ks``.

    Raises:
        ValueError: no problems, or a k out of range for some problem's n.
    """
    out: dict[str, Estimate] = {}
    for k in ks:
        out[f"pass@{k}"] = mean_with_ci([pass_at_k(n, c, k) for n, c in counts])
        out[f"pass^{k}"] = mean_with_ci([pass_hat_k(n, c, k) for n, c in counts])
    return out
