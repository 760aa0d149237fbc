"""Fit the simulator's step-cost profile to live vLLM engines (the "CPU-fitted profile").

:func:`measure_step_samples` times a few request shapes on every engine at once (so the
contention between engines that share a machine is in the numbers) and turns each into an
engine step of known batch (:class:`~router.sim.cost_model.StepSample`):

- decode batches over the range a loaded engine runs (:data:`DECODE_SHAPES`: 1 to 48
  concurrent sequences, short and long contexts): (time of an n+1-token answer - time of a
  1-token answer) / n is one decode step of that batch. Both the batch and the context must
  vary: a fit to small batches of short contexts alone (1, 8 and 16 sequences of ~80 tokens,
  the first version) found no per-sequence cost, and a simulator with it ran 30 long
  sequences as fast as 1 (its throughput rose with the ceiling far more than the engines');
- a cold prompt of ``prefill_tokens`` (answer of 1 token): one prefill step (a longer
  prompt than the engine's ``max_num_batched_tokens`` would be split; keep it below);
- chunks of new tokens after a cached prefix (:data:`CACHED_PREFILL_SHAPES`: a sixteenth
  and a quarter of ``prefill_tokens`` new, after an eighth and all of it cached): the prefix
  is sent first (1-token answer), then prefix + new words, so only the new tokens are
  computed, over the whole context. Cached length and chunk size both vary, which is what
  separates the attention of a chunk over its cached prefix (``c_attention_s``) from the cost
  of its tokens (the first version timed one chunk, a quarter over the whole prompt; a
  profile without the attention term missed the other shapes by 11-15% on the CPU engines);
- chunks sent into a running decode batch (:data:`MIXED_SHAPES`): ``streams`` sequences
  decode while ``chunks_per_batch`` prefill chunks (new tokens after a cached prefix, as
  above) are sent one after another; a chunk's answer of 1 token comes at the end of the
  step that computed it, which started on average half a decode step after the chunk
  arrived, so that step took the chunk's latency minus half the batch's decode step. Only
  chunks answered while the batch still decoded count. These steps mix a prefill chunk with
  decodes, as most steps of a loaded engine do, and cost more than the chunk alone plus the
  decodes (``c_mixed_s``): on the CPU engines a profile fitted to prefill-only and
  decode-only steps missed these by 6-19%, and real runs' 5-s intervals with 2-150 prefill
  tokens per step took 49-75% longer than it said.

Every shape is measured ``repeats`` times and the median kept. A shape whose sequences do
not fit in the engines' KV cache (or exceed ``max_num_seqs``) is skipped: a preempted
sequence would time recomputation, not a decode step. Prompts use fresh words
per measurement so nothing hits the prefix cache by accident.
:func:`step_samples_from_timeline` derives steps from a live run instead: the mean step of
each interval between two metric samples, from the engines' step and token counters.
:func:`router.sim.cost_model.fit_linear_step_cost` turns the samples into the profile.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import uuid
from typing import Sequence

import aiohttp

from common.http_client import tcp_connector
from router.sim.cost_model import StepSample, prefill_attention_pairs

#: (new tokens, cached tokens) of the cached-prefix prefill measurements, as fractions of
#: ``prefill_tokens`` (1,024 in the CPU benchmark: 64 or 256 new after 128 or 1,024 cached).
CACHED_PREFILL_SHAPES: tuple[tuple[float, float], ...] = ((1 / 4, 1.0), (1 / 16, 1.0), (1 / 16, 1 / 8), (1 / 4, 1 / 8))

#: (decoding sequences, new tokens, cached tokens) of the mixed-step measurements, the token
#: counts as fractions of ``prefill_tokens`` (1,024 in the CPU benchmark: 256 cold or 64 after
#: 1,024 cached into 8 decoding sequences; 128 after 512 or 256 after 1,024 into 16).
MIXED_SHAPES: tuple[tuple[int, float, float], ...] = ((8, 1 / 4, 0.0), (8, 1 / 16, 1.0), (16, 1 / 8, 1 / 2),
                                                      (16, 1 / 4, 1.0))

#: Prompt tokens of each decoding sequence of a mixed-step measurement.
MIXED_DECODE_PROMPT_TOKENS = 64

#: A mixed-step measurement's sequences decode this many times ``decode_tokens``, so that
#: they still decode while its chunks go in one after another.
MIXED_BATCH_DECODE_FACTOR = 4

#: (concurrent sequences, prompt tokens) of the decode measurements: the batch sizes and
#: contexts a loaded engine runs (the CPU benchmark's engines hold 8,192 KV tokens and run
#: 10-48 sequences of 100-600 tokens, and at light load a few agent sequences of 1,000-2,000;
#: with its 64 blocks of 128 every shape here fits). The last two reach the contexts the
#: engines run full (6,000-8,000 tokens; before them the shapes stopped at ~4,800). They were
#: added because live decode-only intervals at 6,000-9,000 context tokens took 1.40x the
#: fitted profile's step (70 intervals of 6 runs; 1.04x under 2,000); on idle engines they
#: took what the profile extrapolated (70 and 115 ms, within 3-7%, rr-long), so the context
#: term is not that gap, and they are kept because they cover the range the engines run.
DECODE_SHAPES: tuple[tuple[int, int], ...] = ((1, 64), (8, 64), (16, 64), (32, 64), (48, 64), (8, 512),
                                              (16, 300), (24, 200), (4, 1536), (18, 320))


async def _timed_completion(http: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int) -> float:
    t0 = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0}
    try:
        async with http.post(f"{url}/v1/completions", json=body) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"calibration request to {url} failed: HTTP {r.status}: {text[:200]}")
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise RuntimeError(f"calibration request to {url} failed: {e!r} (did the engine stop? see its log)") from None
    return time.perf_counter() - t0


async def _batch_time(http, urls, model, text, prompt_tokens: int, streams: int, max_tokens: int) -> float:
    """Wall time of ``streams`` concurrent fresh prompts per engine, on every engine at once; median per engine."""
    tag = uuid.uuid4().hex

    async def engine(url: str) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(_timed_completion(http, url, model, text.text(f"cal:{tag}:{url}:{i}", prompt_tokens),
                                                 max_tokens) for i in range(streams)))
        return time.perf_counter() - t0

    return statistics.median(await asyncio.gather(*(engine(u) for u in urls)))


def fitting_shapes(shapes: Sequence[tuple[int, int]], decode_tokens: int, kv_blocks: int | None,
                   block_size: int | None, max_num_seqs: int | None) -> list[tuple[int, int]]:
    """The decode shapes whose sequences all fit at once: at most ``max_num_seqs`` of them,
    and their KV blocks (each sequence ``ceil((prompt + decode_tokens + 1) / block_size)``) at
    most 90% of ``kv_blocks``. ``None`` limits are not checked."""
    kept = []
    for streams, prompt in shapes:
        if max_num_seqs is not None and streams > max_num_seqs:
            continue
        if kv_blocks is not None and block_size:
            if streams * math.ceil((prompt + decode_tokens + 1) / block_size) > 0.9 * kv_blocks:
                continue
        kept.append((streams, prompt))
    return kept


async def _decode_step(http, urls, model, text, prompt: int, streams: int, decode_tokens: int) -> tuple[float, float]:
    """(one decode step of ``streams`` sequences of ``prompt`` tokens, the time of their
    1-token answers) in s: (time of ``decode_tokens`` + 1 tokens - time of 1) / ``decode_tokens``."""
    t1 = await _batch_time(http, urls, model, text, prompt, streams, 1)
    tn = await _batch_time(http, urls, model, text, prompt, streams, decode_tokens + 1)
    return max(tn - t1, 1e-6) / decode_tokens, t1


async def _chunks_in_batch(http, url: str, model: str, text, streams: int, decode_tokens: int, new: int,
                           cached: int, chunks: int, start_after_s: float) -> list[float]:
    """Latencies (s) of ``chunks`` prefill chunks (``new`` fresh tokens after a cached prefix of
    ``cached``) sent one after another into a batch of ``streams`` sequences decoding
    ``decode_tokens`` tokens on one engine, starting ``start_after_s`` after the batch; only
    those answered while the batch still decoded."""
    tag = uuid.uuid4().hex
    prefix = text.text(f"cal:mixprefix:{tag}", cached) if cached else ""
    if cached:
        await _timed_completion(http, url, model, prefix, 1)  # into the prefix cache
    batch = [asyncio.create_task(_timed_completion(http, url, model, text.text(
        f"cal:mixdec:{tag}:{i}", MIXED_DECODE_PROMPT_TOKENS), decode_tokens)) for i in range(streams)]
    try:
        await asyncio.sleep(start_after_s)
        kept = []
        for k in range(chunks):
            if any(t.done() for t in batch):
                break
            latency = await _timed_completion(http, url, model, prefix + text.text(f"cal:mixnew:{tag}:{k}", new), 1)
            if not any(t.done() for t in batch):
                kept.append(latency)
        await asyncio.gather(*batch)
    finally:
        for t in batch:
            t.cancel()
    return kept


async def _measure(urls: Sequence[str], model: str, text, prompt_tokens: int, decode_tokens: int,
                   repeats: int, shapes: Sequence[tuple[int, int]],
                   cached_shapes: Sequence[tuple[int, int]],
                   mixed_shapes: Sequence[tuple[int, int, int]] = (), chunks_per_batch: int = 4) -> list[StepSample]:
    samples: list[StepSample] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), connector=tcp_connector()) as http:
        await _batch_time(http, urls, model, text, 32, 1, 4)  # warm-up
        for streams, prompt in shapes:
            steps = [(await _decode_step(http, urls, model, text, prompt, streams, decode_tokens))[0]
                     for _ in range(repeats)]
            ctx = streams * (prompt + decode_tokens // 2)
            samples.append(StepSample(0, streams, ctx, statistics.median(steps), mixed_steps=0.0))
        cold = []
        warm: dict[tuple[int, int], list[float]] = {shape: [] for shape in cached_shapes}
        for _ in range(repeats):
            tag = uuid.uuid4().hex

            async def one(url: str, tag: str = tag) -> tuple[float, list[float]]:
                c = await _timed_completion(http, url, model, text.text(f"cal:cold:{tag}", prompt_tokens), 1)
                w = []
                for new, cached in cached_shapes:
                    prefix = text.text(f"cal:prefix:{tag}:{new}:{cached}", cached)
                    await _timed_completion(http, url, model, prefix, 1)  # into the prefix cache
                    w.append(await _timed_completion(http, url, model,
                                                     prefix + text.text(f"cal:new:{tag}:{new}", new), 1))
                return c, w

            times = await asyncio.gather(*(one(u) for u in urls))
            cold.append(statistics.median(t[0] for t in times))
            for j, shape in enumerate(cached_shapes):
                warm[shape].append(statistics.median(t[1][j] for t in times))
        samples.append(StepSample(prompt_tokens, 0, prompt_tokens, statistics.median(cold),
                                  prefill_attention_pairs(prompt_tokens, 0), mixed_steps=0.0))
        for (new, cached), ts in warm.items():
            samples.append(StepSample(new, 0, cached + new, statistics.median(ts), prefill_attention_pairs(new, cached),
                                      mixed_steps=0.0))
        batch_tokens = MIXED_BATCH_DECODE_FACTOR * decode_tokens
        for streams, new, cached in mixed_shapes:
            steps, latencies = [], []
            for _ in range(repeats):  # the batch's own decode step, timed beside its chunks (engines drift)
                step, t1 = await _decode_step(http, urls, model, text, MIXED_DECODE_PROMPT_TOKENS, streams,
                                              decode_tokens)
                steps.append(step)
                per_engine = await asyncio.gather(*(_chunks_in_batch(
                    http, u, model, text, streams, batch_tokens, new, cached, chunks_per_batch,
                    start_after_s=t1 + 2 * step) for u in urls))
                latencies += [t for kept in per_engine for t in kept]
            if not latencies:  # every batch ended before a chunk was answered: nothing mixed
                continue
            step = statistics.median(steps)
            dec_ctx = streams * (MIXED_DECODE_PROMPT_TOKENS + batch_tokens // 2)
            samples.append(StepSample(new, streams, dec_ctx + cached + new,
                                      max(statistics.median(latencies) - step / 2, 1e-6),
                                      dec_ctx + prefill_attention_pairs(new, cached), mixed_steps=1.0))
    return samples


def mixed_step_shapes(prompt_tokens: int, block_size: int | None, kv_blocks: int | None, max_num_seqs: int | None,
                      decode_tokens: int,
                      fractions: Sequence[tuple[int, float, float]] = MIXED_SHAPES) -> list[tuple[int, int, int]]:
    """(decoding sequences, new tokens, cached tokens) of each mixed-step measurement:
    ``fractions`` of ``prompt_tokens`` as in :func:`cached_prefill_shapes` (cached 0 stays 0:
    a cold chunk), left out where the sequences and one chunk with its prefix would not fit
    at once: more than ``max_num_seqs`` - 1 sequences, or over 90% of ``kv_blocks`` (each
    sequence ``ceil((MIXED_DECODE_PROMPT_TOKENS + MIXED_BATCH_DECODE_FACTOR * decode_tokens
    + 1) / block_size)`` blocks). ``None`` limits are not checked."""
    out: list[tuple[int, int, int]] = []
    for streams, f_new, f_cached in fractions:
        new = max(1, int(prompt_tokens * f_new))
        cached = int(prompt_tokens * f_cached)
        if cached and block_size:  # whole blocks, at least one; a cold chunk stays cold
            cached = max(block_size, cached // block_size * block_size)
        if cached > prompt_tokens or (max_num_seqs is not None and streams > max_num_seqs - 1):
            continue
        if kv_blocks is not None and block_size:
            need = (streams * math.ceil((MIXED_DECODE_PROMPT_TOKENS + MIXED_BATCH_DECODE_FACTOR * decode_tokens + 1)
                                        / block_size)
                    + math.ceil((cached + new) / block_size))
            if need > 0.9 * kv_blocks:
                continue
        if (streams, new, cached) not in out:
            out.append((streams, new, cached))
    return out


def cached_prefill_shapes(prompt_tokens: int, block_size: int | None,
                          fractions: Sequence[tuple[float, float]] = CACHED_PREFILL_SHAPES) -> list[tuple[int, int]]:
    """(new tokens, cached tokens) of each cached-prefix measurement: ``fractions`` of
    ``prompt_tokens``, at least 1 new token, cached tokens rounded down to whole KV blocks
    (an engine caches full blocks only; ``None``: not rounded) but at least one block; a
    shape that would then cache more than ``prompt_tokens`` (a prompt shorter than a block)
    or nothing is left out; duplicates dropped."""
    out: list[tuple[int, int]] = []
    for f_new, f_cached in fractions:
        new = max(1, int(prompt_tokens * f_new))
        cached = int(prompt_tokens * f_cached)
        if block_size:
            cached = max(block_size, cached // block_size * block_size)
        if 0 < cached <= prompt_tokens and (new, cached) not in out:
            out.append((new, cached))
    return out


def measure_step_samples(engine_urls: Sequence[str], model: str, text, prompt_tokens: int = 1024,
                         decode_tokens: int = 32, repeats: int = 3,
                         decode_shapes: Sequence[tuple[int, int]] = DECODE_SHAPES, kv_blocks: int | None = None,
                         block_size: int | None = None, max_num_seqs: int | None = None,
                         mixed_shapes: bool = True) -> list[StepSample]:
    """Measured engine steps of live engines (see the module docstring).

    Args:
        engine_urls: engine base URLs (measured concurrently, medians across engines).
        model: served model name.
        text: a :class:`router.replay.WordText` for the model's tokenizer.
        prompt_tokens: cold prompt size (tokens); keep it <= the engines' max_num_batched_tokens.
        decode_tokens: decode steps timed per decode measurement.
        repeats: measurements per shape (median kept).
        decode_shapes: (concurrent sequences, prompt tokens) per decode measurement.
        kv_blocks, block_size, max_num_seqs: the engines' limits; shapes over them are
            skipped (:func:`fitting_shapes`, :func:`mixed_step_shapes`). ``None``: not checked.
        mixed_shapes: also time chunks inside running decode batches (:data:`MIXED_SHAPES`).

    Returns:
        One decode step per kept shape, in ``decode_shapes`` order, then a cold prefill and
        one cached-prefix prefill per :func:`cached_prefill_shapes` shape (the prefills with
        their ``attention_pairs``), then one mixed step per :func:`mixed_step_shapes` shape
        of which a chunk was answered while its batch decoded; every sample with its
        ``mixed_steps`` (0 or 1).

    Raises:
        RuntimeError: an engine answered with an error or could not be reached.
        ValueError: no decode shape fits the engines.
    """
    shapes = fitting_shapes(decode_shapes, decode_tokens, kv_blocks, block_size, max_num_seqs)
    if not shapes:
        raise ValueError(f"no decode shape of {list(decode_shapes)} fits engines of {kv_blocks} KV blocks of "
                         f"{block_size} tokens and max_num_seqs {max_num_seqs}; give smaller shapes")
    mixed = mixed_step_shapes(prompt_tokens, block_size, kv_blocks, max_num_seqs, decode_tokens) if mixed_shapes else []
    return asyncio.run(_measure(engine_urls, model, text, prompt_tokens, decode_tokens, repeats, shapes,
                                cached_prefill_shapes(prompt_tokens, block_size), mixed))


def step_samples_from_timeline(timeline: Sequence[dict], num_blocks: int, block_size: int,
                               min_steps: int = 3) -> list[StepSample]:
    """The mean engine step of each busy interval of a live run (step costs *in situ*: with
    whatever else shared the machine during the run, which :func:`measure_step_samples`,
    timing shapes on idle engines, does not see).

    Args:
        timeline: :class:`router.replay.ReplayResult` timeline samples, in time order; each
            with ``t_s`` and per engine ``running``, ``kv_usage`` and the cumulative
            ``steps``, ``computed_prompt`` and ``generated`` tokens, and where recorded
            ``prompt`` tokens (hits included) and ``prefills``. Samples without ``steps``
            (runs recorded before they were scraped) give nothing.
        num_blocks, block_size: the engines' KV cache (context = KV usage x blocks x size).
        min_steps: shortest interval kept, in engine steps (fewer: too coarse a mean). Low
            on purpose: a threshold of steps per interval is one of step time (20 steps in
            the 5-s intervals of ``bench.router_real`` left out every step over 250 ms, i.e.
            the engine that took the agents' prefills at light load, whose steps ran
            230-300 ms, and most steps at c=96: the in-situ profile was fitted to the fast
            steps and read 20-32% fast at c=16 and c=32 over 6 seeds, 6-17% with 3). The
            engines' longest steps are about 1 s; 3 steps keeps steps up to 1.7 s.

    Returns:
        One :class:`StepSample` per engine and pair of consecutive samples between which
        that engine had requests running at both ends and took ``min_steps`` steps or more:
        prefill tokens = Δcomputed prompt / Δsteps, decode sequences = Δgenerated / Δsteps,
        context = mean KV usage of the two ends x num_blocks x block_size, step time =
        Δt / Δsteps (an engine with requests running steps back to back, so the interval is
        all steps). Where the samples hold ``prefills`` and ``prompt`` (k = Δprefills chunks,
        each taken as the interval's mean, n = Δcomputed / k new tokens after c = (Δprompt -
        Δcomputed) / k cached; a prompt below the step budget is one chunk): ``mixed_steps``
        = min(1, k / Δsteps) when the engine also decoded (Δgenerated > k: more tokens than
        the chunks' first ones), else 0, and ``attention_pairs`` = context + k / Δsteps x
        (n c + n(n+1)/2 - (n + c)) (:func:`router.sim.cost_model.prefill_attention_pairs`),
        so the fit can tell the cost of steps that mix a chunk with decodes and of a chunk's
        attention over its cached prefix from that of tokens (interval means without them
        cannot: on the CPU engines agent turns, short answers over long cached histories,
        took 1.1-1.5 s longer in a light-load run than a simulator fitted that way said,
        while long decodes were within 10%). Otherwise both stay None (unknown).
    """
    out: list[StepSample] = []
    pts = [p for p in timeline if p.get("steps")]
    for a, b in zip(pts, pts[1:]):
        dt = b["t_s"] - a["t_s"]
        for i in range(min(len(a["steps"]), len(b["steps"]))):
            steps = b["steps"][i] - a["steps"][i]
            if dt <= 0 or steps < min_steps or not (a["running"][i] and b["running"][i]):
                continue
            computed = max(0.0, b["computed_prompt"][i] - a["computed_prompt"][i])
            generated = max(0.0, b["generated"][i] - a["generated"][i])
            context = 0.5 * (a["kv_usage"][i] + b["kv_usage"][i]) * num_blocks * block_size
            mixed = pairs = None
            if all(len(p.get(key) or ()) > i for p in (a, b) for key in ("prefills", "prompt")):
                chunks = max(0.0, b["prefills"][i] - a["prefills"][i])
                mixed, pairs = 0.0, context
                if chunks > 0:
                    new = computed / chunks
                    cached = max(0.0, b["prompt"][i] - a["prompt"][i] - computed) / chunks
                    if generated > chunks:
                        mixed = min(1.0, chunks / steps)
                    pairs = context + chunks / steps * max(0.0, prefill_attention_pairs(new, cached) - (new + cached))
            out.append(StepSample(prefill_tokens=computed / steps, decode_seqs=generated / steps,
                                  context_tokens=context, step_time_s=dt / steps,
                                  attention_pairs=pairs, mixed_steps=mixed))
    return out
