"""router.sim.calibrate without an engine: which decode shapes are measured."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from aiohttp import web

from router.sim.calibrate import (cached_prefill_shapes, fitting_shapes, measure_step_samples, mixed_step_shapes,
                                  step_samples_from_timeline)
from router.sim.cost_model import LinearStepCost, fit_linear_step_cost, prefill_attention_pairs
from tests.http_app import serving


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


def test_live_run_intervals_become_mean_steps():
    # engine 0, 0-5 s: 100 steps, 2,000 computed prompt tokens, 400 generated, KV 0.25 -> 0.75
    # of 64 x 128 tokens; engine 1 had nothing running at 0 s (it may have idled): left out;
    # 5-10 s: engine 0 took 2 steps (< min_steps 3): left out, engine 1 60 steps; 10-15 s: engine 0
    # took 4 steps of 1.25 s (slow steps are kept: the threshold must not select fast ones).
    timeline = [
        {"t_s": 0.0, "running": [2, 0], "kv_usage": [0.25, 0.0], "steps": [100, 50], "computed_prompt": [1000, 0],
         "generated": [500, 0]},
        {"t_s": 5.0, "running": [4, 3], "kv_usage": [0.75, 0.5], "steps": [200, 60], "computed_prompt": [3000, 0],
         "generated": [900, 40]},
        {"t_s": 10.0, "running": [1, 2], "kv_usage": [0.5, 0.5], "steps": [202, 120], "computed_prompt": [3100, 600],
         "generated": [910, 160]},
        {"t_s": 15.0, "running": [3, 0], "kv_usage": [0.5, 0.5], "steps": [206, 125], "computed_prompt": [3900, 600],
         "generated": [950, 170]},
        {"t_s": 20.0, "running": [1, 2], "kv_usage": [0.5, 0.5]},  # recorded before steps were scraped: skipped
    ]
    samples = step_samples_from_timeline(timeline, num_blocks=64, block_size=128)
    assert [(s.prefill_tokens, s.decode_seqs, s.context_tokens) for s in samples] == [
        (20.0, 4.0, 4096.0), (10.0, 2.0, 4096.0), (200.0, 10.0, 4096.0)]
    assert samples[0].step_time_s == pytest.approx(0.05) and samples[1].step_time_s == pytest.approx(5 / 60)
    assert samples[2].step_time_s == pytest.approx(1.25)


def test_a_profile_is_recovered_from_live_run_intervals():
    # a run whose every interval of 100 steps has its own batch mix; the step time follows a
    # known profile with the interval's context (mean KV usage of its two ends)
    truth = LinearStepCost(c0_s=0.03, c_prefill_s=0.0012, c_decode_s=0.0015, c_context_s=2e-6)
    mixes = [(0, 4), (50, 8), (200, 2), (10, 16), (120, 12), (0, 24), (300, 6), (30, 20), (80, 10), (5, 30)]
    usage = [0.2, 0.4, 0.3, 0.8, 0.6, 0.9, 0.5, 0.7, 0.5, 0.95, 0.4]  # at each sample
    t = steps = prompt = gen = 0.0
    timeline = []
    for i, (p, d) in enumerate(mixes):
        timeline.append({"t_s": t, "running": [d], "kv_usage": [usage[i]], "steps": [steps],
                         "computed_prompt": [prompt], "generated": [gen]})
        context = 0.5 * (usage[i] + usage[i + 1]) * 64 * 128
        t += 100 * truth.step_time_s(p, d, context)
        steps, prompt, gen = steps + 100, prompt + 100 * p, gen + 100 * d
    timeline.append({"t_s": t, "running": [1], "kv_usage": [usage[-1]], "steps": [steps],
                     "computed_prompt": [prompt], "generated": [gen]})
    samples = step_samples_from_timeline(timeline, num_blocks=64, block_size=128)
    assert len(samples) == len(mixes)
    fitted = fit_linear_step_cost(samples)
    for name in ("c0_s", "c_prefill_s", "c_decode_s", "c_context_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_chunk_counts_let_the_fit_see_mixed_steps_and_attention_over_cached_prefixes():
    # Each 100-step interval: k prefill chunks of n new tokens after c cached, one per step,
    # and d sequences decoding in every step; a step with a chunk costs the chunk's tokens,
    # its attention over the cached prefix and the mixed-step cost on top of the decodes.
    truth = LinearStepCost(c0_s=0.03, c_prefill_s=0.001, c_decode_s=0.0015, c_context_s=0.0,
                           c_attention_s=4e-7, c_mixed_s=0.025)
    mixes = [(0, 0, 0, 4), (5, 200, 0, 8), (20, 64, 1024, 6), (10, 256, 512, 12), (40, 32, 1536, 10),
             (2, 800, 0, 3), (30, 128, 256, 16), (60, 16, 1024, 5), (15, 400, 800, 20), (50, 100, 0, 2)]
    ctx = 0.5 * 64 * 128
    t = steps = computed = prompt = prefills = gen = 0.0
    timeline = []
    for k, n, c, d in mixes:
        timeline.append({"t_s": t, "running": [d], "kv_usage": [0.5], "steps": [steps], "computed_prompt": [computed],
                         "prompt": [prompt], "prefills": [prefills], "generated": [gen]})
        chunk = truth.step_time_s(n, d, ctx, ctx + prefill_attention_pairs(n, c) - (n + c)) if k else 0.0
        t += k * chunk + (100 - k) * truth.step_time_s(0, d, ctx)
        steps, computed, prompt, prefills, gen = steps + 100, computed + k * n, prompt + k * (n + c), prefills + k, gen + 100 * d
    timeline.append({"t_s": t, "running": [1], "kv_usage": [0.5], "steps": [steps], "computed_prompt": [computed],
                     "prompt": [prompt], "prefills": [prefills], "generated": [gen]})
    samples = step_samples_from_timeline(timeline, num_blocks=64, block_size=128)
    assert [s.mixed_steps for s in samples] == [k / 100 for k, *_ in mixes]
    assert samples[0].attention_pairs == ctx  # no chunk: one query per context token
    fitted = fit_linear_step_cost(samples, fit_context=False)
    for name in ("c0_s", "c_prefill_s", "c_decode_s", "c_attention_s", "c_mixed_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    # the same run without the chunk counts (runs recorded before them): both terms unknown, 0
    old = [{k: v for k, v in p.items() if k not in ("prefills", "prompt")} for p in timeline]
    blind = step_samples_from_timeline(old, num_blocks=64, block_size=128)
    assert all(s.mixed_steps is None and s.attention_pairs is None for s in blind)
    assert fit_linear_step_cost(blind, fit_context=False).c_mixed_s == 0.0


def test_an_interval_of_prefills_alone_has_no_mixed_steps():
    timeline = [{"t_s": 0.0, "running": [1], "kv_usage": [0.1], "steps": [0], "computed_prompt": [0], "prompt": [0],
                 "prefills": [0], "generated": [0]},
                {"t_s": 2.0, "running": [1], "kv_usage": [0.1], "steps": [20], "computed_prompt": [4000],
                 "prompt": [4000], "prefills": [20], "generated": [20]}]  # 20 one-token answers, nothing else decoded
    [s] = step_samples_from_timeline(timeline, num_blocks=64, block_size=128)
    assert s.mixed_steps == 0.0 and s.prefill_tokens == 200.0
    assert s.attention_pairs == pytest.approx(s.context_tokens + prefill_attention_pairs(200, 0) - 200)


def test_cached_prefill_shapes_round_the_prefix_to_whole_blocks():
    # 1,024-token prompt, blocks of 128: 256 or 64 new after 1,024 or 128 cached
    assert cached_prefill_shapes(1024, 128) == [(256, 1024), (64, 1024), (64, 128), (256, 128)]
    # blocks of 48: 1,024 -> 1,008 and 128 -> 96 (full blocks only)
    assert cached_prefill_shapes(1024, 48) == [(256, 1008), (64, 1008), (64, 96), (256, 96)]
    # at least one block, but never more than the prompt: 32 tokens -> one block of 128
    assert cached_prefill_shapes(256, 128) == [(64, 256), (16, 256), (16, 128), (64, 128)]
    assert cached_prefill_shapes(64, 128) == [] and cached_prefill_shapes(16, 4096) == []
    assert cached_prefill_shapes(1, None) == [(1, 1)] and cached_prefill_shapes(2, 16) == []
    assert cached_prefill_shapes(1024, None)[2] == (64, 128)


@contextlib.contextmanager
def _counting_engine(s_per_token: float = 0.0):
    """A fake /v1/completions on its own loop (measure_step_samples runs its own): answers
    after ``s_per_token`` x max_tokens and records each prompt's word count."""
    seen: list[int] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(len(body["prompt"].split()))
        await asyncio.sleep(s_per_token * body["max_tokens"])
        return web.json_response({"choices": [{"text": "x"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    cm = serving(app)
    try:
        url = asyncio.run_coroutine_threadsafe(cm.__aenter__(), loop).result(10)
        yield url, seen
    finally:
        asyncio.run_coroutine_threadsafe(cm.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_cached_prefix_prefills_send_the_prefix_first_and_know_their_pairs():
    with _counting_engine() as (url, seen):
        samples = measure_step_samples([url], "m", _Words(), prompt_tokens=64, decode_tokens=2, repeats=1,
                                       decode_shapes=((1, 4),), block_size=16, mixed_shapes=False)
    # warm-up, one decode shape (1-token and 3-token answers), the cold prompt, then per
    # cached shape (16 or 4 new after 64 or 16 cached) the prefix alone and prefix + new
    assert seen == [32, 4, 4, 64, 64, 80, 64, 68, 16, 20, 16, 32]
    prefills = [(s.prefill_tokens, s.context_tokens, s.attention_pairs) for s in samples if s.decode_seqs == 0]
    assert prefills == [(64, 64, prefill_attention_pairs(64, 0))] + [
        (n, c + n, prefill_attention_pairs(n, c)) for n, c in ((16, 64), (4, 64), (4, 16), (16, 16))]
    assert samples[0].attention_pairs is None  # a decode step: one query per sequence


def test_mixed_step_shapes_fit_the_engines_and_round_the_prefix():
    # 1,024-token prompt, blocks of 128, decode_tokens 32: each decoding sequence 64 + 128 + 1
    # tokens = 2 blocks; 16 sequences + a 256-after-1,024 chunk = 32 + 10 = 42 blocks
    assert mixed_step_shapes(1024, 128, 64, 64, 32) == [(8, 256, 0), (8, 64, 1024), (16, 128, 512), (16, 256, 1024)]
    # 40 blocks: 90% = 36 -> the 16-sequence shapes (40 and 42 blocks) are left out
    assert mixed_step_shapes(1024, 128, 40, 64, 32) == [(8, 256, 0), (8, 64, 1024)]
    # max_num_seqs 16: 16 sequences leave no room for the chunk
    assert mixed_step_shapes(1024, 128, 64, 16, 32) == [(8, 256, 0), (8, 64, 1024)]
    assert mixed_step_shapes(1024, None, None, None, 32) == [(8, 256, 0), (8, 64, 1024), (16, 128, 512),
                                                            (16, 256, 1024)]


def test_a_chunk_inside_a_decoding_batch_is_one_mixed_step():
    # each answer takes 20 ms per token: 8 sequences decode 4 x 8 = 32 tokens (640 ms) while
    # 64-token chunks (one token, 20 ms) go in one after another from 2 decode steps after the
    # batch's 1-token answers; a chunk's step is its latency minus half a decode step (20 ms)
    with _counting_engine(s_per_token=0.02) as (url, seen):
        samples = measure_step_samples([url], "m", _Words(), prompt_tokens=256, decode_tokens=8, repeats=1,
                                       decode_shapes=((1, 4),), block_size=16)
    mixed = [s for s in samples if s.mixed_steps == 1.0]
    assert [(s.prefill_tokens, s.decode_seqs) for s in mixed] == [(64, 8), (16, 8), (32, 16), (64, 16)]
    assert all(s.mixed_steps == 0.0 for s in samples if s not in mixed)
    first = mixed[0]
    assert first.context_tokens == 8 * (64 + 16) + 64
    assert first.attention_pairs == 8 * (64 + 16) + prefill_attention_pairs(64, 0)
    assert first.step_time_s == pytest.approx(0.02 - 0.01, abs=0.015)
    # the 4 chunks of 16 new tokens went in after their 256-token prefix (and one cached-prefix
    # prefill of that shape before)
    assert seen.count(256 + 16) == 1 + 4


def test_a_batch_that_ends_before_any_chunk_is_answered_gives_no_mixed_step():
    # answers at once: the batch is over before a chunk goes in
    with _counting_engine() as (url, _):
        samples = measure_step_samples([url], "m", _Words(), prompt_tokens=256, decode_tokens=4, repeats=1,
                                       decode_shapes=((1, 4),), block_size=16)
    assert samples and all(s.mixed_steps == 0.0 for s in samples)
