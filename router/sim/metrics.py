"""What a run measured: the paper's serving metrics over a fixed window, and a timeline.

Metrics (MISA-T section 5): complete samples/min (units whose every request finished,
Eq. 4), requests/min, prefix hit rate (hit / queried prompt tokens, from the engines'
counters), effective prefill tokens/s (prompt tokens of finished requests, hits
included), decode tokens/s, consumed mixture and its total-variation distance to the
target (D_TV = 1/2 ||p - q||_1), per-class p50/p95 unit completion time (release to
last request done). Beside them, how far the engines' decode rate was from the ceiling the
KV cache allows at the run's mean decode context (``decode_ceiling_*``: about the most a
router could add on this trace).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from router.policies.base import Policy
from router.sim.cost_model import decode_ceiling
from router.sim.engine import Engine, SimRequest
from router.sim.trainer import Trainer


class EngineSnapshot(NamedTuple):
    """One engine's cumulative counters at a window edge (tokens, seconds, counts):
    what :func:`engine_snapshot` reads off ``Engine.counters`` and ``Engine.clock``."""

    queried_tokens: int
    hit_tokens: int
    generated_tokens: int
    busy_s: float
    preemptions: int
    steps: int
    prefill_tokens: int
    decode_seq_steps: int
    decode_context_tokens: int
    decode_kv_tokens: int


def engine_snapshot(engine: Engine) -> EngineSnapshot:
    """``engine``'s counters now (a window edge of the simulator)."""
    c = engine.counters
    return EngineSnapshot(c.prefix_queries_tokens, c.prefix_hits_tokens, c.generation_tokens, c.busy_s,
                          c.preemptions, engine.clock, c.prefill_computed_tokens, c.decode_seq_steps,
                          c.decode_context_tokens, c.decode_kv_tokens)


ZERO_SNAPSHOT = EngineSnapshot(0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0)
"""Every counter at 0 (a run's start)."""


def delta(c0: Sequence[EngineSnapshot], c1: Sequence[EngineSnapshot], field: str) -> float:
    """Σ over engines of counter ``field`` at ``c1`` minus at ``c0`` (one snapshot per engine each)."""
    return sum(getattr(b, field) - getattr(a, field) for a, b in zip(c0, c1))


class SimRun(Protocol):
    """What the metrics read of a run (``router.sim.simulator.Simulation`` is one): a
    protocol, so that this module does not import the simulator that records into it."""

    now: float
    engines: Sequence[Engine]
    trainer: Trainer
    policy: Policy
    log: RequestLog
    cfg: Any  # SimConfig: context_limit_tokens
    _window: dict[str, float]  # "start" / "stop" / "end" -> time, seconds
    _window_counters: dict[str, list[EngineSnapshot]]  # the engines' counters at those times


def tv_distance(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """D_TV(p, q) = 1/2 sum_b |p_b - q_b| over the union of classes (inputs need not sum to 1)."""
    sp, sq = sum(p.values()) or 1.0, sum(q.values()) or 1.0
    return 0.5 * sum(abs(p.get(b, 0.0) / sp - q.get(b, 0.0) / sq) for b in set(p) | set(q))


class RequestLog:
    """Per-request and per-session records the simulator appends to while it runs."""

    def __init__(self) -> None:
        self.finished_s: list[float] = []
        self.prompt_tokens: list[int] = []
        self.hit_tokens: list[int] = []
        self.output_tokens: list[int] = []
        # per engine, summed over its finished requests (s): admitted to its engine -> first
        # scheduled (vLLM's queue time), -> first token (its prefill time), -> last token (its
        # decode time); instance -> {"requests", "queue", "prefill", "decode"}
        self.instance_split_s: dict[str, dict[str, float]] = {}
        self.agent_model_s = 0.0
        self.agent_gap_s = 0.0
        self.admits = 0
        # per finished session: (class, released_s, admitted_s, ended_s, final KV blocks)
        self.sessions: list[tuple[str, float, float, float, int]] = []
        self._last_counters: list[tuple[int, int]] | None = None

    def admitted(self, sreq: SimRequest, now: float) -> None:
        """A request was admitted at ``now``."""
        self.admits += 1

    def finished(self, sreq: SimRequest, now: float) -> None:
        """A request finished at ``now``."""
        self.finished_s.append(now)
        self.prompt_tokens.append(sreq.prompt_tokens)
        self.hit_tokens.append(sreq.hit_tokens)
        self.output_tokens.append(sreq.output_tokens)
        first = sreq.first_token_s if sreq.first_token_s is not None else now
        own = self.instance_split_s.setdefault(
            sreq.instance, {"requests": 0, "queue": 0.0, "prefill": 0.0, "decode": 0.0})
        own["requests"] += 1
        own["queue"] += sreq.start_s - sreq.admitted_s
        own["prefill"] += first - sreq.start_s
        own["decode"] += now - first

    @property
    def time_split_s(self) -> dict[str, float]:
        """``instance_split_s`` summed over engines: {"queue", "prefill", "decode"} (s)."""
        return {k: sum(own[k] for own in self.instance_split_s.values()) for k in ("queue", "prefill", "decode")}

    def session_done(self, workload_class: str, model_s: float, gap_s: float, released_s: float,
                     admitted_s: float, ended_s: float, final_blocks: int) -> None:
        """A session ended: ``model_s`` seconds in model requests, ``gap_s`` in tool gaps,
        released / first admitted / ended at the given times, ``final_blocks`` KV blocks at the end."""
        self.sessions.append((workload_class, released_s, admitted_s, ended_s, final_blocks))
        if workload_class == "agent":
            self.agent_model_s += model_s
            self.agent_gap_s += gap_s

    def class_truth(self, switch_s: float | None, k_quantile: float = 0.9) -> dict[str, dict[str, float]]:
        """True class footprints and residencies, for misa_t_oracle (experiment 5).

        Returns ``{"k_blocks_before", "k_blocks_after", "t_s_before", "t_s_after"}``, each
        ``{class: value}``: the ``k_quantile`` of final KV blocks (the statistic misa's k_b
        estimates) and the mean residency (first admission to end) of sessions released
        before / from ``switch_s`` (None: all sessions count as "after").
        """
        out: dict[str, dict[str, float]] = {k: {} for k in ("k_blocks_before", "k_blocks_after",
                                                             "t_s_before", "t_s_after")}
        groups: dict[tuple[str, str], list[tuple[float, int]]] = {}
        for b, released, admitted, ended, blocks in self.sessions:
            phase = "after" if switch_s is None or released >= switch_s else "before"
            groups.setdefault((phase, b), []).append((ended - admitted, blocks))
        for (phase, b), rows in groups.items():
            out[f"k_blocks_{phase}"][b] = float(np.quantile([r[1] for r in rows], k_quantile))
            out[f"t_s_{phase}"][b] = float(np.mean([r[0] for r in rows]))
        return out

    def timeline_sample(self, sim: SimRun) -> dict:
        """One timeline point: time, KV usage, hit rate since the last point, mixture, backlog, caps."""
        counters = [(e.counters.prefix_queries_tokens, e.counters.prefix_hits_tokens) for e in sim.engines]
        last = self._last_counters or [(0, 0)] * len(counters)
        dq = sum(c[0] - l[0] for c, l in zip(counters, last))
        dh = sum(c[1] - l[1] for c, l in zip(counters, last))
        self._last_counters = counters
        done = dict(sim.trainer.completed)
        total = sum(done.values())
        return {
            "t_s": sim.now,
            "kv_usage": [round(e.kv.usage, 4) for e in sim.engines],
            "running": [len(e.running) for e in sim.engines],
            "waiting": [len(e.waiting) for e in sim.engines],
            "hit_rate": dh / dq if dq else None,
            "completed": done,
            "mixture": {b: n / total for b, n in done.items()} if total else {},
            "backlog": sim.trainer.backlog(),
            "in_flight_units": sim.trainer.in_flight,
            "caps": policy_caps(sim.policy.state()),
        }


def unit_figures(units: Iterable, rho: Mapping[str, float], t0: float, t1: float) -> dict:
    """Figures of the rollout units completed in [t0, t1] (trainer ``UnitRecord`` values).

    Returns samples_per_min, consumed_mixture, tv_distance (1.0 when none completed) and
    completion_s {class: {p50, p95}} (release to completion, seconds).
    """
    per_class: dict[str, list[float]] = {}
    for u in units:
        if u.completed_s is not None and t0 <= u.completed_s <= t1:
            per_class.setdefault(u.workload_class, []).append(u.completed_s - u.released_s)
    consumed = {b: len(per_class.get(b, [])) for b in rho}
    n_units = sum(consumed.values())
    return {
        "samples_per_min": n_units / max(t1 - t0, 1e-9) * 60,
        "consumed_mixture": {b: n / n_units if n_units else 0.0 for b, n in consumed.items()},
        "tv_distance": tv_distance({b: float(n) for b, n in consumed.items()}, rho) if n_units else 1.0,
        "completion_s": {
            b: {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95))} for b, v in per_class.items()
        },
    }


def unit_output_tokens(session, context_limit_tokens: int | None) -> int:
    """Decode tokens a unit generates when it completes: each request's output clipped at
    the context limit (max_tokens = limit - prompt, as the simulator sends them); ``None``:
    no clipping (a real replay asks for exactly the trace's output of each request)."""
    if context_limit_tokens is None:
        return sum(max(1, r.output_tokens) for r in session.requests)
    return sum(max(1, min(r.output_tokens, context_limit_tokens - r.prompt_tokens)) for r in session.requests)


_QUANTILES = (10, 50, 90)


def composition(units: Iterable, output_tokens: Mapping[str, int], t0: float, t1: float) -> dict:
    """What the completed samples are made of, against what was released, per class and ``total``.

    Args:
        units: trainer ``UnitRecord`` values (every released unit).
        output_tokens: decode tokens of each unit (``unit_output_tokens``), by unit id.
        t0, t1: the measurement window (s); a unit counts as completed when it completed in it.

    Returns ``{class or "total": {...}}`` with:
        ``decode_tokens_per_sample``: mean output tokens of a completed unit;
        ``released_decode_tokens_per_sample``: the same over every released unit;
        ``completed_p10/p50/p90``, ``released_p10/p50/p90``: output-token quantiles;
        ``output_tokens_per_min``: completed units' output tokens per minute of window;
        ``length_adjusted_samples_per_min``: ``output_tokens_per_min`` divided by the
        released mean output per unit of the class, i.e. samples/min counted in samples
        of the *released* length distribution's mean: a policy that completes only the
        short samples of a class inside the window gets no credit for their shortness.
        The total sums the classes' figures (each class in its own released mean), so
        it is also free of which classes' samples complete.
    """
    minutes = max(t1 - t0, 1e-9) / 60
    done: dict[str, list[int]] = {}
    released: dict[str, list[int]] = {}
    for u in units:
        n = output_tokens[u.unit_id]
        released.setdefault(u.workload_class, []).append(n)
        if u.completed_s is not None and t0 <= u.completed_s <= t1:
            done.setdefault(u.workload_class, []).append(n)
    out: dict[str, dict] = {}
    for b in sorted(released):
        out[b] = _composition_row(done.get(b, []), released[b], minutes)
    total = _composition_row([n for v in done.values() for n in v], [n for v in released.values() for n in v],
                             minutes)
    total["length_adjusted_samples_per_min"] = sum(r["length_adjusted_samples_per_min"] for r in out.values())
    out["total"] = total
    return out


def _composition_row(done: list[int], released: list[int], minutes: float) -> dict:
    rel_mean = float(np.mean(released)) if released else 0.0
    row = {
        "samples": len(done),
        "decode_tokens_per_sample": float(np.mean(done)) if done else 0.0,
        "released_decode_tokens_per_sample": rel_mean,
        "output_tokens_per_min": float(sum(done)) / minutes,
        "length_adjusted_samples_per_min": float(sum(done)) / minutes / rel_mean if rel_mean else 0.0,
    }
    for q in _QUANTILES:
        row[f"completed_p{q}"] = float(np.percentile(done, q)) if done else 0.0
        row[f"released_p{q}"] = float(np.percentile(released, q)) if released else 0.0
    return row


def policy_caps(state: object, prefix: str = "") -> dict[str, float]:
    """Numeric entries of a policy's ``state()`` whose key path mentions "cap" (flattened with '.')."""
    out: dict[str, float] = {}
    if isinstance(state, Mapping):
        for k, v in state.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)) and "cap" in path.lower():
                out[path] = float(v)
            elif isinstance(v, Mapping):
                out.update(policy_caps(v, path))
    return out


def step_figures(steps: float, window_s: float, step_s: float, prefill_tokens: float, generated: float) -> dict:
    """The engines' steps over a window, summed over engines: ``steps_per_s``,
    ``ms_per_step`` (``step_s``, the time the engines spent in steps, per step),
    ``prefill_tokens_per_step`` (computed prompt tokens, cache hits excluded) and
    ``decode_seqs_per_step`` (generated tokens per step); the last three are 0 without steps."""
    return {"steps_per_s": steps / window_s if window_s > 0 else 0.0,
            "ms_per_step": 1000 * step_s / steps if steps else 0.0,
            "prefill_tokens_per_step": prefill_tokens / steps if steps else 0.0,
            "decode_seqs_per_step": generated / steps if steps else 0.0}


def engine_figures(sim: SimRun, c0: Sequence[EngineSnapshot], c1: Sequence[EngineSnapshot],
                   window_s: float) -> list[dict]:
    """Per engine, in ``sim.engines``' order: its steps over the window as :func:`step_figures`
    gives them for one engine, ``busy_frac`` (share of the window in steps), and over the
    whole run its finished ``requests`` with their mean ``request_queue_s``,
    ``request_prefill_s`` and ``request_decode_s`` (as vLLM's request histograms split a
    request; ``bench.router_real`` sets each engine beside the real one it plays)."""
    out = []
    for e, a, b in zip(sim.engines, c0, c1):
        own = sim.log.instance_split_s.get(e.instance, {})
        n = int(own.get("requests", 0))
        out.append({
            "instance": e.instance,
            **step_figures(b.steps - a.steps, window_s, b.busy_s - a.busy_s, b.prefill_tokens - a.prefill_tokens,
                           b.generated_tokens - a.generated_tokens),
            "busy_frac": (b.busy_s - a.busy_s) / window_s if window_s > 0 else 0.0,
            "requests": n,
            **{f"request_{k}_s": own.get(k, 0.0) / n if n else 0.0 for k in ("queue", "prefill", "decode")},
        })
    return out


DECODE_CEILING_METRICS = ("mean_decode_context_tokens", "context_per_kv_token", "decode_step_tok_s",
                          "decode_ceiling_tok_s", "decode_ceiling_headroom")
"""The keys :func:`decode_ceiling_figures` adds to a summary (none without decode steps)."""


def decode_ceiling_figures(sim: SimRun, c0: Sequence[EngineSnapshot], c1: Sequence[EngineSnapshot],
                           window_s: float) -> dict:
    """How far the engines' decoding over a window was from their KV-bound decode ceiling.

    Args:
        sim: the run (its engines' step costs and KV sizes).
        c0, c1: one :class:`EngineSnapshot` per engine at the window's start and end.
        window_s: the window's length (s).

    Returns:
        ``mean_decode_context_tokens``: context per decode token (the decoding sequences'
        context summed over steps / decode tokens, all engines); ``context_per_kv_token``: that
        context per token of the decoders' KV (above 1 where sequences share prefix blocks;
        taken as at least 1); ``decode_step_tok_s``: tokens the decode steps emitted per second
        (without the first token a prefill step emits); ``decode_ceiling_tok_s``: the sum over
        engines of :func:`~router.sim.cost_model.decode_ceiling` at that mean context, the cache
        holding ``context_per_kv_token`` context tokens per KV token (tokens/s);
        ``decode_ceiling_headroom``: ceiling / decode-step rate - 1 (0.25 = +25%). An estimate
        at this run's mean context and sharing: another router's run of the same trace has
        its own (they differed by up to 3% between routers on one seed at scale 1). An empty
        dict when the window has no decode step.
    """
    seq_steps, ctx = delta(c0, c1, "decode_seq_steps"), delta(c0, c1, "decode_context_tokens")
    kv_tokens = delta(c0, c1, "decode_kv_tokens")
    if seq_steps <= 0 or kv_tokens <= 0 or window_s <= 0:
        return {}
    mean_ctx, sharing, rate = ctx / seq_steps, max(1.0, ctx / kv_tokens), seq_steps / window_s
    top = sum(decode_ceiling(e.cost, int(sharing * e.config.num_blocks * e.config.block_size), mean_ctx,
                             e.config.max_num_seqs)[0] for e in sim.engines)
    return {"mean_decode_context_tokens": mean_ctx, "context_per_kv_token": sharing, "decode_step_tok_s": rate,
            "decode_ceiling_tok_s": top, "decode_ceiling_headroom": top / rate - 1.0}


def summarize(sim: SimRun, n_events: int) -> dict:
    """The run's metrics over its window [start, stop] (see module docstring)."""
    w, wc = sim._window, sim._window_counters
    if "start" in w and w["stop"] > w["start"]:
        t0, t1, c0, c1 = w["start"], w["stop"], wc["start"], wc["stop"]
    else:  # no steady state: measure the whole run
        t0, t1, c1 = 0.0, w["end"], wc["end"]
        c0 = [ZERO_SNAPSHOT] * len(c1)  # every counter from 0
    dur_s = max(t1 - t0, 1e-9)
    dq, dh = delta(c0, c1, "queried_tokens"), delta(c0, c1, "hit_tokens")
    dgen, dbusy, dpre = delta(c0, c1, "generated_tokens"), delta(c0, c1, "busy_s"), delta(c0, c1, "preemptions")
    dsteps, dprefill = delta(c0, c1, "steps"), delta(c0, c1, "prefill_tokens")
    ceiling = decode_ceiling_figures(sim, c0, c1, dur_s)
    fin = np.asarray(sim.log.finished_s)
    in_win = (fin >= t0) & (fin <= t1)
    prompts = np.asarray(sim.log.prompt_tokens)
    units = unit_figures(sim.trainer.units.values(), sim.trainer.rho, t0, t1)
    limit = sim.cfg.context_limit_tokens
    out_tokens = {s.unit_id: unit_output_tokens(s, limit) for s in sim.trainer.sessions}
    comp = composition(sim.trainer.units.values(), out_tokens, t0, t1)
    gap, model = sim.log.agent_gap_s, sim.log.agent_model_s
    phases = {}
    if "shift" in w and t0 < w["shift"] < t1:  # a workload shift inside the window: each side alone
        ts, cs = w["shift"], wc["shift"]
        for name, (a, b, ca, cb) in {"before_shift": (t0, ts, c0, cs), "after_shift": (ts, t1, cs, c1)}.items():
            fig = unit_figures(sim.trainer.units.values(), sim.trainer.rho, a, b)
            q = delta(ca, cb, "queried_tokens")
            phases[name] = {
                "window_s": [a, b], "samples_per_min": fig["samples_per_min"], "tv_distance": fig["tv_distance"],
                "prefix_hit_rate": delta(ca, cb, "hit_tokens") / q if q else 0.0,
                "output_tokens_per_min": composition(sim.trainer.units.values(), out_tokens, a, b)["total"][
                    "output_tokens_per_min"],
                "preemptions": int(delta(ca, cb, "preemptions")),
            }
    return {
        "window_s": [t0, t1],
        "samples_per_min": units["samples_per_min"],
        "requests_per_min": float(in_win.sum()) / dur_s * 60,
        "prefix_hit_rate": dh / dq if dq else 0.0,
        "prefill_tok_s": float(prompts[in_win].sum()) / dur_s if len(prompts) else 0.0,
        "decode_tok_s": dgen / dur_s,
        "consumed_mixture": units["consumed_mixture"],
        "tv_distance": units["tv_distance"],
        "completion_s": units["completion_s"],
        "composition": comp,
        "output_tokens_per_min": comp["total"]["output_tokens_per_min"],
        "length_adjusted_samples_per_min": comp["total"]["length_adjusted_samples_per_min"],
        "decode_tokens_per_sample": comp["total"]["decode_tokens_per_sample"],
        "engine_busy_frac": dbusy / (dur_s * len(sim.engines)),
        "engine_steps": step_figures(dsteps, dur_s, dbusy, dprefill, dgen),
        **ceiling,
        "engines": engine_figures(sim, c0, c1, dur_s),
        "preemptions": int(dpre),
        "agent_tool_gap_share": gap / (gap + model) if gap + model else 0.0,
        "units_released": sum(sim.trainer.released.values()),
        "units_completed": sum(sim.trainer.completed.values()),
        "requests_finished": len(fin),
        # per request over the whole run, as vLLM's request histograms split it
        # (bench.router_real sets them beside the real ones): queue, prefill, decode
        **{f"request_{k}_s": v / len(fin) if len(fin) else 0.0 for k, v in sim.log.time_split_s.items()},
        "sim_end_s": sim.now,
        "events": n_events,
        "phases": phases,
    }
