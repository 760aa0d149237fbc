"""BoundedHistory keeps its sorted view and sum in step with a plain window of samples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.estimators import BoundedHistory


@settings(max_examples=200, deadline=None)
@given(maxlen=st.integers(1, 12), values=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=120),
       q=st.floats(0, 1))
def test_quantile_and_mean_match_the_last_maxlen_samples(maxlen, values, q):
    history = BoundedHistory(maxlen)
    for v in values:
        history.append(v)
    window = sorted(values[-maxlen:])
    assert len(history) == len(window)
    assert history.quantile(q) == window[min(len(window) - 1, max(0, math.ceil(q * len(window)) - 1))]
    assert history.mean() == pytest.approx(sum(window) / len(window), rel=1e-9, abs=1e-6)


def test_quantile_is_nearest_rank_upper_side():
    history = BoundedHistory(4)
    for v in (10, 40, 20, 30, 50):  # 10 falls out of the window
        history.append(v)
    assert [history.quantile(q) for q in (0.0, 0.25, 0.5, 0.75, 1.0)] == [20, 20, 30, 40, 50]
    assert history.mean() == 35


def test_empty_history_and_bad_length_raise():
    with pytest.raises(ValueError, match="empty"):
        BoundedHistory(3).quantile(0.5)
    with pytest.raises(ValueError, match="empty"):
        BoundedHistory(3).mean()
    with pytest.raises(ValueError, match=">= 1"):
        BoundedHistory(0)
