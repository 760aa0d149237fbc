"""router.sim.calibrate without an engine: which decode shapes are measured."""

from __future__ import annotations

import pytest

from router.sim.calibrate import fitting_shapes, measure_step_samples


def test_shapes_that_do_not_fit_the_engines_are_skipped():
    # 10 blocks of 16 tokens: 90% = 9 blocks. (4, 20): 4 x ceil(29/16) = 8 blocks, kept;
    # (4, 40): 4 x 4 = 16, skipped; (2, 40): 8, kept; 70 sequences > max_num_seqs 64.
    shapes = ((4, 20), (4, 40), (2, 40), (70, 1))
    assert fitting_shapes(shapes, 8, kv_blocks=10, block_size=16, max_num_seqs=64) == [(4, 20), (2, 40)]
    assert fitting_shapes(shapes, 8, None, None, None) == list(shapes)


def test_no_fitting_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="no decode shape"):
        measure_step_samples(["http://127.0.0.1:9"], "m", None, decode_shapes=((100, 64),), max_num_seqs=8)


def test_an_engine_that_does_not_answer_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"calibration request to http://127\.0\.0\.1:9 failed: .*did the engine stop"):
        measure_step_samples(["http://127.0.0.1:9"], "m", _Words(), decode_shapes=((1, 4),), repeats=1)


class _Words:
    """A stand-in for router.replay.WordText: n words."""

    def text(self, key: str, n: int) -> str:
        return " w" * n
