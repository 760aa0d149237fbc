"""Cost model: roofline shape, least-squares fit, the CPU profile against real vLLM numbers."""

from __future__ import annotations

import pytest

from router.sim.cost_model import (
    decode_ceiling,
    HARDWARE,
    MODELS,
    LinearStepCost,
    RooflineCost,
    StepSample,
    cpu_smollm2_cost,
    cpu_smollm2_samples,
    fit_linear_step_cost,
    kv_blocks_for,
    prefill_attention_pairs,
)
from router.sim.errors import SimError


def test_roofline_decode_is_memory_bound_and_prefill_compute_bound():
    cost = RooflineCost(MODELS["step3.7-like"], HARDWARE["H200"], tp=8)
    one = cost.step_time_s(0, 1, 1000)
    many = cost.step_time_s(0, 8, 8000)
    assert many < 8 * one  # batching decode amortises the weight reads
    p1, p2 = cost.step_time_s(4096, 0, 4096), cost.step_time_s(8192, 0, 8192)
    assert p2 == pytest.approx(2 * p1 - cost.overhead_s, rel=0.05)  # compute-bound: linear in tokens


def test_roofline_h200_is_faster_than_h100_at_the_same_tp():
    m = MODELS["qwen3.6-like"]
    assert RooflineCost(m, HARDWARE["H200"], 4).step_time_s(0, 64, 64 * 20000) < RooflineCost(
        m, HARDWARE["H100"], 4).step_time_s(0, 64, 64 * 20000)


def test_fit_recovers_known_coefficients():
    truth = LinearStepCost(0.01, 0.0005, 0.002, 0.000001)
    samples = [StepSample(p, d, c, truth.step_time_s(p, d, c))
               for p, d, c in ((0, 1, 100), (0, 32, 32000), (512, 0, 512), (2048, 4, 9000), (100, 100, 50000))]
    fit = fit_linear_step_cost(samples)
    assert fit.c0_s == pytest.approx(0.01, rel=1e-6)
    assert fit.c_prefill_s == pytest.approx(0.0005, rel=1e-6)
    assert fit.c_decode_s == pytest.approx(0.002, rel=1e-6)
    assert fit.c_context_s == pytest.approx(0.000001, rel=1e-6)


def test_fit_rejects_too_few_samples():
    with pytest.raises(SimError, match="at least 4 samples"):
        fit_linear_step_cost([StepSample(0, 1, 10, 0.1)])


def test_cpu_profile_reproduces_the_measured_vllm_numbers():
    cost = cpu_smollm2_cost()
    errors = [abs(cost.step_time_s(s.prefill_tokens, s.decode_seqs, s.context_tokens) / s.step_time_s - 1)
              for s in cpu_smollm2_samples()]
    assert max(errors) < 0.25
    # the prefix-cache hit case is much faster than the cold prompt, as measured (5.08 s vs 0.65 s)
    assert cost.step_time_s(104, 0, 1000) < cost.step_time_s(1000, 0, 1000) / 4


def test_kv_blocks_for_a_model_that_does_not_fit_is_an_error():
    with pytest.raises(SimError, match="does not fit"):
        kv_blocks_for(MODELS["step3.7-like"], HARDWARE["H100"], 1, 16)
    assert kv_blocks_for(MODELS["step3.7-like"], HARDWARE["H200"], 8, 16) > 100_000


def test_fit_weighs_fast_decode_steps_as_much_as_slow_prefills():
    """Steps measured on 2 real CPU engines (bench.router_real): 35-78 ms decodes, 0.4-1.9 s
    prefills. An absolute least-squares fit let the prefills decide and gave c0 = 0, so a
    1-sequence decode came out at 5 ms against 35 ms measured."""
    samples = [StepSample(0, 1, 80, 0.0354), StepSample(0, 8, 640, 0.0455), StepSample(0, 16, 1280, 0.0778),
               StepSample(1024, 0, 1024, 1.937), StepSample(256, 0, 1280, 0.391)]
    fit = fit_linear_step_cost(samples)
    assert fit.c0_s > 0.02
    errors = [abs(fit.step_time_s(s.prefill_tokens, s.decode_seqs, s.context_tokens) / s.step_time_s - 1)
              for s in samples]
    assert max(errors) < 0.2


def test_a_chunk_over_a_long_cached_prefix_costs_its_attention():
    # 64 new tokens after 1,664 cached: (64*1664 + 64*65/2) pairs, minus one per context token
    cost = LinearStepCost(0.03, 0.001, 0.002, 1e-6, c_attention_s=3e-7)
    pairs = prefill_attention_pairs(64, 1664)
    assert pairs == 64 * 1664 + 64 * 65 / 2
    extra = pairs - (1664 + 64)
    assert cost.step_time_s(64, 0, 1728, pairs) == pytest.approx(0.03 + 0.064 + 1728e-6 + 3e-7 * extra)
    # a decode step attends one query per context token: no multi-token term, and None is the same
    assert cost.step_time_s(0, 8, 4000, 4000) == cost.step_time_s(0, 8, 4000) == pytest.approx(0.03 + 0.016 + 0.004)


def test_fit_recovers_the_attention_term_from_cached_prefix_shapes():
    truth = LinearStepCost(0.03, 0.0012, 0.0015, 3e-6, c_attention_s=3.5e-7)
    decode = [StepSample(0, d, c, truth.step_time_s(0, d, c)) for d, c in ((1, 80), (8, 640), (16, 5056), (24, 5184))]
    prefill = [StepSample(n, 0, c + n, truth.step_time_s(n, 0, c + n, prefill_attention_pairs(n, c)),
                          prefill_attention_pairs(n, c))
               for n, c in ((1024, 0), (256, 1024), (64, 1024), (64, 128), (256, 128))]
    fit = fit_linear_step_cost(decode + prefill)
    for name in ("c0_s", "c_prefill_s", "c_decode_s", "c_context_s", "c_attention_s"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    # too few samples for five terms: fitted without it
    few = [decode[0], decode[2], prefill[0], prefill[1]]
    assert fit_linear_step_cost(few).c_attention_s == 0.0
    # samples that do not know their pairs (live-run interval means) leave the term at 0
    assert fit_linear_step_cost([StepSample(s.prefill_tokens, s.decode_seqs, s.context_tokens, s.step_time_s)
                                 for s in decode + prefill]).c_attention_s == 0.0


def test_a_saved_prefill_sample_gets_its_pairs_back():
    # saved before attention_pairs existed: a prefill-only sample was n new after context - n cached
    old = StepSample.from_saved({"prefill_tokens": 256, "decode_seqs": 0, "context_tokens": 1280, "step_time_s": 0.4})
    assert old.attention_pairs == prefill_attention_pairs(256, 1024)
    cold = StepSample.from_saved({"prefill_tokens": 1024, "decode_seqs": 0, "context_tokens": 1024, "step_time_s": 1.4})
    assert cold.attention_pairs == prefill_attention_pairs(1024, 0)
    # decode samples, and samples saved with their pairs (even None), are kept as they were
    assert StepSample.from_saved({"prefill_tokens": 0, "decode_seqs": 8, "context_tokens": 640,
                                  "step_time_s": 0.04}).attention_pairs is None
    assert StepSample.from_saved({"prefill_tokens": 20, "decode_seqs": 0, "context_tokens": 4000, "step_time_s": 0.1,
                                  "attention_pairs": None}).attention_pairs is None
    with pytest.raises(TypeError):
        StepSample.from_saved({"prefill_tokens": 1, "decode_seqs": 0, "context_tokens": 1, "step_time": 0.1})


def test_a_scaled_profile_makes_every_step_longer_by_the_factor():
    cost = LinearStepCost(0.03, 0.001, 0.002, 1e-6, c_attention_s=3e-7)
    slow = cost.scaled(1.25)
    pairs = prefill_attention_pairs(64, 1024)
    assert slow.step_time_s(64, 4, 2000, pairs) == pytest.approx(1.25 * cost.step_time_s(64, 4, 2000, pairs))
    for bad in (0.0, -1.0, float("nan"), float("inf"), "2", None, True):
        with pytest.raises(SimError, match="factor must be a positive number"):
            cost.scaled(bad)


def test_a_step_that_mixes_a_chunk_with_decodes_costs_the_mixed_term():
    cost = LinearStepCost(0.03, 0.001, 0.002, 1e-6, c_attention_s=3e-7, c_mixed_s=0.05)
    pairs = 8 * 100 + prefill_attention_pairs(64, 1024)
    alone = LinearStepCost(0.03, 0.001, 0.002, 1e-6, c_attention_s=3e-7)
    assert cost.step_time_s(64, 8, 1888, pairs) == pytest.approx(alone.step_time_s(64, 8, 1888, pairs) + 0.05)
    # a prefill-only or decode-only step does not mix
    assert cost.step_time_s(64, 0, 1088, pairs) == alone.step_time_s(64, 0, 1088, pairs)
    assert cost.step_time_s(0, 8, 800) == alone.step_time_s(0, 8, 800)


def test_fit_recovers_the_mixed_term_from_chunks_inside_decode_batches():
    truth = LinearStepCost(0.03, 0.0012, 0.0015, 3e-6, c_attention_s=3.5e-7, c_mixed_s=0.06)

    def sample(n, d, c, dec_ctx=0):
        ctx, pairs = dec_ctx + (c + n if n else 0), dec_ctx + (prefill_attention_pairs(n, c) if n else 0)
        mixed = 1.0 if n and d else 0.0
        return StepSample(n, d, ctx, truth.step_time_s(n, d, ctx, pairs), pairs if n else None, mixed_steps=mixed)

    decode = [sample(0, d, 0, c) for d, c in ((1, 80), (8, 640), (16, 5056), (24, 5184))]
    prefill = [sample(n, 0, c) for n, c in ((1024, 0), (256, 1024), (64, 1024), (64, 128))]
    mixed = [sample(n, d, c, d * 192) for d, n, c in ((8, 256, 0), (8, 64, 1024), (16, 128, 512))]
    fit = fit_linear_step_cost(decode + prefill + mixed)
    for name in ("c0_s", "c_prefill_s", "c_decode_s", "c_context_s", "c_attention_s", "c_mixed_s"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    # without mixed samples, or with one sample whose share of mixed steps is unknown (a live
    # interval's mean), the term stays 0
    assert fit_linear_step_cost(decode + prefill).c_mixed_s == 0.0
    unknown = StepSample(40, 6, 3000, 0.2)
    assert fit_linear_step_cost(decode + prefill + mixed + [unknown]).c_mixed_s == 0.0


def test_saved_samples_learn_they_did_not_mix_where_their_shape_says_so():
    # saved before mixed_steps existed: decode-only and prefill-only samples did not mix
    for d in ({"prefill_tokens": 0, "decode_seqs": 8, "context_tokens": 640, "step_time_s": 0.04},
              {"prefill_tokens": 256, "decode_seqs": 0, "context_tokens": 1280, "step_time_s": 0.4}):
        assert StepSample.from_saved(d).mixed_steps == 0.0
    # an interval mean with both stays unknown; a saved value is kept
    assert StepSample.from_saved({"prefill_tokens": 20, "decode_seqs": 4, "context_tokens": 900,
                                  "step_time_s": 0.1}).mixed_steps is None
    assert StepSample.from_saved({"prefill_tokens": 20, "decode_seqs": 4, "context_tokens": 900,
                                  "step_time_s": 0.1, "mixed_steps": 1.0}).mixed_steps == 1.0


def test_the_decode_ceiling_fills_the_cache_up_to_max_num_seqs():
    # 10 ms a step + 1 ms a sequence + 1 us a context token: a step of B sequences of 1,000
    # tokens takes 10 + 2B ms, so the rate B / (0.01 + 0.002 B) rises with B
    cost = LinearStepCost(0.01, 0.0, 0.001, 0.000001)
    rate, batch = decode_ceiling(cost, kv_tokens=10_000, mean_context_tokens=1000.0, max_num_seqs=256)
    assert batch == 10 and rate == pytest.approx(10 / 0.03)  # the cache holds 10 such sequences
    rate, batch = decode_ceiling(cost, kv_tokens=10_000, mean_context_tokens=1000.0, max_num_seqs=4)
    assert batch == 4 and rate == pytest.approx(4 / 0.018)
    # a context longer than the cache still counts one sequence (a step needs one)
    assert decode_ceiling(cost, kv_tokens=500, mean_context_tokens=1000.0, max_num_seqs=8)[1] == 1


@pytest.mark.parametrize("args", [(0, 1000.0, 8), (10_000, 0.0, 8), (10_000, 1000.0, 0)])
def test_the_decode_ceiling_refuses_an_empty_cache_context_or_batch(args):
    with pytest.raises(SimError, match="decode_ceiling needs"):
        decode_ceiling(LinearStepCost(0.01, 0.0, 0.001), *args)
    with pytest.raises(SimError, match="needs a positive time"):  # a profile of all zeros
        decode_ceiling(LinearStepCost(0.0, 0.0, 0.0), 10_000, 1000.0, 8)
