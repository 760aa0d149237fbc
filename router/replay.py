"""Replay a rollout trace against a live router (or engine) over HTTP, like a trainer would.

The real-engine counterpart of :mod:`router.sim.simulator`: the same trace
(:mod:`router.sim.trace`), the same trainer model (:class:`router.sim.trainer.Trainer`:
whole GRPO groups released at the target mixture under an outer concurrency ceiling), but
every request is a real ``POST /v1/completions`` through ``url``, tool gaps are real
sleeps, and time is the wall clock.

Prompts are text, so that any router (ours, or the vLLM Router, which matches prefixes on
text) sees what a rollout worker would send. :class:`WordText` builds text of an exact
token count from words that are one token each, deterministic per key, so

- every session of a class starts with the same class prefix (system prompt), and the
  sessions of a GRPO group share the group's prompt (``class_prefix_tokens``,
  ``group_prefix_tokens`` of the trace);
- an agent session's turn k+1 prompt is turn k's prompt + the model's answer + a tool
  observation of the trace's size, so its prefix grows append-only;
- outputs have the trace's length exactly (``min_tokens`` = ``max_tokens``, ``ignore_eos``),
  sampled greedily so every router gets the same answers. No per-request ``seed``: on vLLM
  CPU (0.32) a seeded request whose sampled token is discarded (a chunked prefill) kills the
  engine core ("CPU Generator does not use offset").

The window and the figures follow :func:`router.sim.metrics.summarize` with
``warmup_frac=0``: from the first unit completion to the end of the run (``duration_s``,
or earlier if a class pool runs dry). Engine counters (prefix hits, generated tokens) are
scraped from each engine's ``/metrics`` at both window edges.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import aiohttp
import numpy as np

from common.http_client import tcp_connector
from router.headers import SessionHeaders
from router.policies.base import InstanceMetrics
from router.signals import parse_engine_metrics
from router.sim.metrics import composition, policy_caps, unit_figures, unit_output_tokens
from router.sim.trace import TraceRecord, TraceSession
from router.sim.trainer import Trainer

ROUTER_DECISIONS = "vllm_router_prefix_routing_decisions_total"
"""vllm-router 0.1.17's counter of cache_aware placements, labelled ``outcome``:
prefix_hit, prefix_miss, load_imbalance, missing_tokens."""


def router_decisions(metrics_text: str) -> dict[str, int]:
    """``{outcome: count}`` of :data:`ROUTER_DECISIONS` in a vllm-router ``/metrics`` page
    (summed over its other labels); ``{}`` when the page has none.

    Raises:
        ValueError: the page is not Prometheus text.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == ROUTER_DECISIONS and "outcome" in sample.labels:
                out[sample.labels["outcome"]] = out.get(sample.labels["outcome"], 0) + int(sample.value)
    return out


def router_hold_seconds(metrics_text: str) -> float:
    """The sum of our router's ``router_hold_seconds`` histogram (all classes) in its
    ``/metrics`` page: seconds its admitted requests spent held; 0.0 when the page has none.

    Raises:
        ValueError: the page is not Prometheus text.
    """
    from prometheus_client.parser import text_string_to_metric_families

    return sum(float(sample.value) for family in text_string_to_metric_families(metrics_text)
               for sample in family.samples if sample.name == "router_hold_seconds_sum")


class ReplayError(RuntimeError):
    """The replay could not run (bad arguments, unreachable target, a tokenizer without words)."""


class WordText:
    """Text of an exact token count: space-led words that the tokenizer keeps as one token each.

    Args:
        tokenizer: a Hugging Face tokenizer (byte-level BPE, like Llama/SmolLM2/Qwen).
        min_words: fewest usable words required.

    Raises:
        ReplayError: the vocabulary has fewer than ``min_words`` such words.
    """

    _WORD = re.compile(r"^[a-z]{3,10}$")

    def __init__(self, tokenizer, min_words: int = 1000) -> None:
        words = []
        for token, _id in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            text = tokenizer.convert_tokens_to_string([token])
            if text.startswith(" ") and self._WORD.match(text[1:]):
                words.append(text)
        # Keep only words that really encode to one token on their own.
        self.words = [w for w in words if len(tokenizer.encode(w, add_special_tokens=False)) == 1]
        if len(self.words) < min_words:
            raise ReplayError(f"the tokenizer has only {len(self.words)} one-token words (need {min_words}); "
                              "use a byte-level BPE model such as SmolLM2")

    def text(self, key: str, n_tokens: int) -> str:
        """``n_tokens`` words (about as many tokens), the same for the same ``key``."""
        if n_tokens <= 0:
            return ""
        seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
        idx = np.random.default_rng(seed).integers(0, len(self.words), n_tokens)
        return "".join(self.words[i] for i in idx)


@dataclass
class RequestRecord:
    """One request as it happened (seconds from the replay's start; tokens from the engine's usage)."""

    session_id: str
    workload_class: str
    unit_id: str
    group_id: str | None
    turn: int
    arrival_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    tool_gap_s: float
    session_end: bool
    class_prefix_tokens: int
    group_prefix_tokens: int


@dataclass
class ReplayResult:
    """What one replay measured.

    Attributes:
        summary: the figures of :func:`window_summary` (same keys as the simulator's) over
            the whole run: from the first unit completion to the end.
        after_warmup: the same figures from the first engine sample at or after
            ``warmup_s`` (and after the first completion) to the end; ``None`` when
            ``warmup_s`` is 0 or the run ended before it.
        requests: every finished request (``RequestRecord``).
        errors: one line per failed request (HTTP status and the body's start).
        timeline: periodic samples (``t_s``, per-engine KV usage, running, waiting, cumulative
            prefix queries and hits, units completed; per engine the cumulative ``steps``,
            ``computed_prompt`` (hits excluded) and ``prompt`` (hits included) tokens,
            ``prefills`` (requests that got their first token) and ``generated`` tokens, from which
            :func:`router.sim.calibrate.step_samples_from_timeline` derives its mean steps;
            per engine the cumulative ``e2e_s`` and ``e2e_n`` (engine-side request seconds and
            finished requests, vLLM's ``e2e_request_latency_seconds``) and the engine core's
            ``queue_s``, ``prefill_s``, ``decode_s`` (its request queue, prefill and decode
            seconds): with the requests' own times they say where the time went,
            :func:`request_times`;
            with ``router_state`` also ``caps``, ``held``, ``hold_s`` (seconds admitted requests
            spent held, cumulative), ``router_signals`` (per engine the
            age of the router's last metric sample, its failed scrapes and lost KV-event
            batches so far, and its mapped KV blocks) and, where the policy's state has them,
            its ``policy_instances`` (kv_horizon: reserved and budget blocks, sessions by
            class, decode rate per engine)) for plots.
        router_decisions: with ``router_metrics_url`` (the vLLM Router), its placements by
            branch at the end (:func:`router_decisions`); else None.
        missing_tokens_s: with ``router_metrics_url``, when (s from the start, to the
            sampling period, one entry per placement) the vLLM Router placed a request
            without its tokens (``missing_tokens``: an engine did not tokenize it within the
            router's 1 s budget); the simulator's mimic replays these times.
    """

    summary: dict
    after_warmup: dict | None = None
    requests: list[RequestRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    router_decisions: dict[str, int] | None = None
    missing_tokens_s: list[float] | None = None

    def recorded_trace(self) -> list[TraceSession]:
        """The requests as a trace (:mod:`router.sim.trace` format), replayable by ``router.sim``."""
        sessions: dict[str, TraceSession] = {}
        for r in sorted(self.requests, key=lambda r: (r.session_id, r.turn)):
            s = sessions.setdefault(r.session_id, TraceSession(r.session_id, r.workload_class, r.unit_id, r.group_id))
            s.requests.append(TraceRecord(
                r.session_id, r.workload_class, r.turn, max(1, r.prompt_tokens), max(1, r.output_tokens),
                unit_id=r.unit_id, group_id=r.group_id, tool_gap_s=r.tool_gap_s, session_end=r.session_end,
                group_prefix_tokens=r.group_prefix_tokens, class_prefix_tokens=r.class_prefix_tokens,
                arrival_s=r.arrival_s, finish_s=r.finish_s))
        return list(sessions.values())


async def scrape_engines(http: aiohttp.ClientSession, engine_urls: Sequence[str]) -> list[InstanceMetrics]:
    """One ``/metrics`` sample of every engine, in order.

    Raises:
        ReplayError: an engine did not answer or its page is not vLLM's.
    """
    async def one(url: str) -> InstanceMetrics:
        try:
            async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return parse_engine_metrics(await r.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise ReplayError(f"engine {url}: /metrics failed: {e!r}") from None

    return list(await asyncio.gather(*(one(u) for u in engine_urls)))


def window_summary(trainer: Trainer, requests: list[RequestRecord], window: tuple[float, float],
                   counters: tuple[list[InstanceMetrics], list[InstanceMetrics]]) -> dict:
    """The figures of a window, defined as in :func:`router.sim.metrics.summarize`.

    Args:
        trainer: the trainer model after the run (units with release/completion times).
        requests: finished requests.
        window: (t0, t1) seconds from the start.
        counters: engine samples at t0 and at t1.

    Returns:
        samples_per_min, requests_per_min, prefix_hit_rate (engine counters), prefill_tok_s
        (prompt tokens of requests finished in the window, hits included), computed_prefill_tok_s
        (engine prompt tokens minus prefix hits), decode_tok_s (engine generated tokens),
        consumed_mixture, tv_distance, completion_s {class: {p50, p95}}, composition
        (:func:`router.sim.metrics.composition`: decode tokens per completed sample, completed
        vs released length quantiles, per class and total), output_tokens_per_min,
        length_adjusted_samples_per_min, decode_tokens_per_sample, preemptions,
        units_released / units_completed / units_failed, requests_finished, window_s.
        A unit's output tokens are its trace's (each request asks for exactly that many).
    """
    t0, t1 = window
    dur = max(t1 - t0, 1e-9)
    c0, c1 = counters

    def delta(name: str) -> float:
        return sum(getattr(b, name) - getattr(a, name) for a, b in zip(c0, c1))

    queries, hits = delta("prefix_cache_queries_total"), delta("prefix_cache_hits_total")
    in_win = [r for r in requests if t0 <= r.finish_s <= t1]
    units = unit_figures(trainer.units.values(), trainer.rho, t0, t1)
    out_tokens = {s.unit_id: unit_output_tokens(s, None) for s in trainer.sessions}
    comp = composition(trainer.units.values(), out_tokens, t0, t1)
    return {
        "window_s": [t0, t1],
        "samples_per_min": units["samples_per_min"],
        "requests_per_min": len(in_win) / dur * 60,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "prefill_tok_s": sum(r.prompt_tokens for r in in_win) / dur,
        "computed_prefill_tok_s": (delta("prompt_tokens_total") - hits) / dur,
        "decode_tok_s": delta("generation_tokens_total") / dur,
        "consumed_mixture": units["consumed_mixture"],
        "tv_distance": units["tv_distance"],
        "completion_s": units["completion_s"],
        "composition": comp,
        "output_tokens_per_min": comp["total"]["output_tokens_per_min"],
        "length_adjusted_samples_per_min": comp["total"]["length_adjusted_samples_per_min"],
        "decode_tokens_per_sample": comp["total"]["decode_tokens_per_sample"],
        "preemptions": int(delta("num_preemptions_total")),
        "units_released": sum(trainer.released.values()),
        "units_completed": sum(trainer.completed.values()),
        "units_failed": sum(trainer.failed.values()),
        "requests_finished": len(requests),
    }


def request_times(requests: list[RequestRecord], timeline: list[dict]) -> dict | None:
    """Where a request's time went, mean seconds per request, between the first and the
    last timeline sample that carry the engines' latency counters: at the client, in the
    engines (vLLM's e2e_request_latency, from the arrival vLLM stamps to the last token), and
    outside them (``overhead_s``: the router, the HTTP hops, the API servers before that
    stamp); within the engines, where the timeline has them, the engine core's queue, its
    prefill (first schedule to first token) and decode (first token to last), and the rest
    (``api_s``: the API server's part inside vLLM's e2e, input and output processing).

    ``overhead_s`` is the mean client time of the requests that finished in that interval
    less the engines' mean request time (``e2e_s`` / ``e2e_n`` differenced). Behind our
    router (``hold_s`` in the timeline) the client time also holds the time a request waited
    in HOLD, which its router counts when the hold ends, not when the request finishes: for
    an admission policy that holds new sessions for many seconds the two sets differ (in one
    kv_horizon run the held seconds per finished request exceeded the client time less the
    engine time by 4 s), so there it is not separable and ``overhead_s`` is None.

    Returns:
        ``{"overhead_s", "client_s", "engine_s", "hold_s", "requests"}`` (``hold_s``: held
        seconds over the engines' finished requests, 0.0 for other routers; ``requests``: the
        engines' count of finished requests) and, where the timeline has them, ``queue_s``,
        ``prefill_s``, ``decode_s`` and ``api_s``; ``between_s``: the client's mean time from
        a response to the session's next request, less the tool gap (parsing the answer and
        building the next prompt, a late wake-up), over the requests sent in the interval
        that follow one of their session; or None when the timeline has fewer than two such
        samples or no request finished between them.
    """
    samples = [t for t in timeline if "e2e_s" in t and "e2e_n" in t]
    if len(samples) < 2:
        return None
    a, b = samples[0], samples[-1]
    n = sum(b["e2e_n"]) - sum(a["e2e_n"])
    client = [r.finish_s - r.arrival_s for r in requests if a["t_s"] < r.finish_s <= b["t_s"]]
    if n <= 0 or not client:
        return None

    def per_request(key: str) -> float:
        return (sum(b[key]) - sum(a[key])) / n

    engine_s = per_request("e2e_s")
    held = "hold_s" in a and "hold_s" in b
    client_s = sum(client) / len(client)
    out = {"overhead_s": None if held else client_s - engine_s, "client_s": client_s, "engine_s": engine_s,
           "hold_s": (b["hold_s"] - a["hold_s"]) / n if held else 0.0, "requests": int(n)}
    # the client's own time between a response and the session's next request, past the tool gap
    done = {(r.session_id, r.turn): r for r in requests}
    between = [r.arrival_s - p.finish_s - p.tool_gap_s for r in requests if a["t_s"] < r.arrival_s <= b["t_s"]
               for p in [done.get((r.session_id, r.turn - 1))] if p is not None]
    if between:
        out["between_s"] = sum(between) / len(between)
    parts = ("queue_s", "prefill_s", "decode_s")
    if all(k in a and k in b for k in parts):
        out.update({k: per_request(k) for k in parts})
        out["api_s"] = engine_s - sum(out[k] for k in parts)
    return out


def class_request_figures(requests: Iterable, window: tuple[float, float]) -> dict[str, dict]:
    """Per workload class, the requests that arrived and finished inside ``window`` (s from
    the replay's start): how long each took at the client and how long per output token.

    Args:
        requests: finished requests with ``workload_class``, ``arrival_s``, ``finish_s`` and
            ``output_tokens`` (``RequestRecord``, or a recorded trace's ``TraceRecord``;
            one without times is left out).
        window: (t0, t1) seconds.

    Returns:
        ``{class: {"requests", "p50_s", "p90_s", "s_per_output_token"}}``: request count,
        arrival-to-finish quantiles (s; a held request's hold included) and the median over
        requests of that time over the request's output tokens (s/token: a decode-heavy request
        on an engine whose steps also prefill others' prompts takes long per token); classes
        without a request in the window are left out.
    """
    t0, t1 = window
    by_class: dict[str, list[tuple[float, float]]] = {}
    for r in requests:
        if r.arrival_s is not None and r.finish_s is not None and t0 <= r.arrival_s and r.finish_s <= t1:
            took = r.finish_s - r.arrival_s
            by_class.setdefault(r.workload_class, []).append((took, took / max(1, r.output_tokens)))
    return {b: {"requests": len(v), "p50_s": float(np.percentile([t for t, _ in v], 50)),
                "p90_s": float(np.percentile([t for t, _ in v], 90)),
                "s_per_output_token": float(np.percentile([x for _, x in v], 50))}
            for b, v in sorted(by_class.items())}


def step_wait_s(timeline: list[dict]) -> float | None:
    """Mean time a request waits for its engine's running step to end before the engine core
    takes it (s): vLLM's engine core reads new requests between steps, so this wait falls
    inside its e2e_request_latency but outside its queue time (it is part of ``api_s`` of
    :func:`request_times`), while the simulator's engines count it as queue time.

    Per engine and pair of consecutive samples with the engine's step and finished-request
    counters: an engine with requests running at both ends steps back to back, so a request
    that arrives at a uniform time waits half its mean step, Δt / Δsteps / 2; otherwise (it
    idled in between, the step length is unknown) 0. The mean is weighted by the requests the
    engine finished in the interval (vLLM's e2e count). Interval means hide the spread of step
    lengths within an interval, which lengthens the wait (E[S²] / 2E[S]): a lower bound.

    Args:
        timeline: :class:`ReplayResult` timeline samples, in time order, with ``t_s`` and per
            engine ``steps``, ``running`` and ``e2e_n``.

    Returns:
        Seconds, or None when no request finished between samples with those counters.
    """
    pts = [p for p in timeline if p.get("steps") and p.get("e2e_n") and p.get("running")]
    waited = finished = 0.0
    for a, b in zip(pts, pts[1:]):
        dt = b["t_s"] - a["t_s"]
        for i in range(min(len(a["steps"]), len(b["steps"]), len(a["e2e_n"]), len(b["e2e_n"]))):
            n = b["e2e_n"][i] - a["e2e_n"][i]
            steps = b["steps"][i] - a["steps"][i]
            if n <= 0 or dt <= 0:
                continue
            finished += n
            if steps > 0 and a["running"][i] and b["running"][i]:
                waited += n * dt / steps / 2
    return waited / finished if finished else None


class _Replay:
    """State of one replay (see :func:`replay`)."""

    def __init__(self, url: str, model: str, sessions: list[TraceSession], mixture: dict[str, float],
                 ceiling: int, text: WordText, engine_urls: Sequence[str], router_state: bool = False,
                 router_metrics_url: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.router_state = router_state
        self.router_metrics_url = router_metrics_url.rstrip("/") if router_metrics_url else None
        self.decisions: dict[str, int] | None = None
        self.missing_tokens_s: list[float] = []
        self.model = model
        self.trainer = Trainer(sessions, mixture, ceiling)
        self.text = text
        self.engine_urls = list(engine_urls)
        self.requests: list[RequestRecord] = []
        self.errors: list[str] = []
        self.timeline: list[dict] = []
        self.tasks: set[asyncio.Task] = set()
        self.t_start = 0.0
        self.first_done = asyncio.Event()
        self.pool_dry = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.t_start

    def release(self) -> None:
        stopped_before = self.trainer.stopped_s is not None
        for s in self.trainer.release(self.now()):
            task = asyncio.ensure_future(self.run_session(s))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        if not stopped_before and self.trainer.stopped_s is not None:
            self.pool_dry.set()

    async def run_session(self, s: TraceSession) -> None:
        headers = SessionHeaders(s.session_id, s.workload_class, s.group_id, s.unit_id)
        r0 = s.requests[0]
        cls_n = r0.class_prefix_tokens
        grp_n = max(r0.group_prefix_tokens - cls_n, 0)
        prompt = (self.text.text(f"class:{s.workload_class}", cls_n)
                  + self.text.text(f"group:{s.group_id or s.session_id}", grp_n)
                  + self.text.text(f"session:{s.session_id}:0", r0.prompt_tokens - cls_n - grp_n))
        for k, rec in enumerate(s.requests):
            end = k == len(s.requests) - 1 if rec.session_end is None else bool(rec.session_end)
            body = {"model": self.model, "prompt": prompt, "max_tokens": rec.output_tokens,
                    "min_tokens": rec.output_tokens, "ignore_eos": True, "temperature": 0.0}
            arrival = self.now()
            try:
                async with self.http.post(f"{self.url}/v1/completions", json=body,
                                          headers=headers.headers(end)) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        raise ReplayError(f"HTTP {resp.status}: {raw[:200]!r}")
                    answer = await resp.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ReplayError, ValueError) as e:
                self.errors.append(f"{s.session_id} turn {k}: {e}")
                self.trainer.fail(s.unit_id, self.now())
                self.release()
                return
            usage = answer.get("usage") or {}
            out_text = answer["choices"][0]["text"]
            gap = 0.0 if end else rec.tool_gap_s
            self.requests.append(RequestRecord(
                s.session_id, s.workload_class, s.unit_id, s.group_id, k, arrival, self.now(),
                int(usage.get("prompt_tokens", rec.prompt_tokens)),
                int(usage.get("completion_tokens", rec.output_tokens)), gap, end, cls_n, r0.group_prefix_tokens))
            if end:
                break
            nxt = s.requests[k + 1]
            obs = nxt.prompt_tokens - rec.prompt_tokens - rec.output_tokens
            prompt = prompt + out_text + self.text.text(f"session:{s.session_id}:{k + 1}", obs)
            await asyncio.sleep(gap)
        self.trainer.complete(s.unit_id, self.now())
        self.first_done.set()
        self.release()

    async def _router_sample(self) -> dict:
        """Caps and held requests from our router's ``/state`` (empty for other routers)."""
        if not self.router_state:
            return {}
        try:
            async with self.http.get(f"{self.url}/state", timeout=aiohttp.ClientTimeout(total=5)) as r:
                state = await r.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return {}
        insts = state.get("instances") or []
        policy = state.get("policy") or {}
        hold_s = await self._router_hold_s()
        per_instance = policy.get("instances")  # e.g. kv_horizon: reservation, budget, sessions by class
        return {"caps": policy_caps(policy), "held": state.get("held_requests"),
                **({"hold_s": hold_s} if hold_s is not None else {}),
                **({"policy_instances": per_instance} if isinstance(per_instance, dict) else {}),
                # per engine, in the router's order: signal health (cumulative failures, last sample's age)
                "router_signals": [{k: i.get(k) for k in ("instance", "metrics_age_s", "scrapes_failed",
                                                           "kv_event_gaps", "kv_mapped_blocks")} for i in insts]}

    async def _router_hold_s(self) -> float | None:
        """Seconds our router's admitted requests spent held so far (``router_hold_seconds``' sum)."""
        try:
            async with self.http.get(f"{self.url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                return router_hold_seconds(await r.text()) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def sample_engines(self, period_s: float) -> None:
        while True:
            try:
                ms = await scrape_engines(self.http, self.engine_urls)
            except ReplayError:
                ms = None
            router = await self._router_sample()
            if ms is not None:
                q = sum(m.prefix_cache_queries_total for m in ms)
                h = sum(m.prefix_cache_hits_total for m in ms)
                self.timeline.append({
                    "t_s": self.now(), "kv_usage": [m.kv_cache_usage for m in ms],
                    "running": [m.num_requests_running for m in ms], "waiting": [m.num_requests_waiting for m in ms],
                    "prefix_queries": q, "prefix_hits": h, "completed": dict(self.trainer.completed),
                    "in_flight_units": self.trainer.in_flight,
                    # per engine, cumulative: steps, computed prompt tokens (hits excluded), prompt
                    # tokens (hits included), prefills (first tokens), generated tokens
                    "steps": [m.engine_steps_total for m in ms],
                    "computed_prompt": [m.prompt_tokens_total - m.prefix_cache_hits_total for m in ms],
                    "prompt": [m.prompt_tokens_total for m in ms],
                    "prefills": [m.prefills_total for m in ms],
                    # per engine, cumulative: engine-side request seconds and finished requests
                    "e2e_s": [m.e2e_latency_s_total for m in ms],
                    "e2e_n": [m.e2e_requests_total for m in ms],
                    # and the engine core's part of it: queued, first schedule to first token, decode
                    "queue_s": [m.queue_time_s_total for m in ms],
                    "prefill_s": [m.prefill_time_s_total for m in ms],
                    "decode_s": [m.decode_time_s_total for m in ms],
                    "generated": [m.generation_tokens_total for m in ms], **router})
            await asyncio.sleep(period_s)

    async def sample_router_decisions(self, period_s: float) -> None:
        """Poll the vLLM Router's decision counter; log a time per new ``missing_tokens``."""
        while True:
            self._note_decisions(await self._router_decisions(), self.now())
            await asyncio.sleep(period_s)

    def _note_decisions(self, decisions: dict[str, int] | None, now: float) -> None:
        """Keep the latest counts; one time (``now``) per ``missing_tokens`` placement since the last."""
        if decisions is None:
            return  # a missed sample: the next one carries the counts
        before = (self.decisions or {}).get("missing_tokens", 0)
        self.missing_tokens_s += [round(now, 3)] * max(0, decisions.get("missing_tokens", 0) - before)
        self.decisions = decisions

    async def _router_decisions(self) -> dict[str, int] | None:
        try:
            async with self.http.get(f"{self.router_metrics_url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                return router_decisions(await r.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def run(self, duration_s: float, progress: Callable[[float, int], None] | None,
                  request_timeout_s: float, warmup_s: float = 0.0) -> ReplayResult:
        timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, connector=tcp_connector(limit=0)) as http:
            self.http = http
            c_start_baseline = await scrape_engines(http, self.engine_urls)
            self.t_start = time.monotonic()
            sampler = asyncio.ensure_future(self.sample_engines(5.0))
            decisions = (asyncio.ensure_future(self.sample_router_decisions(1.0))
                         if self.router_metrics_url else None)
            self.release()
            t0, c0 = None, c_start_baseline
            tw, cw = None, None  # the after-warm-up window's start
            deadline = self.t_start + duration_s
            while time.monotonic() < deadline and not (self.pool_dry.is_set() and not self.tasks):
                if t0 is None and self.first_done.is_set():
                    t0, c0 = self.now(), await scrape_engines(http, self.engine_urls)
                if warmup_s > 0 and tw is None and t0 is not None and self.now() >= warmup_s:
                    tw, cw = self.now(), await scrape_engines(http, self.engine_urls)
                if progress is not None:
                    progress(self.now(), sum(self.trainer.completed.values()))
                await asyncio.sleep(0.5)
            t1 = self.now()
            c1 = await scrape_engines(http, self.engine_urls)
            sampler.cancel()
            for task in list(self.tasks):
                task.cancel()
            if decisions is not None:
                decisions.cancel()
            await asyncio.gather(*self.tasks, sampler, *([decisions] if decisions else []), return_exceptions=True)
            if decisions is not None:  # the final counts, after the last request
                self._note_decisions(await self._router_decisions(), t1)
        if t0 is None:
            t0, c0 = 0.0, c_start_baseline
        summary = window_summary(self.trainer, self.requests, (t0, t1), (c0, c1))
        after = window_summary(self.trainer, self.requests, (tw, t1), (cw, c1)) if tw is not None else None
        return ReplayResult(summary, after, self.requests, self.errors, self.timeline, self.decisions,
                            self.missing_tokens_s if self.router_metrics_url else None)


def replay(url: str, model: str, sessions: list[TraceSession], mixture: dict[str, float], ceiling: int,
           duration_s: float, text: WordText, engine_urls: Sequence[str],
           progress: Callable[[float, int], None] | None = None, request_timeout_s: float = 900.0,
           router_state: bool = False, warmup_s: float = 0.0, router_metrics_url: str | None = None) -> ReplayResult:
    """Replay ``sessions`` through ``url`` for ``duration_s`` seconds of wall time.

    Args:
        url: the router (or one engine) base URL; requests go to ``/v1/completions``.
        model: the served model name.
        sessions: the trace (:func:`router.sim.workload.generate_trace` or ``read_trace``).
        mixture: the trainer's target rho per class.
        ceiling: most units in flight (the outer concurrency limit).
        duration_s: run length; the run also ends when a class pool runs dry and all
            released units finished. Units still in flight at the end are cancelled
            (their requests aborted) and not counted.
        text: prompt text builder for the served model's tokenizer.
        engine_urls: the engines behind ``url`` (their ``/metrics`` give the counters).
        progress: called about twice a second with (elapsed s, units completed).
        request_timeout_s: per-request limit; a request past it fails its unit.
        router_state: ``url`` is our router: sample its ``/state`` (policy caps, held
            requests) into the timeline.
        warmup_s: also measure the window after this many seconds (``after_warmup``):
            a router that learns its estimates as it runs (ours) starts cold, and a
            training job's router runs for hours; 0 = whole run only.
        router_metrics_url: the vLLM Router's Prometheus address (``--prometheus-port``):
            its placements are sampled every second (``router_decisions``,
            ``missing_tokens_s`` of the result); None for other routers.

    Returns:
        :class:`ReplayResult`.

    Raises:
        ReplayError: ``duration_s`` <= 0, ``warmup_s`` outside [0, ``duration_s``), or an engine's ``/metrics`` did not answer.
        router.sim.errors.SimError: a bad mixture or ceiling (from the trainer model).
    """
    if duration_s <= 0:
        raise ReplayError(f"duration_s must be > 0, got {duration_s}")
    if not 0 <= warmup_s < duration_s:
        raise ReplayError(f"warmup_s must be in [0, duration_s={duration_s}), got {warmup_s}")
    return asyncio.run(_Replay(url, model, sessions, mixture, ceiling, text, engine_urls, router_state,
                               router_metrics_url)
                       .run(duration_s, progress, request_timeout_s, warmup_s))
