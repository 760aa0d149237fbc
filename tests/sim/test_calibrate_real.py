"""router.sim.calibrate on a real vLLM engine: measured steps give a usable step-cost profile."""

from __future__ import annotations

import pytest

from router.sim.calibrate import measure_step_samples
from tests.conftest import SERVED_NAME
from router.sim.cost_model import fit_linear_step_cost

pytestmark = pytest.mark.engine


def test_calibration_measures_every_shape_and_fits_a_profile(real_engine_url, model_path):
    from transformers import AutoTokenizer

    from router.replay import WordText

    text = WordText(AutoTokenizer.from_pretrained(model_path))
    samples = measure_step_samples([real_engine_url], SERVED_NAME, text, prompt_tokens=256,
                                   decode_tokens=8, repeats=1, decode_shapes=((1, 64), (8, 64), (4, 200), (999, 64)),
                                   max_num_seqs=64, block_size=128)  # the CPU engine's block size
    # (999, 64) is over max_num_seqs: skipped; then the cold prompt and 64 or 16 new tokens
    # after 256 or 128 cached (whole blocks); then chunks inside decoding batches (a shape
    # whose batch ended before a chunk was answered gives none)
    assert [(s.prefill_tokens, s.decode_seqs) for s in samples[:8]] == [
        (0, 1), (0, 8), (0, 4), (256, 0), (64, 0), (16, 0), (16, 0), (64, 0)]
    assert [s.context_tokens for s in samples[3:8]] == [256, 320, 272, 144, 192]
    assert samples[2].context_tokens == 4 * (200 + 4)
    mixed = samples[8:]
    assert mixed and set((s.prefill_tokens, s.decode_seqs) for s in mixed) <= {(64, 8), (16, 8), (32, 16), (64, 16)}
    assert all(s.mixed_steps == 1.0 for s in mixed) and all(s.mixed_steps == 0.0 for s in samples[:8])
    assert all(s.step_time_s > 0 for s in samples)
    cost = fit_linear_step_cost(samples)
    assert cost.step_time_s(256, 0, 256) > 0 and cost.step_time_s(0, 16, 16 * 100) > 0

