"""Routers on real vLLM engines, and the simulator checked against them (one command).

    .venv/bin/python -m bench.router_real                  # 3 seeds x 6 routers x 3 min (~70 min in all)
    .venv/bin/python -m bench.router_real --seeds 0 --minutes 2   # one seed, shorter, noisier (~22 min)

What it does, in one run and one folder (``runs/bench/router-real-<time>/``, one
``seed-<n>/`` per seed and the table over seeds in ``summary.md`` / ``summary.json``):

1. Starts 2 real vLLM CPU engines with the packaged model (one core each) and a KV cache
   of ``--kv-tokens`` tokens per engine, small enough that the mixed workload overflows it
   at the permissive ceiling.
2. Calibrates the simulator's step-cost profile on those engines
   (:mod:`router.sim.calibrate`, fitted by :func:`router.sim.cost_model.fit_linear_step_cost`),
   and again after the runs (``--calibrate-after``, the default: the profile is fitted to both,
   and ``summary.md`` gives how far the steps moved between them).
3. Generates, per seed, one mixed trace with the shape of ``router/sim/`` scaled to what 2 cores serve
   (:func:`cpu_classes`): agent sessions with growing prefixes, short outputs and tool gaps;
   rlvr with long decodes; rlhf in between; GRPO groups of 4.
4. Replays it (:mod:`router.replay`: a trainer-like client releasing whole groups at the
   target mixture under an outer concurrency ceiling, counting complete units) through, in
   turn: the real ``vllm-router`` (cache_aware, its command-line default thresholds, as
   ``recipes/router/vllm.yaml`` launches it) at each ceiling of ``--sweep`` (the best is the
   baseline), the real ``vllm-router`` at the permissive ``--ceiling``, and our ``--policies``
   (default ``misa_t``, ``kv_horizon``) at that ceiling. Between runs the engines' prefix
   caches are reset and each router is started fresh.
5. Replays the same trace in the simulator with the engines' real KV size and block size and
   the same policies and ceilings, with three step-cost profiles (:data:`PROFILES`: the
   calibrated one; one fitted to the other runs' engine counters; the calibrated one scaled
   to the CPU the engines' model threads had in the run, engine by engine where each
   engine's CPU was measured), and reports its error per figure and each engine of a run
   beside the simulator's.

Figures per router, over two windows: the whole run (first unit completion to the end, as
the simulator defines it with warmup_frac=0) and the run after ``--warmup-minutes`` (our
routers learn their estimates as they run and start cold, where a training job's router
runs for hours; the simulator replays the same window): complete samples/min, requests/min, prefix hit rate (the
engines' own counters), prefill tok/s (prompt tokens of finished requests, hits included)
and computed prefill tok/s (engine prompt tokens - hits), decode tok/s (engine counter),
consumed mixture and TV distance, per-class p50/p95 unit completion time, the composition
of completed samples (output tokens/min, length-adjusted samples/min, decode tokens per
sample), the regime (:func:`regime`: sessions and running requests per engine, KV usage,
the share of time every class cap is above 1) and the CPU each role of the job used (engine
workers and schedulers, API servers, router, client, and each engine's own:
:mod:`common.cpu_time`); ratios to the sweep-tuned baseline. Over seeds (``summary.md``),
per window: each router's change against the sweep point with the
best mean, mean ± std, the simulator mimic's error against the real router per sweep point;
each router's complete samples/min minute by minute (``rate_over_time.png``: a short run's
whole-run figure mixes the fill of an empty system with its steady state); and the regime.
Per seed: ``results.json``, ``table.md``, ``router_real.png``, ``kv_usage.png``, each run's
engine/router logs and its recorded trace (JSONL, replayable with ``python -m router.sim
trace=...``).

Every process it starts is stopped when it ends, fails, or is interrupted (Ctrl-C, SIGTERM);
the engines also die with it if it is killed (PR_SET_PDEATHSIG).

Two modes start no engine: ``--resimulate RUN_DIR`` redoes the simulator's half of a
finished run; ``--combine RUN_DIR RUN_DIR ...`` sets the routers of finished runs of the same
seeds, traces and options side by side in one folder and summary, as if one run had swept
them all (a sweep extended by a later run; each source's engines ran in their own session).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import aiohttp
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from common.config import REPO_ROOT, usage_error, CommandParser
from common.cpu_time import CpuMeter, engine_job_role_by_engine, split_engine_roles
from rollout.engines import EngineError, EnginePool
from rollout.model import prepare_model
from common.process import ProcessStartError
from rollout.serve import stop_on_sigterm
from router.launch import VLLM_ROUTER_LOG_LEVELS, start_router
from router.policies import POLICY_NAMES, make_policy, registered_policy_names
from router.replay import (ReplayError, WordText, class_request_figures, replay, request_times, scrape_engines,
                           step_wait_s)
from router.sim.calibrate import measure_step_samples, step_samples_from_timeline
from router.sim.cost_model import StepSample, fit_linear_step_cost
from router.sim.engine import EngineConfig
from router.sim.errors import SimError
from router.sim.experiments import (P50_RATIO_LIMIT, aggregate, best_sweep_label, ceilings_headline, ceilings_markdown,
                                    ceilings_points, headline, table5_markdown)
from router.sim.metrics import step_figures
from router.sim.plots import plot_ceilings
from router.sim.simulator import SignalConfig, SimConfig, Simulation
from router.sim.trace import read_trace, write_trace
from router.sim.workload import ClassSpec, LengthDist, WorkloadConfig, generate_trace

RECIPES = REPO_ROOT / "recipes"
MIXTURE = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}  # the trainer's target rho (paper section 5.2)
FIGURES = ("samples_per_min", "requests_per_min", "prefix_hit_rate", "prefill_tok_s", "decode_tok_s")


def cpu_classes(context_limit_tokens: int, tool_gap_share: float) -> dict[str, ClassSpec]:
    """The paper's three classes (``router.sim.workload.paper_classes``) scaled to 2 CPU cores.

    Lengths are ~1/60 of Table 2's (agent request prompts p50 600 / p95 1,500 tokens over
    ~5 turns instead of 38K / 103K over 70; rlvr decodes p50 200 / p95 700 instead of
    48K / 131K), which keeps the shape: agent = long growing prefixes with short outputs,
    rlvr = short prompts with long decode tails, rlhf in between. Tool gaps take
    ``tool_gap_share`` of an agent session's time (a sandbox command on this machine takes
    about as long as a model turn; Table 3 has 6.6-23%). The agent system prompt (the class
    prefix every agent session shares) is 200 tokens against the task prompt's p50 of 100:
    2/3 of a median first-turn prompt, the share ``paper_classes`` assumes (3,000 of 4,500),
    so the real vLLM Router's text tree sees the structure the simulator's mimic sees.
    """
    cap = context_limit_tokens
    return {
        "agent": ClassSpec(
            prompt=LengthDist(100, 250, 32, cap // 4), output=LengthDist(16, 64, 1, 256), group_size=4,
            turns="multi", input_p50=600, input_p95=1500, turns_mean=5.0, class_prefix_tokens=200,
            tool_gap_share=tool_gap_share, turn_time_hint_s=2.0,
        ),
        "rlhf": ClassSpec(prompt=LengthDist(60, 200, 8, 512), output=LengthDist(80, 250, 1, cap), group_size=4),
        "rlvr": ClassSpec(prompt=LengthDist(50, 120, 8, 256), output=LengthDist(200, 700, 1, cap), group_size=4),
    }


@dataclasses.dataclass(frozen=True)
class RouterRun:
    """One router configuration of the benchmark."""

    label: str
    impl: str  # "vllm" (the real vLLM Router) or "ours"
    policy: str  # ours: the policy name; vllm: cache_aware
    ceiling: int
    params: dict = dataclasses.field(default_factory=dict)
    sweep: bool = False

    def router_cfg(self) -> dict:
        """The ``router`` config group for :func:`router.launch.start_router`."""
        name = "vllm" if self.impl == "vllm" else self.policy.replace("_", "-")
        path = RECIPES / "router" / f"{name}.yaml"
        # Policies without a recipe of their own (aimd, tool_pause) run with their defaults.
        cfg = (OmegaConf.to_container(OmegaConf.load(path)) if path.exists()
               else {"impl": "ours", "policy": self.policy, "params": {}})
        cfg["params"] = {**(cfg.get("params") or {}), **self.params}
        return cfg

    def sim_policy(self, missing_tokens_share: float = 0.0, missing_tokens_at_s: list[float] | None = None):
        """The same policy for the simulator. The real vLLM Router is its point-by-point
        mimic ``vllm_router`` (router/policies/vllm_router.py: an approximate text tree per
        worker, never told about evictions) with the thresholds this run launched it with
        and the requests the real one placed without tokens (``missing_tokens``: an engine did
        not tokenize the prompt within its 1 s budget, which the simulator does not model):
        at the times the run measured them (``missing_tokens_at_s``), or, for runs saved
        before those were sampled, as a share drawn at random; the simulator synthesises the
        prompt text it matches on (router/sim/prompt_text.py)."""
        if self.impl == "vllm":
            cfg = self.router_cfg()
            missing = ({"missing_tokens_at_s": list(missing_tokens_at_s)} if missing_tokens_at_s is not None
                       else {"missing_tokens_share": missing_tokens_share})
            return make_policy("vllm_router", {
                **{k: cfg[k] for k in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold",
                                       "eviction_interval_s", "max_tree_size") if k in cfg}, **missing})
        return make_policy(self.policy, self.router_cfg()["params"])


WARMUP_MINUTES_DEFAULT = 1.0
"""--warmup-minutes when not given."""

REPLAY_PARAMS = {"kv_horizon": {"request_bound": False}}
"""Options our policies run with here: the replay sends each request's exact output length as
``max_tokens`` (router/replay.py), so kv_horizon's ``request_bound`` would know every sample's
length in advance, which no trainer's request tells it."""


def missing_tokens_share(decisions: dict[str, int] | None) -> float:
    """Share of placements the real router made without tokens (0 when none were counted)."""
    total = sum((decisions or {}).values())
    return (decisions or {}).get("missing_tokens", 0) / total if total else 0.0


def plan_runs(sweep: list[int], ceiling: int, policies: list[str],
              policy_params: dict[str, dict] | None = None, baseline_at_ceiling: bool = True) -> list[RouterRun]:
    """The sweep of the real vLLM Router, then every router at the permissive ceiling; our
    policies with :data:`REPLAY_PARAMS` and ``policy_params[policy]`` (named in the label).
    ``baseline_at_ceiling=False`` leaves out the real vLLM Router at the ceiling when the sweep
    does not hold it (``--no-baseline-at-ceiling``: a run whose ceiling another run already
    swept, to be combined with it)."""
    runs = [RouterRun(f"vllm-router c={c}", "vllm", "cache_aware", c, sweep=True) for c in sweep]
    if baseline_at_ceiling and ceiling not in sweep:
        runs.append(RouterRun(f"vllm-router c={ceiling}", "vllm", "cache_aware", ceiling))
    for p in policies:
        extra = (policy_params or {}).get(p, {})
        named = "(" + ",".join(f"{k}={v}" for k, v in extra.items()) + ")" if extra else ""  # no [ ]: rich markup
        runs.append(RouterRun(f"{p}{named} c={ceiling}", "ours", p, ceiling,
                              params={**REPLAY_PARAMS.get(p, {}), **extra}))
    return runs


def parse_policy_params(items: list[str], policies: list[str]) -> dict[str, dict]:
    """``--policy-param POLICY.KEY=VALUE`` values as ``{policy: {key: value}}`` (VALUE read as
    YAML: 1.25, true, ...).

    Raises:
        SystemExit: an item of another shape, or for a policy not in ``policies``.
    """
    import yaml

    out: dict[str, dict] = {}
    for item in items:
        name, sep, value = item.partition("=")
        policy, dot, key = name.partition(".")
        if not (sep and dot and key):
            raise usage_error(f"--policy-param {item!r}: give POLICY.KEY=VALUE, e.g. "
                              "--policy-param kv_horizon.target_usage=1.25")
        if policy not in policies:
            raise usage_error(f"--policy-param {item!r}: {policy!r} is not in --policies ({', '.join(policies)})")
        try:
            out.setdefault(policy, {})[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise usage_error(f"--policy-param {item!r}: {value!r} is not a value") from None
    return out


# ----------------------------------------------------------------------------- engines


async def _engines_idle(urls: list[str], timeout_s: float) -> None:
    """Wait until no engine runs or queues a request (aborted requests drain)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            ms = await scrape_engines(http, urls)
            if all(m.num_requests_running == 0 and m.num_requests_waiting == 0 for m in ms):
                return
            if time.monotonic() > deadline:
                raise ReplayError(f"engines still busy {timeout_s:.0f} s after the run ended")
            await asyncio.sleep(1.0)


async def _reset_prefix_caches(urls: list[str]) -> None:
    """POST /reset_prefix_cache on each engine (vLLM dev-mode endpoint)."""
    async with aiohttp.ClientSession() as http:
        for url in urls:
            async with http.post(f"{url}/reset_prefix_cache") as r:
                if r.status != 200:
                    raise ReplayError(f"{url}/reset_prefix_cache answered HTTP {r.status}")


def kv_bytes_per_token(model_path: Path, dtype_bytes: int) -> int:
    """K and V bytes per token of the model (2 * layers * kv_heads * head_dim * dtype bytes)."""
    cfg = json.loads((model_path / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * dtype_bytes


# ----------------------------------------------------------------------------- report


def _rel(v: float | None, b: float | None) -> str:
    return f"{v / b:.2f}x" if v is not None and b else "n/a"


def _err(sim: float, real: float) -> float | None:
    return (sim - real) / real if real else None


def regime(timeline: list[dict], instances: int, window: tuple[float, float]) -> dict:
    """Whether a run is in the regime where admission matters (the baseline issue's item 5).

    Args:
        timeline: the replay's samples (``in_flight_units``, per-engine ``running`` and
            ``kv_usage``; with our router also ``caps``: ``caps.<instance>.<class>`` per
            instance and class, as :func:`router.sim.metrics.policy_caps` flattens them).
        instances: engines behind the router.
        window: the measurement window (s); samples outside it are left out (all are used
            when none falls inside).

    Returns:
        ``sessions_per_engine`` (units in flight, tool gaps included, per engine, mean),
        ``running_per_engine`` (requests the engines run, mean), ``kv_usage`` (mean over
        engines and samples, 0-1), ``class_caps_above_1`` (share of samples in which every
        class cap of every instance is above 1; ``None`` for a router that publishes no class
        caps, e.g. the real vLLM Router or kv_horizon) and ``samples``.
    """
    pts = [p for p in timeline if window[0] <= p["t_s"] <= window[1]] or list(timeline)
    if not pts:
        return {"sessions_per_engine": 0.0, "running_per_engine": 0.0, "kv_usage": 0.0,
                "class_caps_above_1": None, "samples": 0}
    with_caps = []
    for p in pts:
        caps = [v for k, v in (p.get("caps") or {}).items()
                if k.startswith("caps.") and k.rsplit(".", 1)[1] in MIXTURE]
        if caps:
            with_caps.append(min(caps) > 1)
    return {
        "sessions_per_engine": statistics.fmean(p["in_flight_units"] for p in pts) / instances,
        "running_per_engine": statistics.fmean(sum(p["running"]) for p in pts) / instances,
        "kv_usage": statistics.fmean(statistics.fmean(p["kv_usage"]) for p in pts),
        "class_caps_above_1": sum(with_caps) / len(with_caps) if with_caps else None,
        "samples": len(pts),
    }


def samples_per_min_over_time(timeline: list[dict], bin_s: float = 60.0) -> list[float]:
    """Complete samples/min in each whole ``bin_s`` of a run's wall time, from the replay's
    timeline (cumulative ``completed`` units per class, sampled every few seconds; linear
    between samples). Shows a router's transient: at a permissive ceiling the vLLM Router
    finishes the short samples of the first release early and its rate falls as long
    sessions pile up in the engines, so whole-run figures of a short run mix a fill with a
    steady state.

    Args:
        timeline: samples with ``t_s`` (s from the run's start) and ``completed`` (class ->
            units completed so far), in time order.
        bin_s: width of a bin (s, > 0).

    Returns:
        One rate per bin [k bin_s, (k + 1) bin_s) that the timeline covers to its end (a last
        partial bin is left out); empty for a timeline shorter than one bin.

    Raises:
        ValueError: ``bin_s`` <= 0.
    """
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0 s, got {bin_s}")
    pts = [(0.0, 0.0)] + [(p["t_s"], float(sum(p["completed"].values()))) for p in timeline]

    def done_at(t: float) -> float:
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if t0 <= t <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return pts[-1][1]

    bins = int(pts[-1][0] // bin_s)
    edges = [done_at(k * bin_s) for k in range(bins + 1)]
    return [(b - a) * 60.0 / bin_s for a, b in zip(edges, edges[1:])]


def _by_minute_section(per_seed: list[tuple[int, list[dict]]], order: list[str], out: Path) -> list[str]:
    """Markdown of each router's complete samples/min minute by minute (mean over seeds, and
    the range over seeds), and its plot ``rate_over_time.png`` in ``out``."""
    title = ("### Complete samples/min minute by minute (wall time from the run's start, whole minutes; mean over "
             "seeds, [min-max] over seeds)")
    rates: dict[str, list[list[float]]] = {}
    short = []
    for seed, results in per_seed:
        for r in results:
            rate = samples_per_min_over_time(r.get("timeline") or [])
            rates.setdefault(r["label"], []).append(rate)
            if not rate:
                short.append(f"{r['label']} of seed {seed}")
    (out / "rate_over_time.png").unlink(missing_ok=True)  # never a plot of an earlier summary
    if short:
        return [title, "", f"Left out: no whole minute of timeline in {', '.join(short)} (a shorter run, or one saved "
                "without a timeline).",
                ""]
    n = min((len(x) for v in rates.values() for x in v), default=0)
    if n == 0:
        return []
    head = "| Router | " + " | ".join(f"{k}-{k + 1}" for k in range(n)) + " |"
    lines = [title, "", head, "|---" * (n + 1) + "|"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label in order:
        cols = [[x[k] for x in rates[label]] for k in range(n)]
        means = [statistics.fmean(c) for c in cols]
        lines.append(f"| {label} | " + " | ".join(
            f"{m:.1f}" + (f" [{min(c):.0f}-{max(c):.0f}]" if len(c) > 1 else "") for m, c in zip(means, cols)) + " |")
        mids = [k + 0.5 for k in range(n)]
        ax.plot(mids, means, marker="o", label=label)
        if len(cols[0]) > 1:
            ax.fill_between(mids, [min(c) for c in cols], [max(c) for c in cols], alpha=0.15)
    ax.set_xlabel("minute of the run")
    ax.set_ylabel("complete samples/min (mean over seeds; band: range)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "rate_over_time.png", dpi=120)
    plt.close(fig)
    return lines + ["", "Plot: `rate_over_time.png`.", ""]


PROFILES = (("", "step costs from the calibration on idle engines"),
            ("_insitu", "step costs in situ: fitted to the other runs' engine counters"),
            ("_cpu", "step costs from the calibration, scaled to the CPU the engines' model threads had in the run"))
"""The simulator's step-cost profiles (:func:`simulate`): key infix, what it is."""


def windows(results: list[dict], warmup_minutes: float) -> list[tuple[str, list[tuple[str, str]], str]]:
    """The measurement windows ``results`` carry: (real key, [(simulator key, profile)],
    title). The whole run always; the after-warm-up window when every run has it; in each,
    the simulator replays of :data:`PROFILES` that every vLLM Router run has."""
    out = []
    spans = [("real", "", "whole run (from the first unit completion)")]
    if warmup_minutes > 0 and results and all(r.get("real_after_warmup") for r in results):
        spans.append(("real_after_warmup", "_after_warmup", f"after the first {warmup_minutes:g} min (warm)"))
    for real_key, tail, title in spans:
        sims = [(f"sim{infix}{tail}", what) for infix, what in PROFILES
                if all(r.get(f"sim{infix}{tail}") for r in results if r["impl"] == "vllm")]
        out.append((real_key, sims, title))
    return out


def _window_section(per_seed: list[tuple[int, list[dict]]], order: list[str], sweep: list[str], real_key: str,
                    sims: list[tuple[str, str]], lines: list[str]) -> dict:
    """One window's part of :func:`summarize_seeds`: appends its markdown to ``lines`` and
    returns its figures (baseline, aggregate, mimic error per simulator key in ``sims``,
    headlines)."""
    real = [{"label": r["label"], "policy": r["policy"], "ceiling": r["ceiling"], "tags": [], "summary": r[real_key]}
            for _, results in per_seed for r in results]
    agg = aggregate(real)
    base = best_sweep_label(agg, sweep)
    first = per_seed[0][1]
    factors = [(lb, agg[lb]["ceiling"] / agg[base]["ceiling"]) for lb in order]
    lines += [table5_markdown(agg, base, order, f"Real engines, change vs {base} (sweep-tuned), mean ± std over seeds"),
              "", ceilings_markdown(agg, base, factors,
                                    f"Mixture: each class's p50 completion time (release to completion) over {base}'s, "
                                    "TV distance, prefix hit (means over seeds; ceiling: x the baseline's)"), ""]
    ceiling_heads = [ceilings_headline(agg, lb, f, base) for lb, f in factors if lb != base]
    lines += ["", *ceiling_heads, ""]
    mimic = {sim_key: _mimic_table(per_seed, sweep, real_key, sim_key, what, lines) for sim_key, what in sims}
    heads = [headline(agg, r["label"], base, "vllm-router (sweep-tuned, real)") for r in first if r["impl"] == "ours"]
    lines += ["", *heads, ""]
    return {"baseline": base, "aggregate": agg, "mimic_error": mimic.get(sims[0][0], {}) if sims else {},
            "mimic_error_by_profile": mimic, "headlines": heads, "ceiling_headlines": ceiling_heads,
            "ceiling_points": ceilings_points({lb: {**row, "policy": router_family(lb)} for lb, row in agg.items()},
                                              base, factors)}


def router_family(label: str) -> str:
    """A run label without its ceiling (``kv_horizon(interference_blocks=64) c=20`` ->
    ``kv_horizon(interference_blocks=64)``): one line of the ceilings plot per family."""
    name, sep, ceiling = label.rpartition(" c=")
    return name if sep and ceiling.isdigit() else label


CEILINGS_PLOTS = {"real": "ceilings.png", "real_after_warmup": "ceilings_after_warmup.png"}
"""The ceilings plot of each window (:func:`_ceilings_plot`), by its real key."""


def _ceilings_plot(points: dict, base: str, out: Path, real_key: str, title: str) -> list[str]:
    """Plot each router family's samples/min change and largest class p50 completion ratio
    against ``base`` over the trainer ceiling (:func:`router.sim.plots.plot_ceilings`; the
    goal's 2x dashed) into ``out``; the markdown line naming it."""
    name = CEILINGS_PLOTS[real_key]
    plot_ceilings(points, P50_RATIO_LIMIT, str(out / name), f"routers on real engines against {base}, {title}")
    return [f"Plot: `{name}` (samples/min and the largest class p50 ratio over the ceiling, one line per router).", ""]


def _mimic_table(per_seed: list[tuple[int, list[dict]]], sweep: list[str], real_key: str, sim_key: str, what: str,
                 lines: list[str]) -> dict[str, dict]:
    """Markdown (appended to ``lines``) and figures of the simulator's vllm_router mimic
    against the real router per sweep point, simulator replays ``sim_key`` (``what``)."""
    first = per_seed[0][1]
    lines += [f"### The simulator's vllm_router mimic against the real vLLM Router, per sweep point ({what})", "",
              "Error = simulator − real, per seed then mean ± std. Goal (baseline issue): hit rate within "
              "3 points, samples/min within 10%.", "",
              "| sweep point | hit real | hit sim | hit error (points) | samples/min real | sim | error |",
              "|---|---|---|---|---|---|---|"]
    mimic: dict[str, dict] = {}
    for label in sweep + [r["label"] for r in first if r["impl"] == "vllm" and not r["sweep"]]:
        rows = [r for _, results in per_seed for r in results if r["label"] == label and r.get(sim_key)]
        if not rows:
            continue
        hit_err = [100 * (r[sim_key]["prefix_hit_rate"] - r[real_key]["prefix_hit_rate"]) for r in rows]
        spm_err = [100 * _err(r[sim_key]["samples_per_min"], r[real_key]["samples_per_min"]) for r in rows
                   if r[real_key]["samples_per_min"]]

        def ms(v: list[float]) -> str:
            return f"{statistics.fmean(v):+.1f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.1f}" if v else "n/a"

        mimic[label] = {"hit_error_points": hit_err, "samples_per_min_error_pct": spm_err}
        lines.append(f"| {label} | {statistics.fmean(r[real_key]['prefix_hit_rate'] for r in rows):.1%} | "
                     f"{statistics.fmean(r[sim_key]['prefix_hit_rate'] for r in rows):.1%} | {ms(hit_err)} | "
                     f"{statistics.fmean(r[real_key]['samples_per_min'] for r in rows):.2f} | "
                     f"{statistics.fmean(r[sim_key]['samples_per_min'] for r in rows):.2f} | {ms(spm_err)}% |")
    lines.append("")
    return mimic


def _decisions_section(per_seed: list[tuple[int, list[dict]]], order: list[str]) -> list[str]:
    """Markdown: how each vllm-router run placed its requests (the real router's
    :data:`ROUTER_DECISIONS` against the mimic's), shares summed over seeds; ``[]`` when no
    run recorded them (runs saved before they were scraped)."""
    outcomes = ("prefix_hit", "prefix_miss", "missing_tokens", "load_imbalance")
    rows = []
    for label in order:
        runs = [r for _, res in per_seed for r in res if r["label"] == label and r.get("router_decisions")]
        if not runs:
            continue
        cells = []
        for key in ("router_decisions", "sim_decisions"):
            total = {o: sum((r.get(key) or {}).get(o, 0) for r in runs) for o in outcomes}
            n = sum(total.values())
            cells.append(" / ".join(f"{100 * total[o] / n:.0f}" if n else "-" for o in outcomes))
        rows.append(f"| {label} | {cells[0]} | {cells[1]} |")
    if not rows:
        return []
    return ["### How the vLLM Router placed requests (whole run, % of placements over seeds)", "",
            "prefix hit / prefix miss / missing tokens (an engine did not return the prompt's tokens, refused or not within the router's "
            "1 s: least loaded) / load imbalance. The simulator's mimic takes the times each run measured "
            "its missing tokens at (runs saved before they were sampled: their share, drawn at random) as an input.", "",
            "| Router | real | simulator |", "|---|---|---|", *rows, ""]


def run_folder_name(label: str) -> str:
    """The folder of one router's run inside its seed's folder (``vllm-router c=16`` ->
    ``vllm-router_c16``): its router log, errors and recorded trace."""
    return label.replace(" ", "_").replace("=", "")


def class_requests(requests, summary: dict, after_warmup: dict | None) -> dict:
    """:func:`router.replay.class_request_figures` in each window a run's real figures have
    (``real``: ``summary["window_s"]``; ``real_after_warmup`` where there is one)."""
    out = {"real": class_request_figures(requests, tuple(summary["window_s"]))}
    if after_warmup:
        out["real_after_warmup"] = class_request_figures(requests, tuple(after_warmup["window_s"]))
    return out


def add_class_requests(runs: list[dict], seed_dir: Path) -> None:
    """Give the runs of one seed folder saved before ``class_requests`` was recorded that
    figure from their recorded trace (``<seed_dir>/<run folder>/recorded_trace.jsonl``), where
    it is there and readable; the others are left as they are (the summary says n/a)."""
    for r in runs:
        if r.get("class_requests") is not None or not r.get("real"):
            continue
        path = seed_dir / run_folder_name(r["label"]) / "recorded_trace.jsonl"
        try:
            requests = [q for session in read_trace(path) for q in session.requests]
            r["class_requests"] = class_requests(requests, r["real"], r.get("real_after_warmup"))
        except (OSError, SimError, KeyError, TypeError, ValueError):
            continue


def _class_requests_section(per_seed: list[tuple[int, list[dict]]], order: list[str], real_key: str,
                            title: str) -> list[str]:
    """Markdown: each class's request time at the client in one window (p50 s and s per
    output token, means over seeds), per run; ``[]`` where no run has the figure."""
    classes = list(MIXTURE)
    rows = []
    for label in order:
        got = [(r.get("class_requests") or {}).get(real_key) for _, res in per_seed for r in res if r["label"] == label]
        got = [g for g in got if g is not None]
        if not got:
            continue
        cells = []
        for b in classes:
            p50 = _mean_cell([(g.get(b) or {}).get("p50_s") for g in got], ".1f")
            per_tok = _mean_cell([(g.get(b) or {}).get("s_per_output_token") for g in got], ".3f")
            cells.append(f"{p50} | {per_tok}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    head = " | ".join(f"{b} p50 s | {b} s/token" for b in classes)
    return [f"### Request time per class ({title}; means over seeds)", "",
            "Each request from its arrival at the router to its last token (a hold included), the requests that "
            "arrived and finished in the window: p50 seconds, and the median of seconds per output token "
            "(decode-heavy requests on an engine whose steps also prefill other prompts take long per token; "
            "compare the engines' steps below). Runs recorded before the figure and without a recorded trace: n/a.",
            "", f"| Router | {head} |", "|---|" + "---|" * (2 * len(classes)), *rows, ""]


def _mean_cell(values: list, fmt: str = ".2f") -> str:
    """The mean of the values that are neither None nor NaN, as ``fmt``; "n/a" when none is."""
    got = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return f"{statistics.fmean(got):{fmt}}" if got else "n/a"


def _request_times_section(per_seed: list[tuple[int, list[dict]]], order: list[str]) -> list[str]:
    """Markdown: where each run's requests spent their time (:func:`router.replay.request_times`),
    real beside the simulator's replay (CPU-scaled profile where the run has one, else the
    calibration's), means over seeds; ``[]`` when no run recorded them (runs saved before the
    engines' latency counters)."""
    rows = []
    for label in order:
        runs = [r for _, res in per_seed for r in res if r["label"] == label and r.get("request_times")]
        if not runs:
            continue
        got = [r["request_times"] for r in runs]
        sims = [r.get("sim_cpu") or r.get("sim") or {} for r in runs]

        def cell(key: str) -> str:
            return _mean_cell([g.get(key) for g in got])

        def both(real: list, sim: list) -> str:
            return f"{_mean_cell(real)} / {_mean_cell(sim)}"

        core = " | ".join(both([g.get(f"{k}_s") for g in got], [m.get(f"request_{k}_s") for m in sims])
                          for k in ("queue", "prefill", "decode"))
        added = " + ".join(_mean_cell([r.get(k) for r in runs]) for k in ("sim_request_overhead_s", "sim_continuation_delay_s"))
        rows.append(f"| {label} | {cell('client_s')} | {cell('between_s')} | {cell('overhead_s')} | {cell('hold_s')} | "
                    f"{cell('api_s')} | {core} | {added} |")
    if not rows:
        return []
    return ["### Where a request's time went (whole run, s per request, means over seeds)", "",
            "At the client; the client's own time between a response and the session's next request, past the tool "
            "gap (runs recorded before it was measured: n/a); outside the engines (the client's time less vLLM's e2e_request_latency: the router, "
            "the HTTP hops, the API servers before vLLM stamps the arrival); held by our router (its held seconds over "
            "the finished requests: counted for other requests than those that finished, so behind our router the "
            "time outside the engines is n/a); inside vLLM's e2e but outside the engine core's queue, prefill and "
            "decode (the API server's input and output processing, and the wait for the engine core to take a request "
            "in between two steps); then vLLM's queue (waiting in the scheduler), prefill (first schedule -> first "
            "token) and decode (first token -> last) times, real / simulated (the simulator's engines split a request "
            "the same way; CPU-scaled profile where the run has one). The last column is what the simulator added "
            "before each request (the time outside the engines plus the API server's, less the wait for a running "
            "step, which the simulated engine counts as queue time) + before each later request of a session "
            "(--no-request-overhead: nothing).", "",
            "| Router | client | client between requests | outside the engines | held | API server | queue | prefill | decode "
            "| added in the simulator |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def summarize_seeds(per_seed: list[tuple[int, list[dict]]], out: Path, minutes: float,
                    warmup_minutes: float = 0.0) -> str:
    """The table over seeds, per measurement window (:func:`windows`): each router's change
    against the sweep-tuned real vLLM Router (the sweep point with the best mean samples/min
    over seeds in that window, as the simulator's Table 5 picks it:
    :func:`router.sim.experiments.best_sweep_label`), mean ± spread, the simulator mimic's
    error against the real router per sweep point and one headline per policy; then the
    regime figures. Writes ``summary.md`` and ``summary.json`` in ``out``; returns the markdown."""
    first = per_seed[0][1]
    order = [r["label"] for r in first]
    sweep = [r["label"] for r in first if r["sweep"]] or order[:1]
    seeds = [s for s, _ in per_seed]
    lines = [f"# Routers on 2 real vLLM CPU engines: {len(seeds)} seed(s) {seeds}, {minutes:g} min per router", ""]
    sources: dict[str, list[str]] = {}
    for r in first:
        if r.get("source"):
            sources.setdefault(r["source"], []).append(r["label"])
    if sources:
        lines += [f"Combined (`--combine`) from {len(sources)} runs of the same seeds, traces and options, each of "
                  "which started and calibrated its own engines: "
                  + "; ".join(f"`{src}`: {', '.join(labels)}" for src, labels in sources.items()) + ".", ""]
    per_window: dict[str, dict] = {}
    spans = windows([r for _, res in per_seed for r in res], warmup_minutes)
    for name in CEILINGS_PLOTS.values():
        (out / name).unlink(missing_ok=True)  # never a plot of an earlier summary
    for real_key, sims, title in spans:
        lines += [f"## Window: {title}", ""]
        per_window[real_key] = fig = _window_section(per_seed, order, sweep, real_key, sims, lines)
        lines += _ceilings_plot(fig.pop("ceiling_points"), fig["baseline"], out, real_key, title)
    lines += _decisions_section(per_seed, order)
    lines += _request_times_section(per_seed, order)
    for real_key, _sims, title in spans:
        lines += _class_requests_section(per_seed, order, real_key, title)
    lines += ["### Regime (means over seeds, whole run)", "",
             "| Router | sessions/engine | running/engine | KV usage | every class cap > 1 | preemptions |",
             "|---|---|---|---|---|---|"]
    regimes: dict[str, list[dict]] = {}
    for _, results in per_seed:
        for r in results:
            regimes.setdefault(r["label"], []).append(r["regime"])
    for label in order:
        rg = regimes[label]
        caps = [g["class_caps_above_1"] for g in rg if g["class_caps_above_1"] is not None]
        lines.append(f"| {label} | {statistics.fmean(g['sessions_per_engine'] for g in rg):.1f} | "
                     f"{statistics.fmean(g['running_per_engine'] for g in rg):.1f} | "
                     f"{statistics.fmean(g['kv_usage'] for g in rg):.2f} | "
                     + (f"{statistics.fmean(caps):.0%} of the time" if caps else "n/a (no class caps)")
                     + f" | {statistics.fmean(r['real']['preemptions'] for _, res in per_seed for r in res if r['label'] == label):.0f} |")
    lines.append("")
    lines += _by_minute_section(per_seed, order, out)
    lines += _steps_section(per_seed, order)
    lines += _engines_section(per_seed, order)
    twice = "samples_after_runs" in _saved_calibration(out)
    lines += _cpu_section(per_seed, order, _calibration_cpu(out),
                          "mean of before and after the runs" if twice else "before the runs")
    lines += _drift_section(out)
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    summary = {"seeds": seeds, "regime": regimes, "windows": per_window, **({"sources": sources} if sources else {})}
    summary.update(per_window["real"])  # the whole run's keys at the top level, as before
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    Console(width=160).print(text)
    return text


def _real_window(r: dict) -> tuple[float, float]:
    """The window (s) run ``r``'s real figures were measured over (runs saved without: all of it)."""
    return tuple(r["real"].get("window_s") or (0.0, math.inf))


def _counter_ends(timeline: list[dict], window: tuple[float, float]) -> tuple[dict, dict] | None:
    """The first and last timeline samples in ``window`` that carry the engines' step counters
    (None: fewer than two, e.g. runs recorded before the counters were scraped)."""
    pts = [p for p in timeline if window[0] <= p["t_s"] <= window[1] and p.get("steps")]
    return (pts[0], pts[-1]) if len(pts) >= 2 else None


def real_step_figures(timeline: list[dict], window: tuple[float, float]) -> dict | None:
    """:func:`router.sim.metrics.step_figures` of the real engines over ``window``, between
    :func:`_counter_ends` (None without them). The time in steps is the wall time x engines:
    the engines' mean step when they never idle, more when they do."""
    ends = _counter_ends(timeline, window)
    if ends is None:
        return None
    a, b = ends
    dt = b["t_s"] - a["t_s"]
    delta = {k: sum(y - x for x, y in zip(a[k], b[k])) for k in ("steps", "computed_prompt", "generated")}
    return step_figures(delta["steps"], dt, dt * len(a["steps"]), delta["computed_prompt"], delta["generated"])


def real_engine_figures(timeline: list[dict], window: tuple[float, float]) -> list[dict] | None:
    """Per engine, in the engines' order: :func:`router.sim.metrics.step_figures` of that engine
    over ``window`` (its wall time as its time in steps), ``requests`` finished (vLLM's
    e2e_request_latency count) and, where the timeline has the engine core's sums, their mean
    ``request_queue_s``, ``request_prefill_s``, ``request_decode_s``; the shape of the
    simulator's ``engines`` (:func:`router.sim.metrics.engine_figures`). None: fewer than two
    samples in ``window`` with step counters (:func:`_counter_ends`)."""
    ends = _counter_ends(timeline, window)
    if ends is None:
        return None
    a, b = ends
    dt = b["t_s"] - a["t_s"]
    out = []
    for i in range(len(a["steps"])):
        def delta(key: str) -> float:
            return (b[key][i] - a[key][i]) if len(a.get(key) or ()) > i and len(b.get(key) or ()) > i else math.nan
        n = delta("e2e_n")
        row = {**step_figures(delta("steps"), dt, dt, delta("computed_prompt"), delta("generated")),
               "requests": n}
        for k in ("queue", "prefill", "decode"):
            row[f"request_{k}_s"] = delta(f"{k}_s") / n if n and n > 0 else math.nan
        out.append(row)
    return out


def _engines_section(per_seed: list[tuple[int, list[dict]]], order: list[str]) -> list[str]:
    """Markdown: each engine of each run, real beside the simulator's replay (CPU-scaled profile
    where the run has one, else the calibration's), the engine that computed more prompt tokens
    first in both (the simulator's engines are not the real ones by index: a placement decides
    which engine gets which sessions), means over seeds; ``[]`` when no run has both."""
    cols = (("requests", "requests", ".0f"), ("steps_per_s", "steps/s", ".1f"), ("ms_per_step", "ms per step", ".0f"),
            ("prefill_tokens_per_step", "prefill tokens per step", ".1f"),
            ("decode_seqs_per_step", "decoding sequences per step", ".1f"),
            ("request_s", "request s (queue + prefill + decode)", ".2f"))

    def with_total(e: dict) -> dict:
        return dict(e, request_s=sum(e.get(f"request_{k}_s", math.nan) for k in ("queue", "prefill", "decode")))

    def ranked(engines: list[dict]) -> list[dict]:
        return [with_total(engines[i]) for i in _prefill_order(engines)]

    lines = []
    for label in order:
        pairs = []
        for _, results in per_seed:
            for r in results:
                if r["label"] != label:
                    continue
                real = real_engine_figures(r.get("timeline") or [], _real_window(r))
                sim = (r.get("sim_cpu") or r.get("sim") or {}).get("engines")
                if not (real and sim and len(real) == len(sim)):
                    continue
                worker = [(e or {}).get("engine_worker") for e in (r.get("cpu_cores_by_engine") or [None] * len(real))]
                # a replay scaled per engine: pair by the ranks its factors were given by
                ranks = (r.get("cpu_profile") or {}).get("engine_ranks") if r.get("sim_cpu") else None
                sim_ranked = [with_total(sim[i]) for i in ranks] if ranks else ranked(sim)
                pairs.append(list(zip(ranked([dict(e, worker=w) for e, w in zip(real, worker)]), sim_ranked)))
        if not pairs:
            continue
        for j in range(len(pairs[0])):
            name = "more prefill" if j == 0 else "less prefill" if j == len(pairs[0]) - 1 else f"engine {j + 1}"
            cells = [f"{_mean_cell([p[j][0].get(k) for p in pairs], fmt)} / {_mean_cell([p[j][1].get(k) for p in pairs], fmt)}"
                     for k, _, fmt in cols]
            lines.append(f"| {label} | {name} | " + " | ".join(cells)
                         + f" | {_mean_cell([p[j][0].get('worker') for p in pairs], '.2f')} |")
    if not lines:
        return []
    return ["### Per engine, real / simulated (whole run, means over seeds; CPU-scaled profile where the run has one)",
            "", "The engine that computed more prompt tokens first, in the run and in its replay alike (a replay "
            "scaled per engine: in the order its factors were given). A real step's ms is wall time per step (an "
            "upper bound where the engine idled). Real figures from the first unit completion on; the simulator's "
            "requests and their split over its whole run. The last column is the CPU its model "
            "worker had during the run (runs recorded before it was measured per engine: n/a).", "",
            "| Router | engine | " + " | ".join(f"{name} real / sim" for _, name, _ in cols) + " | worker cores |",
            "|---|---|" + "---|" * len(cols) + "---|", *lines, ""]


def _steps_section(per_seed: list[tuple[int, list[dict]]], order: list[str]) -> list[str]:
    """Real against simulated engine steps per run (calibration profile; runs without step
    counters or an ``engine_steps`` replay: left out; none: no section)."""
    cols = (("steps_per_s", "steps/s", ".1f"), ("ms_per_step", "ms per step", ".0f"),
            ("prefill_tokens_per_step", "prefill tokens per step", ".1f"),
            ("decode_seqs_per_step", "decoding sequences per step", ".1f"))
    rows: dict[str, list[tuple[dict, dict]]] = {}
    for _, results in per_seed:
        for r in results:
            real = real_step_figures(r.get("timeline") or [], _real_window(r))
            sim = (r.get("sim") or {}).get("engine_steps")
            if real and sim:
                rows.setdefault(r["label"], []).append((real, sim))
    if not rows:
        return []
    lines = ["### Engine steps, real vs simulator (calibration profile; both engines summed, whole run, mean over "
             "seeds; a real step's ms is wall time per step, an upper bound where an engine idled)", "",
             "| Router | " + " | ".join(f"{name} real | sim" for _, name, _ in cols) + " |",
             "|---|" + "---|---|" * len(cols)]
    for label in order:
        pairs = rows.get(label)
        if pairs:
            lines.append(f"| {label} | " + " | ".join(
                f"{statistics.fmean(p[0][k] for p in pairs):{fmt}} | {statistics.fmean(p[1][k] for p in pairs):{fmt}}"
                for k, _, fmt in cols) + " |")
    return lines + [""]


CPU_ROLES = (("engine_worker", "engine workers (model)"), ("engine_core", "engine cores (scheduler)"),
             ("api_server", "API servers"), ("router", "router"), ("job", "replay client"), ("other", "other"))
"""The roles of :func:`common.cpu_time.engine_job_role`, in table order, with their column names."""


def _saved_calibration(out: Path) -> dict:
    """``out/calibration.json`` ({} when there is none or it cannot be read)."""
    try:
        saved = json.loads((out / "calibration.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _calibration_cpu(out: Path) -> dict | None:
    """``cpu_cores`` of the calibration saved in ``out/calibration.json`` (None: no such file,
    or one saved before it was recorded or unreadable)."""
    cores = _saved_calibration(out).get("cpu_cores")
    return cores if isinstance(cores, dict) else None


def _drift_section(out: Path) -> list[str]:
    """One line on how the engines' calibrated steps moved between the calibration before
    and the one after the runs (``drift`` of :func:`pooled_calibration`); none without it."""
    drift = [d for d in _saved_calibration(out).get("drift") or [] if _is_number(d)]
    if not drift:
        return []
    return [f"Calibrated steps after the runs / before, per shape ({len(drift)} shapes): median "
            f"{statistics.median(drift):.2f}x, range {min(drift):.2f}-{max(drift):.2f}x; the simulator's "
            "calibration profile is fitted to both.", ""]


def _cpu_section(per_seed: list[tuple[int, list[dict]]], order: list[str],
                 calibration: dict | None = None, calibrated: str = "before the runs") -> list[str]:
    """Mean cores each role of the job used during each run (runs saved before ``cpu_cores``
    was recorded: left out; nothing recorded: no section), and during the calibration on
    idle engines when its ``cpu_cores`` are given (``calibrated``: when it was timed)."""
    per_label: dict[str, list[dict]] = {}
    for _, results in per_seed:
        for r in results:
            if r.get("cpu_cores"):
                per_label.setdefault(r["label"], []).append(r["cpu_cores"])
    if not per_label:
        return []
    lines = ["### CPU used during each run (cores, mean over seeds; the machine's engine workers are bound one "
             "per core, everything else shares those cores)", "",
             "| Router | " + " | ".join(name for _, name in CPU_ROLES) + " |",
             "|---|" + "---|" * len(CPU_ROLES)]
    for label in order:
        runs = per_label.get(label)
        if runs:
            lines.append(f"| {label} | " + " | ".join(
                f"{statistics.fmean(c.get(role, 0.0) for c in runs):.2f}" for role, _ in CPU_ROLES) + " |")
    if calibration:
        lines.append(f"| calibration (idle engines, {calibrated}) | " + " | ".join(
            f"{calibration.get(role, 0.0):.2f}" for role, _ in CPU_ROLES) + " |")
    return lines + [""]


def _best_sweep(results: list[dict], key: str) -> str:
    """Label of the sweep point with the best samples/min in window ``key`` (a seed's baseline)."""
    sweep = [r for r in results if r["sweep"]] or results[:1]
    return max(sweep, key=lambda r: r[key]["samples_per_min"])["label"]


def report(results: list[dict], out: Path, minutes: float, warmup_minutes: float = 0.0) -> str:
    """Print one seed's tables per window (real figures vs that window's best sweep point;
    simulator vs real) and save them (``table.md``) and the plots."""
    console = Console(width=160)
    classes = list(MIXTURE)
    md_all: list[str] = []
    for real_key, sims, title in windows(results, warmup_minutes):
        base_label = _best_sweep(results, real_key)
        base = next(r for r in results if r["label"] == base_label)[real_key]
        t = Table(title=f"Routers on 2 real vLLM CPU engines, {minutes:g} min each, {title} "
                        f"(baseline: {base_label}, best of the sweep)")
        cols = ["router", "samples/min", "x base", "RPM", "x base", "prefix hit", "prefill tok/s", "x base",
                "decode tok/s", "x base", "mixture a/v/h %", "TV", "p50/p95 s a · v · h", "preempt", "errors"]
        for c in cols:
            t.add_column(c, justify="left" if c == "router" else "right")
        md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in results:
            s = r[real_key]
            mix = "/".join(f"{s['consumed_mixture'].get(b, 0) * 100:.0f}" for b in classes)
            comp = " · ".join(f"{s['completion_s'][b]['p50']:.0f}/{s['completion_s'][b]['p95']:.0f}"
                              if b in s["completion_s"] else "-" for b in classes)
            row = [r["label"], f"{s['samples_per_min']:.1f}", _rel(s["samples_per_min"], base["samples_per_min"]),
                   f"{s['requests_per_min']:.0f}", _rel(s["requests_per_min"], base["requests_per_min"]),
                   f"{s['prefix_hit_rate']:.1%}", f"{s['prefill_tok_s']:.0f}",
                   _rel(s["prefill_tok_s"], base["prefill_tok_s"]), f"{s['decode_tok_s']:.0f}",
                   _rel(s["decode_tok_s"], base["decode_tok_s"]), mix, f"{s['tv_distance']:.3f}", comp,
                   str(s["preemptions"]), str(len(r["errors"]))]
            t.add_row(*row)
            md.append("| " + " | ".join(row) + " |")
        console.print(t)

        md_all += [f"## Real engines, {title}", "", *md, ""]
        for sim_key, what in sims:
            md_all += [f"## Simulator vs real, {title}, {what}", "", *_sim_vs_real(results, real_key, sim_key,
                                                                                    f"{title}, {what}", console), ""]
    text = "\n".join(md_all)
    (out / "table.md").write_text(text)
    _plots(results, _best_sweep(results, "real"), out)
    return text


def _sim_vs_real(results: list[dict], real_key: str, sim_key: str, title: str, console: Console) -> list[str]:
    """Print the simulator-vs-real table of one window and profile; return it as markdown rows."""
    t2 = Table(title=f"Simulator vs the real engines, {title}: error = (sim - real) / real")
    cols2 = ["router"] + [f"{f} real | sim | err" for f in FIGURES]
    for c in cols2:
        t2.add_column(c, justify="left" if c == "router" else "right")
    md_cols2 = ["router"] + [f"{f} {part}" for f in FIGURES for part in ("real", "sim", "err")]
    md2 = ["| " + " | ".join(md_cols2) + " |", "|" + "---|" * len(md_cols2)]
    for r in results:
        if not r.get(sim_key):
            continue
        cells = []
        for f in FIGURES:
            real, sim = r[real_key][f], r[sim_key][f]
            e = _err(sim, real)
            fmt = "{:.1%}" if f == "prefix_hit_rate" else "{:.1f}"
            cells.append((fmt.format(real), fmt.format(sim), f"{e:+.0%}" if e is not None else "n/a"))
        t2.add_row(r["label"], *(" | ".join(c) for c in cells))
        md2.append("| " + " | ".join([r["label"], *(x for c in cells for x in c)]) + " |")
    console.print(t2)
    return md2


def _plots(results: list[dict], base_label: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in results]
    base = next(r for r in results if r["label"] == base_label)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    x = range(len(labels))
    for ax, f, title in ((axes[0], "samples_per_min", "complete samples/min"),
                         (axes[1], "prefix_hit_rate", "prefix hit rate"),
                         (axes[2], "decode_tok_s", "decode tok/s")):
        ax.bar([i - 0.2 for i in x], [r["real"][f] for r in results], width=0.4, label="real")
        ax.bar([i + 0.2 for i in x], [r["sim"][f] for r in results], width=0.4, label="simulator")
        if f == "samples_per_min":
            ax.axhline(base["real"][f], color="k", lw=0.8, ls="--", label="baseline (real)")
        ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "router_real.png", dpi=120)
    plt.close(fig)

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 4.5))
    for r in results:
        tl = r["timeline"]
        if not tl:
            continue
        ts = [p["t_s"] for p in tl]
        ax1.plot(ts, [sum(p["kv_usage"]) / len(p["kv_usage"]) for p in tl], label=r["label"])
        ax2.plot(ts, [sum(p["completed"].values()) for p in tl], label=r["label"])
        if any(p.get("held") is not None for p in tl):
            ax3.plot(ts, [p.get("held") or 0 for p in tl], label=r["label"])
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("KV cache usage (mean over engines)")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("units completed")
    ax3.set_xlabel("time (s)")
    ax3.set_ylabel("requests held by our router")
    ax1.legend(fontsize=7)
    if ax3.get_lines():
        ax3.legend(fontsize=7)
    else:  # only the vLLM Router ran: nothing of ours held a request
        ax3.text(0.5, 0.5, "no run of our router", ha="center", va="center", transform=ax3.transAxes)
    fig.tight_layout()
    fig.savefig(out / "kv_usage.png", dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def _parse_ints(text: str, what: str, minimum: int = 1, example: str = "8,16,32") -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise usage_error(f"{what}: expected comma-separated integers like {example}, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise usage_error(f"{what}: expected integers >= {minimum} like {example}, got {text!r}")
    return values


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in --help."""


def _check_args(args: argparse.Namespace) -> None:
    """Refuse values no run can use, naming the option (SystemExit, before any engine starts)."""
    positive = {"--minutes": args.minutes, "--ceiling": args.ceiling, "--kv-tokens": args.kv_tokens,
                "--max-model-len": args.max_model_len, "--max-num-batched-tokens": args.max_num_batched_tokens,
                "--units": args.units}
    for name, value in positive.items():
        if not math.isfinite(value) or value <= 0:
            raise usage_error(f"{name} must be a positive number, got {value}")
    if not (math.isfinite(args.warmup_minutes) and 0 <= args.warmup_minutes < args.minutes):
        raise usage_error(f"--warmup-minutes must be >= 0 and below --minutes {args.minutes:g}, "
                          f"got {args.warmup_minutes:g}"
                          + (" (its default); give --warmup-minutes 0 or a longer --minutes"
                             if args.warmup_minutes == WARMUP_MINUTES_DEFAULT else ""))
    if not 0 <= args.tool_gap_share < 1:
        raise usage_error(f"--tool-gap-share must be in [0, 1), got {args.tool_gap_share}")
    if args.kv_tokens < args.max_model_len:
        raise usage_error(f"--kv-tokens {args.kv_tokens} is below --max-model-len {args.max_model_len}: vLLM "
                         "refuses to start when one request cannot fit in its KV cache; raise --kv-tokens")
    bad = [a for a in args.engine_arg if not a.startswith("-")]
    if bad:
        raise usage_error(f"--engine-arg {bad[0]!r}: give a `vllm serve` option with its dashes, joined by '=', "
                          "e.g. --engine-arg=--enable-scale-out")
    if args.max_model_len < 512:
        raise usage_error(f"--max-model-len must be >= 512 for the generated workload, got {args.max_model_len}")


def typed_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The ``dest`` of every option given in ``argv`` (its default value typed included), by
    parsing ``argv`` again with every default suppressed. ``parser`` is left as it was."""
    saved = {id(a): a.default for a in parser._actions}
    try:
        for a in parser._actions:
            a.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(argv)))
    finally:
        for a in parser._actions:
            a.default = saved[id(a)]


def main() -> None:
    parser = CommandParser(prog="python -m bench.router_real", description=__doc__, formatter_class=_Formatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="wall time per router run")
    parser.add_argument("--warmup-minutes", type=float, default=WARMUP_MINUTES_DEFAULT,
                        help="also measure each run after this much wall time (the warm window; 0: whole run only)")
    parser.add_argument("--sweep", default="16,32,64,96", help="vllm-router ceilings (units in flight) to sweep")
    parser.add_argument("--ceiling", type=int, default=96, help="the common permissive ceiling")
    parser.add_argument("--baseline-at-ceiling", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the real vllm-router at --ceiling when --sweep does not hold it; "
                             "--no-baseline-at-ceiling for a run to --combine with one that already did (the "
                             "same label twice cannot be combined)")
    parser.add_argument("--policies", default="misa_t,kv_horizon",
                        help="our policies to run at the permissive ceiling")
    parser.add_argument("--policy-param", action="append", default=[], metavar="POLICY.KEY=VALUE",
                        help="an option of one of --policies, repeatable (e.g. kv_horizon.target_usage=1.25); "
                             "the run's label names it")
    parser.add_argument("--kv-tokens", type=int, default=8192, help="KV cache per engine, tokens")
    parser.add_argument("--max-model-len", type=int, default=2048, help="engine context limit, tokens")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="engine per-step token budget")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="an extra `vllm serve` option for both engines, repeatable, joined by '=' "
                             "(--engine-arg=--enable-scale-out: vLLM then answers the vLLM Router's "
                             "/v1/completions/render, which it refuses by default, and the router routes by prefix)")
    parser.add_argument("--router-log-level", default="info", choices=VLLM_ROUTER_LOG_LEVELS,
                        help="vllm-router's --log-level; debug writes each placement (selected worker, match "
                             "rate) into the run's router.log")
    parser.add_argument("--tool-gap-share", type=float, default=0.25, help="tool time / agent session time")
    parser.add_argument("--units", type=int, default=3000, help="units in the generated trace (more than a run uses)")
    parser.add_argument("--seeds", default="0,1,2", help="trace generator seeds, comma-separated: each seed replays "
                        "its own trace through every router (in seed-<n>/), engines started and calibrated once")
    parser.add_argument("--calibrate-after", action=argparse.BooleanOptionalAction, default=True,
                        help="time the engines' steps again after the runs and fit the simulator's profile to "
                             "both calibrations (about 7 min; one timing of idle engines drifted by up to 1.5x "
                             "per shape between two sessions)")
    parser.add_argument("--request-overhead", action=argparse.BooleanOptionalAction, default=True,
                        help="the simulator's replay adds each request's time outside the engines (router, HTTP "
                             "hops, API servers) as the real vLLM Router's run measured it (client time less vLLM's "
                             "e2e_request_latency; behind our router it is not separable from its holds and none is "
                             "added), the API server's part inside that latency less the wait for a running step "
                             "(every run), and the replay client's own time between a response and the session's "
                             "next request; --no-request-overhead replays without any")
    parser.add_argument("--out", type=Path, default=None,
                        help="run folder (default runs/bench/router-real-<time>; with --combine "
                             "runs/bench/router-real-combined-<time>)")
    parser.add_argument("--resimulate", type=Path, default=None, metavar="RUN_DIR",
                        help="start no engine: redo only the simulator replay of a finished run folder with the "
                             "current simulator (its real figures, trace and measured steps are kept)")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                        help="start no engine: set the routers of finished runs (same seeds, traces and options; "
                             "e.g. sweep points run later) side by side in one run folder (--out) with its "
                             "summary over seeds")
    args = parser.parse_args()
    if args.combine is not None and args.resimulate is not None:
        raise usage_error("--combine and --resimulate: give one of them (resimulate each run, then combine)")
    if args.combine is not None or args.resimulate is not None:
        mode = "--combine" if args.combine is not None else "--resimulate"
        kept = {"combine", "resimulate"} | ({"out"} if mode == "--combine" else {"request_overhead"})
        typed = typed_options(parser, sys.argv[1:])
        ignored = [f"--{'no-' if value is False else ''}{dest.replace('_', '-')}" for dest, value in vars(args).items()
                   if dest not in kept and dest in typed]
        if ignored:  # a finished run keeps the options it ran with
            raise usage_error(f"{mode} reads finished runs, which keep the options they ran with; "
                              f"leave out {', '.join(ignored)}")
    if args.combine is not None:
        out = args.out or REPO_ROOT / "runs" / "bench" / f"router-real-combined-{datetime.now():%Y%m%d-%H%M%S}"
        per_seed, minutes, warmup = combine_runs(args.combine, out)
        for seed, results in per_seed:
            report(results, out / f"seed-{seed}", minutes, warmup)
        summarize_seeds(per_seed, out, minutes, warmup)
        print(f"results: {out}")
        return
    if args.resimulate is not None:
        if not args.resimulate.is_dir():
            raise usage_error(f"--resimulate {args.resimulate}: no such folder; give the folder of a finished "
                              "python -m bench.router_real run (runs/bench/router-real-<time>)")
        seed_dirs = seed_folders(args.resimulate)
        for d in seed_dirs or [args.resimulate]:  # every folder checked before any is rewritten
            check_run_folder(d)
        per_seed, minutes, warmup = [], 0.0, 0.0
        for d in seed_dirs or [args.resimulate]:
            results, minutes, warmup = resimulate(d, args.request_overhead)
            report(results, d, minutes, warmup)
            per_seed.append((int(d.name.removeprefix("seed-")) if seed_dirs else 0, results))
        if seed_dirs:
            summarize_seeds(per_seed, args.resimulate, minutes, warmup)
        print(f"results: {args.resimulate}")
        return
    _check_args(args)
    seeds = _parse_ints(args.seeds, "--seeds", minimum=0, example="0,1,2")
    if len(set(seeds)) != len(seeds):
        raise usage_error(f"--seeds: each seed once, got {args.seeds!r}")
    sweep = _parse_ints(args.sweep, "--sweep")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name, values in (("--sweep", sweep), ("--policies", policies)):
        if len(set(values)) != len(values):  # two runs of one label would share a folder
            raise usage_error(f"{name}: each value once, got {getattr(args, name[2:])!r}")
    # Only the live router's policies: the simulator's own are registered in this process
    # (router.sim) but not in the router it starts.
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        sim_only = sorted(set(registered_policy_names()) - set(POLICY_NAMES))
        raise usage_error(f"--policies: unknown {unknown}; valid: {', '.join(POLICY_NAMES)} "
                          f"({', '.join(sim_only)} run in the simulator only)")
    policy_params = parse_policy_params(args.policy_param, policies)
    try:
        runs = plan_runs(sweep, args.ceiling, policies, policy_params, args.baseline_at_ceiling)
        for r in runs:
            r.sim_policy()  # unknown policy names and bad params fail here, before engines start
    except (ValueError, KeyError, TypeError) as e:
        raise usage_error(f"{'--policy-param / --policies' if args.policy_param else '--policies'}: {e}") from None
    out = args.out or REPO_ROOT / "runs" / "bench" / f"router-real-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()
    try:
        done = run_benchmark(args, runs, seeds, out)
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, or SIGTERM via stop_on_sigterm
        print(f"interrupted; every process started was stopped; partial results in {out}", file=sys.stderr)
        raise SystemExit(e.code if isinstance(e, SystemExit) else 130) from None
    except (EngineError, ProcessStartError, ReplayError, SimError) as e:
        print(f"bench.router_real failed: {e}\nlogs: {out}", file=sys.stderr)
        raise SystemExit(1) from None
    for seed, results in done:
        report(results, out / f"seed-{seed}", args.minutes, args.warmup_minutes)
    summarize_seeds(done, out, args.minutes, args.warmup_minutes)
    print(f"results: {out}")


def engine_config(args: argparse.Namespace, kv_bytes_per_token: float) -> DictConfig:
    """The engines' config: ``recipes/engine/cpu.yaml`` with a KV cache of ``--kv-tokens``
    tokens (``kv_bytes_per_token`` bytes each), ``--max-num-batched-tokens``, and the
    ``--engine-arg`` values appended to its ``extra_args``."""
    ecfg = OmegaConf.load(RECIPES / "engine" / "cpu.yaml")
    ecfg.kv_cache_space_gib = args.kv_tokens * kv_bytes_per_token / 2**30
    ecfg.max_num_batched_tokens = args.max_num_batched_tokens
    ecfg.extra_args = [*ecfg.extra_args, *args.engine_arg]
    return ecfg


def run_benchmark(args: argparse.Namespace, runs: list[RouterRun], seeds: list[int],
                  out: Path) -> list[tuple[int, list[dict]]]:
    """Engines up, calibrate once, then per seed (its own trace, in ``out/seed-<n>/``) replay
    through every router; the simulator half runs after the engines stopped.

    Returns:
        ``[(seed, results)]``.
    """
    from transformers import AutoTokenizer

    model_cfg = OmegaConf.load(RECIPES / "model" / "smollm2-135m.yaml")
    model_path = prepare_model(model_cfg)
    served = str(model_cfg.name)
    text = WordText(AutoTokenizer.from_pretrained(str(model_path)))
    per_token = kv_bytes_per_token(model_path, 4 if model_cfg.dtype == "float32" else 2)
    ecfg = engine_config(args, per_token)
    traces = {}
    for seed in seeds:
        (out / f"seed-{seed}").mkdir(exist_ok=True)
        traces[seed] = generate_trace(WorkloadConfig(
            units=args.units, pool_mixture=dict(MIXTURE), context_limit_tokens=args.max_model_len - 64,
            classes=cpu_classes(args.max_model_len - 64, args.tool_gap_share), seed=seed))
        write_trace(traces[seed], out / f"seed-{seed}" / "trace.jsonl")
    per_seed: list[tuple[int, list[dict]]] = []
    print(f"starting 2 vLLM CPU engines ({args.kv_tokens} KV tokens each); logs in {out}", file=sys.stderr)
    with EnginePool.start(ecfg, str(model_path), served, args.max_model_len, str(model_cfg.dtype), out) as pool:
        urls = pool.urls
        info = asyncio.run(_engine_info(urls))
        print(f"engines: {info}; calibrating the step-cost profile ...", file=sys.stderr)
        before = _calibrate(urls, served, text, args, info, int(ecfg.max_num_seqs))
        calibration = pooled_calibration(before, None, info)
        (out / "calibration.json").write_text(json.dumps(calibration, indent=1))
        for seed in seeds:
            sdir = out / f"seed-{seed}"
            results: list[dict] = []
            per_seed.append((seed, results))
            for run in runs:
                asyncio.run(_engines_idle(urls, 300))
                asyncio.run(_reset_prefix_caches(urls))
                run_dir = sdir / run_folder_name(run.label)
                run_dir.mkdir(exist_ok=True)
                router_cfg = run.router_cfg()
                if run.impl == "vllm":
                    router_cfg["log_level"] = args.router_log_level
                router = start_router(router_cfg, urls, [e for e in pool.kv_events_endpoints if e],
                                      str(model_path), run_dir)
                # A bar on a terminal; into a log one plain line per finished run (no redraws).
                bar = tqdm(total=int(args.minutes * 60), desc=f"seed {seed} {run.label}", unit="s", file=sys.stderr,
                           disable=not sys.stderr.isatty())
                try:
                    def progress(elapsed: float, done: int) -> None:
                        bar.n = min(int(elapsed), bar.total)
                        bar.set_postfix(units=done, refresh=False)
                        bar.refresh()

                    meter = CpuMeter(os.getpid(), engine_job_role_by_engine)
                    res = replay(router.url, served, traces[seed], MIXTURE, run.ceiling, args.minutes * 60, text,
                                 urls, progress=progress, router_state=run.impl == "ours",
                                 warmup_s=args.warmup_minutes * 60,
                                 router_metrics_url=router.metrics_url if run.impl == "vllm" else None)
                    cpu_cores, cpu_by_engine = engine_cpu(meter.cores(), urls)  # before the router stops
                    if run.impl == "vllm" and res.router_decisions is None:
                        print(f"seed {seed} {run.label}: its /metrics never answered; "
                              "the simulator assumes every prompt was tokenized", file=sys.stderr)
                finally:
                    bar.close()
                    router.stop()
                if not sys.stderr.isatty():
                    print(f"seed {seed} {run.label}: {res.summary['samples_per_min']:.2f} samples/min, prefix hit "
                          f"{res.summary['prefix_hit_rate']:.1%}, {res.summary['preemptions']} preemptions",
                          file=sys.stderr, flush=True)
                write_trace(res.recorded_trace(), run_dir / "recorded_trace.jsonl")
                (run_dir / "errors.txt").write_text("\n".join(res.errors))
                results.append({"label": run.label, "impl": run.impl, "policy": run.policy, "ceiling": run.ceiling,
                                "sweep": run.sweep, "params": run.params, "real": res.summary, "real_after_warmup": res.after_warmup,
                                "router_decisions": res.router_decisions, "missing_tokens_s": res.missing_tokens_s,
                                "errors": res.errors, "cpu_cores": cpu_cores, "cpu_cores_by_engine": cpu_by_engine,
                                "request_times": request_times(res.requests, res.timeline),
                                "class_requests": class_requests(res.requests, res.summary, res.after_warmup),
                                "regime": regime(res.timeline, len(urls), tuple(res.summary["window_s"])),
                                "timeline": res.timeline})
                (sdir / "results.json").write_text(json.dumps({"calibration": calibration, "runs": results},
                                                              indent=1))
        if args.calibrate_after:
            print("calibrating again, after the runs ...", file=sys.stderr)
            asyncio.run(_engines_idle(urls, 300))
            calibration = pooled_calibration(before, _calibrate(urls, served, text, args, info,
                                                                int(ecfg.max_num_seqs)), info)
            (out / "calibration.json").write_text(json.dumps(calibration, indent=1))
    done = []
    for seed, results in per_seed:
        simulate(results, runs, traces[seed], calibration, len(urls), args.max_num_batched_tokens,
                 int(ecfg.max_num_seqs), args.max_model_len, args.minutes, seed, args.warmup_minutes,
                 args.request_overhead)
        seed_args = {k: str(v) for k, v in vars(args).items() if k != "seeds"} | {"seed": str(seed)}
        _save(out / f"seed-{seed}", results, calibration, seed_args)
        done.append((seed, results))
    return done


def _calibrate(urls: list[str], served: str, text, args: argparse.Namespace, info: dict,
               max_num_seqs: int) -> dict:
    """One calibration of the engines (:func:`router.sim.calibrate.measure_step_samples`):
    ``{"samples": [StepSample dicts], "cpu_cores": the job's CPU by role meanwhile,
    "cpu_cores_by_engine": each engine's (:func:`engine_cpu`)}``.

    Raises:
        EngineError: an engine failed or stopped while it was timed.
    """
    meter = CpuMeter(os.getpid(), engine_job_role_by_engine)
    try:
        samples = measure_step_samples(urls, served, text, prompt_tokens=min(1024, args.max_num_batched_tokens),
                                       kv_blocks=info["num_blocks"], block_size=info["block_size"],
                                       max_num_seqs=max_num_seqs)
    except RuntimeError as e:
        raise EngineError(str(e)) from None
    by_role, by_engine = engine_cpu(meter.cores(), urls)
    return {"samples": [dataclasses.asdict(s) for s in samples], "cpu_cores": by_role, "cpu_cores_by_engine": by_engine}


def engine_cpu(cores: dict[str, float], urls: list[str]) -> tuple[dict[str, float], list[dict[str, float]] | None]:
    """A :class:`common.cpu_time.CpuMeter` reading by :func:`common.cpu_time.engine_job_role_by_engine`
    as ``(cores by role summed over engines, [cores by role of each engine, in urls' order])``;
    the second is None unless every engine's processes were found (by the port of its URL)."""
    by_role, by_engine = split_engine_roles(cores)
    ports = [int(u.rstrip("/").rsplit(":", 1)[1]) for u in urls]
    per = [by_engine.get(port) for port in ports]
    return by_role, per if all(per) else None


def pooled_calibration(before: dict, after: dict | None, engines: dict) -> dict:
    """The calibration the simulator uses: the engines' samples timed before the runs and,
    with ``--calibrate-after``, after them, pooled into one fit (``samples``, ``profile``);
    with both, each kept (``samples_before_runs``, ``samples_after_runs``), the CPU by role as
    the mean of the two, and ``drift``: per measured shape, the step after the runs over the
    one before (the same shapes in the same order). Two calibrations of the same code on the same engines,
    a session apart, once differed by up to 1.5x per shape (a 1-sequence decode step 23.6 and
    36.5 ms) and moved the simulated samples/min by 15-25%: one timing of idle engines is
    a sample, not the engines' speed.

    Args:
        before, after: :func:`_calibrate` results (``after`` None: calibrated once).
        engines: the engines' ``num_blocks`` and ``block_size``.
    """
    if after is None:
        return {"samples": before["samples"], "engines": engines, "cpu_cores": before["cpu_cores"],
                "cpu_cores_by_engine": before.get("cpu_cores_by_engine"),
                "profile": dataclasses.asdict(fit_linear_step_cost([StepSample.from_saved(d) for d in before["samples"]]))}
    pooled = before["samples"] + after["samples"]
    roles = set(before.get("cpu_cores") or {}) | set(after.get("cpu_cores") or {})
    cores = {r: 0.5 * ((before.get("cpu_cores") or {}).get(r, 0.0) + (after.get("cpu_cores") or {}).get(r, 0.0))
             for r in sorted(roles)}
    drift = [a["step_time_s"] / b["step_time_s"] for b, a in zip(before["samples"], after["samples"])
             if b["step_time_s"] > 0 and (b["prefill_tokens"], b["decode_seqs"]) == (a["prefill_tokens"], a["decode_seqs"])]
    by_engine = None
    if before.get("cpu_cores_by_engine") and after.get("cpu_cores_by_engine"):
        by_engine = [{r: 0.5 * (b.get(r, 0.0) + a.get(r, 0.0)) for r in sorted(set(b) | set(a))}
                     for b, a in zip(before["cpu_cores_by_engine"], after["cpu_cores_by_engine"])]
    return {"samples": pooled, "samples_before_runs": before["samples"], "samples_after_runs": after["samples"],
            "engines": engines, "cpu_cores": cores, "cpu_cores_by_engine": by_engine, "drift": drift,
            "profile": dataclasses.asdict(fit_linear_step_cost([StepSample.from_saved(d) for d in pooled]))}


def simulate(results: list[dict], runs: list[RouterRun], trace, calibration: dict, instances: int,
             max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, minutes: float, seed: int,
             warmup_minutes: float = 0.0, request_overhead: bool = True) -> None:
    """Replay ``trace`` in the simulator for each run, with the engines' KV blocks and block
    size, each request's time outside the engines and the client's time between a response
    and the session's next request as the run measured them (``r["request_times"]``,
    :func:`router.replay.request_times`, through :func:`added_request_overhead_s`: ``overhead_s``
    and ``api_s`` less the step wait, ``between_s``; 0 with
    ``request_overhead=False`` or for runs recorded without the engines' latency counters),
    and three step-cost profiles:

    - ``r["sim"]`` (whole run) and ``r["sim_after_warmup"]`` (the window from the first unit
      completion after ``warmup_minutes``; a second replay, the window being one per run):
      the profile fitted to the steps measured on idle engines before the runs
      (``calibration``);
    - ``r["sim_insitu"]`` and ``r["sim_insitu_after_warmup"]``: the profile fitted to the mean
      steps of the *other* runs of this seed (:func:`step_samples_from_timeline` on their
      timelines; ``r["insitu_profile"]``), so a run's own throughput never enters its
      prediction. Left out when the other runs give fewer than 8 intervals (runs recorded
      before the engines' step counters were scraped).
    - ``r["sim_cpu"]`` and ``r["sim_cpu_after_warmup"]``: the calibration's profile with every
      step longer by the calibration's engine-worker CPU over the run's (``cpu_cores``;
      ``r["cpu_profile"]`` with its ``factor``). The engines' model threads are bound one per
      core and use it whenever nothing else of the job does (1.86 of the 2 cores during a
      calibration), so their CPU is the share of the machine left to the model; the engine
      schedulers, API servers, router and client took 2-3 times as much of it during a run as
      during the calibration. A measured input of the run, not its throughput. Where both the
      run and the calibration measured each engine's worker (``cpu_cores_by_engine``), each
      simulated engine gets its own factor instead: that of the real engine of the same rank
      by computed prompt tokens (:func:`engine_cpu_factors`; the simulator's ranks from its
      replay with the calibration profile, ``r["sim"]``; ``r["cpu_profile"]`` keeps the
      pooled ``factor`` and profile beside the ``engine_factors``, in the simulator's engine
      order, and ``engine_ranks`` that ``sim_cpu`` ran with). Left out for runs or
      calibrations recorded without ``cpu_cores``.
    """
    cost = fit_linear_step_cost([StepSample.from_saved(s) for s in calibration["samples"]])
    calibration["profile"] = dataclasses.asdict(cost)
    info = calibration["engines"]
    sim_cfg = EngineConfig(num_blocks=info["num_blocks"], block_size=info["block_size"],
                           max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    insitu = [step_samples_from_timeline(r.get("timeline") or [], info["num_blocks"], info["block_size"])
              for r in results]
    cal_worker = (calibration.get("cpu_cores") or {}).get("engine_worker")
    for i, (r, run) in enumerate(zip(tqdm(results, desc="simulator replay", file=sys.stderr,
                                          disable=not sys.stderr.isatty()), runs)):
        share = missing_tokens_share(r.get("router_decisions"))
        missing_at = r.get("missing_tokens_s")  # measured times; runs saved before: the share
        times = (r.get("request_times") or {}) if request_overhead else {}
        overhead_s = added_request_overhead_s(times, r.get("timeline") or [])
        between_s = max(0.0, times.get("between_s") or 0.0)
        r["sim_request_overhead_s"], r["sim_continuation_delay_s"] = overhead_s, between_s

        def replay_sim(profile, warmup_s: float = 0.0, keep_decisions: bool = False) -> dict:
            cfg = SimConfig(instances=instances, engine=sim_cfg, cost=profile, mixture=dict(MIXTURE),
                            ceiling=run.ceiling, context_limit_tokens=max_model_len, warmup_frac=0.0,
                            signals=SignalConfig(scrape_period_s=0.5, metrics_delay_s=0.1, kv_event_delay_s=0.05),
                            horizon_s=minutes * 60, seed=seed, warmup_s=warmup_s, request_overhead_s=overhead_s,
                            continuation_delay_s=between_s)
            policy = run.sim_policy(share, missing_at)
            summary = Simulation(cfg, trace, policy).run().summary
            if keep_decisions:
                r["sim_decisions"] = dict(getattr(policy, "decisions", {}))
            return summary

        r["sim"] = replay_sim(cost, keep_decisions=True)
        r["sim_after_warmup"] = replay_sim(cost, warmup_minutes * 60) if warmup_minutes > 0 else None
        others = [s for j, samples in enumerate(insitu) if j != i for s in samples]
        for key in ("insitu_profile", "sim_insitu", "sim_insitu_after_warmup"):
            r.pop(key, None)
        if len(others) >= 8:
            profile = fit_linear_step_cost(others)
            r["insitu_profile"] = dataclasses.asdict(profile)
            r["sim_insitu"] = replay_sim(profile)
            r["sim_insitu_after_warmup"] = replay_sim(profile, warmup_minutes * 60) if warmup_minutes > 0 else None
        for key in ("cpu_profile", "sim_cpu", "sim_cpu_after_warmup"):
            r.pop(key, None)
        run_worker = (r.get("cpu_cores") or {}).get("engine_worker")
        if cal_worker and run_worker:
            factor = cal_worker / run_worker
            scaled = cost.scaled(factor)
            r["cpu_profile"] = {"factor": factor, **dataclasses.asdict(scaled)}
            by_rank = engine_cpu_factors(calibration, r)
            if by_rank and len(by_rank) == instances:
                # each simulated engine gets the factor of the real engine of its rank by computed
                # prompt tokens, the simulated ranks taken from the replay with the calibration
                sim_rank = _prefill_order(r["sim"]["engines"])
                factors = [1.0] * instances
                for rank, engine in enumerate(sim_rank):
                    factors[engine] = by_rank[rank]
                r["cpu_profile"].update(engine_factors=factors, engine_ranks=sim_rank)
                scaled = [cost.scaled(f) for f in factors]
            r["sim_cpu"] = replay_sim(scaled)
            r["sim_cpu_after_warmup"] = replay_sim(scaled, warmup_minutes * 60) if warmup_minutes > 0 else None


def added_request_overhead_s(times: dict, timeline: list[dict]) -> float:
    """Seconds the simulator adds before each request (``request_overhead_s``) for a run with
    these :func:`router.replay.request_times` and timeline: the time outside the engines
    (``overhead_s``: the client's time less vLLM's e2e; None behind our router, whose holds
    make it inseparable: 0) plus the API server's part inside vLLM's e2e (``api_s``: input and
    output processing on a CPU the engines' model threads keep busy, 0.3-1.0 s a request in
    rr-long) less the wait for the engine's running step to end, which is also inside ``api_s``
    but which the simulated engine already counts as queue time
    (:func:`router.replay.step_wait_s`). The sum at least 0 (summed before the floor: the two
    parts come from different request sets, the client's and the engines' counts, and one can
    read below 0 where the other reads as much above it); 0 for an empty ``times``."""
    outside, api = times.get("overhead_s"), times.get("api_s")
    if api is None:
        return max(0.0, outside or 0.0)
    return max(0.0, (outside or 0.0) + api - (step_wait_s(timeline) or 0.0))


def _prefill_order(engines: list[dict]) -> list[int]:
    """Indices of ``engines`` (real or simulated per-engine figures: ``steps_per_s``,
    ``prefill_tokens_per_step``) from the one that computed the most prompt tokens down."""
    return sorted(range(len(engines)), key=lambda i: -engines[i]["prefill_tokens_per_step"] * engines[i]["steps_per_s"])


def engine_cpu_factors(calibration: dict, r: dict) -> list[float] | None:
    """Per real engine, from the one that computed the most prompt tokens in run ``r`` down: its
    model worker's CPU during the calibration over its CPU during the run (``cpu_cores_by_engine``
    of both, in the engines' order; :func:`real_engine_figures` ranks them). The engine that
    takes more prompts loses more of its core to its own scheduler and API server (rr-long,
    c=16: 0.76 cores against 0.85 for the other, 0.93 each during the calibration), so the
    simulator's engine of the same rank gets that engine's factor. None when either reading
    lacks an engine's worker or the run has no per-engine counters."""
    cal, run = calibration.get("cpu_cores_by_engine"), r.get("cpu_cores_by_engine")
    real = real_engine_figures(r.get("timeline") or [], _real_window(r))
    if not cal or not run or not real or not (len(cal) == len(run) == len(real)):
        return None
    cal_w = [(e or {}).get("engine_worker") for e in cal]
    run_w = [(e or {}).get("engine_worker") for e in run]
    if not all(cal_w) or not all(run_w):
        return None
    return [cal_w[i] / run_w[i] for i in _prefill_order(real)]


def _save(out: Path, results: list[dict], calibration: dict, args: dict) -> None:
    """Write ``results.json`` (``baseline``: the sweep's best samples/min over the whole run)."""
    (out / "results.json").write_text(json.dumps(
        {"calibration": calibration, "baseline": _best_sweep(results, "real"), "args": args, "runs": results},
        indent=1))


_WANT_RUN = "give the folder of a finished python -m bench.router_real run (results.json, trace.jsonl)"


def seed_folders(run_dir: Path) -> list[Path]:
    """The ``seed-<n>/`` folders of a run folder, by seed (not ``seed-1-old/``); [] when none."""
    return sorted((p for p in run_dir.glob("seed-*") if p.is_dir() and re.fullmatch(r"seed-\d+", p.name)),
                  key=lambda p: int(p.name.removeprefix("seed-")))


def check_run_folder(run_dir: Path, option: str = "--resimulate") -> None:
    """Raise SystemExit (a usage error naming ``option``) unless ``run_dir`` holds a seed's
    results.json and trace.jsonl, not written by ``--combine``, and each saved run's measured
    inputs of the simulator (``missing_tokens_s``: times in s >= 0; ``router_decisions``:
    counts; ``cpu_cores``, the calibration's too: cores >= 0 per role) and its timeline's
    samples (``t_s`` and ``completed`` counts, which the plots and the minute-by-minute table
    read) have their shape."""
    for name in ("results.json", "trace.jsonl"):
        if not (run_dir / name).is_file():
            raise usage_error(f"{option} {run_dir}: no {name} there; {_WANT_RUN}")
    try:
        saved = json.loads((run_dir / "results.json").read_text())
        runs, calibration, args = saved.get("runs"), saved.get("calibration"), saved.get("args")
    except (ValueError, AttributeError):
        return  # resimulate() names what is wrong with the file as a whole
    if isinstance(args, dict) and args.get("combined_from"):
        raise usage_error(f"{option} {run_dir}: a folder written by --combine (from {args['combined_from']}); "
                          f"give {option} those run folders instead")
    samples = calibration.get("samples") if isinstance(calibration, dict) else None
    for j, d in enumerate(samples if isinstance(samples, list) else []):
        problem = _sample_problem(d)
        if problem:
            raise usage_error(f"{option} {run_dir}: calibration.samples[{j}] {problem}, got {d!r}; {_WANT_RUN}")
    _check_cpu_cores(run_dir, "calibration", calibration, option)
    for i, r in enumerate(runs if isinstance(runs, list) else []):
        if not isinstance(r, dict):
            continue
        _check_cpu_cores(run_dir, f"runs[{i}]", r, option)
        times, decisions = r.get("missing_tokens_s"), r.get("router_decisions")
        if times is not None and not (isinstance(times, list) and all(
                _is_number(t) and math.isfinite(t) and t >= 0 for t in times)):
            raise usage_error(f"{option} {run_dir}: runs[{i}].missing_tokens_s must be a list of times "
                              f"(s, >= 0) or null, got {times!r}; {_WANT_RUN}")
        if decisions is not None and not (isinstance(decisions, dict) and all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in decisions.values())):
            raise usage_error(f"{option} {run_dir}: runs[{i}].router_decisions must map outcomes to counts "
                              f"or be null, got {decisions!r}; {_WANT_RUN}")
        timeline = r.get("timeline")
        for k, p in enumerate(timeline if isinstance(timeline, list) else [timeline] if timeline else []):
            completed = p.get("completed") if isinstance(p, dict) else None
            if not (isinstance(p, dict) and _is_number(p.get("t_s")) and isinstance(completed, dict)
                    and all(_is_number(n) for n in completed.values())):
                raise usage_error(f"{option} {run_dir}: runs[{i}].timeline[{k}] must be a sample with t_s (s) "
                                  f"and completed (class -> units), got {str(p)[:200]}; {_WANT_RUN}")


def _check_cpu_cores(run_dir: Path, where: str, owner, option: str) -> None:
    """Refuse (usage error) a saved ``cpu_cores`` that is not null or {role: cores >= 0}, and a
    ``cpu_cores_by_engine`` that is not null or a list of such maps."""
    def cores_map(cores) -> bool:
        return isinstance(cores, dict) and all(_is_number(c) and math.isfinite(c) and c >= 0 for c in cores.values())

    cores = owner.get("cpu_cores") if isinstance(owner, dict) else None
    if cores is not None and not cores_map(cores):
        raise usage_error(f"{option} {run_dir}: {where}.cpu_cores must map roles to cores (>= 0) or be "
                          f"null, got {cores!r}; {_WANT_RUN}")
    per = owner.get("cpu_cores_by_engine") if isinstance(owner, dict) else None
    if per is not None and not (isinstance(per, list) and all(cores_map(c) for c in per)):
        raise usage_error(f"{option} {run_dir}: {where}.cpu_cores_by_engine must be a list of maps from roles "
                          f"to cores (>= 0), one per engine, or null, got {per!r}; {_WANT_RUN}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _sample_problem(d) -> str | None:
    """What is wrong with one saved calibration sample (a :class:`StepSample` dict), or None."""
    fields = dataclasses.fields(StepSample)
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    optional = [f.name for f in fields if f.default is not dataclasses.MISSING]
    if not isinstance(d, dict):
        return "must be an object with " + ", ".join(required)
    if set(d) - {f.name for f in fields} or any(k not in d for k in required):
        return f"must have exactly {', '.join(required)} (and optionally {', '.join(optional)})"
    values = [d[k] for k in required] + [d[k] for k in optional if d.get(k) is not None]  # optional: may be null
    if not all(_is_number(v) and math.isfinite(v) and v >= 0 for v in values) or d["step_time_s"] <= 0:
        return "needs finite numbers >= 0 (step_time_s > 0)"
    return None


def resimulate(run_dir: Path, request_overhead: bool = True) -> tuple[list[dict], float, float]:
    """Redo the simulator half of one seed's finished benchmark in ``run_dir`` with the current
    simulator, profile fit and policy settings (its real figures, trace and measured steps
    are kept), e.g. after a change to the simulator; ``request_overhead``: as :func:`simulate`'s.

    Returns:
        (results, minutes per run, warm-up minutes; 0 for a run saved before the warm window).

    Raises:
        SystemExit: ``run_dir`` is not a finished ``bench.router_real`` seed folder.
    """
    check_run_folder(run_dir)
    try:
        saved = json.loads((run_dir / "results.json").read_text())
        args = saved["args"]
        results, calibration = saved["runs"], saved["calibration"]
        minutes, seed = float(args["minutes"]), int(args["seed"])
        warmup = float(args.get("warmup_minutes", 0.0))
        max_model_len, batched = int(args["max_model_len"]), int(args["max_num_batched_tokens"])
        trace = read_trace(run_dir / "trace.jsonl")
    except (ValueError, KeyError, TypeError, SimError) as e:
        what = f"missing {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise usage_error(f"--resimulate {run_dir}: not a finished run's results ({what}); {_WANT_RUN}") from None
    add_class_requests(results, run_dir)
    # the options each run had (runs saved before they were recorded: the replay's own)
    runs = [RouterRun(r["label"], r["impl"], r["policy"], int(r["ceiling"]), sweep=bool(r["sweep"]),
                      params=dict(r.get("params", REPLAY_PARAMS.get(r["policy"], {}) if r["impl"] == "ours" else {})))
            for r in results]
    ecfg = OmegaConf.load(RECIPES / "engine" / "cpu.yaml")  # the engines run() started
    for r in results:  # runs saved before the regime figures existed get them from their timeline
        if "regime" not in r:
            r["regime"] = regime(r.get("timeline") or [], int(ecfg.num_engines),
                                 _real_window(r))
    simulate(results, runs, trace, calibration, int(ecfg.num_engines), batched, int(ecfg.max_num_seqs), max_model_len,
             minutes, seed, warmup, request_overhead)
    _save(run_dir, results, calibration, args)
    return results, minutes, warmup


COMBINE_SAME_ARGS = ("minutes", "warmup_minutes", "kv_tokens", "max_model_len", "max_num_batched_tokens",
                     "engine_arg", "tool_gap_share", "units")
"""What the runs given to ``--combine`` must share (as each seed saved its ``args``): the
windows, the engines' shape and the workload; each seed's trace is also compared byte for byte."""

_RUN_KEYS = ("label", "impl", "policy", "ceiling", "sweep", "real", "regime")


def _combine_source(folder: Path) -> dict:
    """One seed folder of a run given to ``--combine``: its saved results, checked.

    Raises:
        SystemExit: not a finished run's seed folder (:func:`check_run_folder`), or its
            results lack what the summary reads.
    """
    check_run_folder(folder, "--combine")
    try:
        saved = json.loads((folder / "results.json").read_text())
        problems = [f"missing args.{k}" for k in COMBINE_SAME_ARGS if k not in saved["args"]]
        problems += [f"missing runs[{i}].{k}" for i, r in enumerate(saved["runs"]) for k in _RUN_KEYS if k not in r]
        if not problems:  # the numbers it windows and sorts by
            float(saved["args"]["minutes"]), float(saved["args"]["warmup_minutes"])
            problems += [f"runs[{i}].ceiling not a whole number" for i, r in enumerate(saved["runs"])
                         if not isinstance(r["ceiling"], int) or isinstance(r["ceiling"], bool)]
            problems += [f"runs[{i}].real without samples_per_min" for i, r in enumerate(saved["runs"])
                         if not _is_number((r["real"] or {}).get("samples_per_min"))]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        problems = [f"missing {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]]
    if problems:
        raise usage_error(f"--combine {folder}: not a finished run's results ({'; '.join(problems)}); {_WANT_RUN}")
    add_class_requests(saved["runs"], folder)
    return saved


def _same_option(a, b) -> bool:
    """Whether two saved option values are the same (``"10"`` and ``"10.0"`` are)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _combined_order(r: dict) -> tuple:
    """Sort key of a combined seed's runs: the vLLM Router's sweep by ceiling, then ours by
    policy and options (the label without its ceiling), each over its ceilings."""
    family = "" if r["impl"] == "vllm" else r["label"].rsplit(" c=", 1)[0]
    # numbers in the options compare as numbers: interference_blocks=64 before =256
    parts = re.split(r"(\d+(?:\.\d+)?)", family)
    key = tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts))
    return (r["impl"] != "vllm", key, int(r["ceiling"]))


def combine_runs(run_dirs: list[Path], out: Path) -> tuple[list[tuple[int, list[dict]]], float, float]:
    """Set the routers of finished runs side by side, seed by seed, as one run that ran them
    all would (e.g. sweep points run later, added to an earlier run), and write that run's
    folder ``out``: per seed ``results.json`` (each run keeps its figures, simulator replays
    included, and names its ``source`` folder), the trace, ``table.md`` and the plots; over
    seeds ``summary.md``/``summary.json``, which name the sources. Each source started and
    calibrated its own engines: the runs are compared on the same traces and options, not in
    one session of the engines (to redo the simulator's half, ``--resimulate`` each source
    and combine again). Nothing is started.

    Returns:
        (per seed: (seed, results), minutes per run, warm-up minutes).

    Raises:
        SystemExit: fewer than two folders or one twice, ``out`` one of them, inside one,
            a file or a folder with results --combine did not write, a folder not a finished run with
            ``seed-<n>/`` folders, runs of different seeds, traces or
            :data:`COMBINE_SAME_ARGS`, or one router label in two runs.
    """
    sources: list[tuple[Path, dict[int, Path]]] = []
    for d in run_dirs:  # each a run (said first: a folder that is not one) before the count and --out
        if not d.is_dir():
            raise usage_error(f"--combine {d}: no such folder; {_WANT_RUN}")
        by_seed = {int(s.name.removeprefix("seed-")): s for s in seed_folders(d)}
        if not by_seed:
            raise usage_error(f"--combine {d}: no seed-<n>/ folder; {_WANT_RUN}")
        sources.append((d, by_seed))
    if len(run_dirs) < 2:
        raise usage_error(f"--combine: give two run folders or more, got {len(run_dirs)}")
    where = [d.resolve() for d in run_dirs]
    if len(set(where)) != len(where):
        raise usage_error("--combine: a run folder is given twice")
    if any(out.resolve() == w or out.resolve().is_relative_to(w) for w in where):
        raise usage_error(f"--out {out}: one of the runs to combine or a folder inside one; give a new folder")
    if out.exists() and not out.is_dir():
        raise usage_error(f"--out {out}: a file, not a folder; give a new folder")
    # a run's results are never overwritten; an earlier combination's may be
    for d in out.glob("seed-*") if out.is_dir() else []:
        if not re.fullmatch(r"seed-\d+", d.name):
            continue
        if not d.is_dir():
            raise usage_error(f"--out {out}: {d.name} is a file, not a seed's folder; give a new folder")
        try:
            combined = bool(json.loads((d / "results.json").read_text())["args"]["combined_from"])
        except (OSError, ValueError, KeyError, TypeError):  # no results: only an empty folder is ours to remove
            combined = not (d / "results.json").exists() and not any(d.iterdir())
        if not combined:
            what = f"a run ({d.name}/results.json)" if (d / "results.json").exists() else f"{d.name}/"
            raise usage_error(f"--out {out}: holds {what} that --combine did not write; give a new folder")
    seeds = sorted(sources[0][1])
    for d, by_seed in sources[1:]:
        if sorted(by_seed) != seeds:
            raise usage_error(f"--combine: {run_dirs[0]} has seeds {seeds}, {d} has {sorted(by_seed)}; "
                              "combine runs of the same seeds")
    loaded = {(d, seed): _combine_source(by_seed[seed]) for d, by_seed in sources for seed in seeds}
    first_dir = run_dirs[0]
    per_seed: list[tuple[int, list[dict]]] = []
    for seed in seeds:
        first = loaded[(first_dir, seed)]
        digest = None  # the first run's trace
        runs: list[dict] = []
        label_from: dict[str, Path] = {}
        for d, by_seed in sources:
            saved = loaded[(d, seed)]
            differ = [f"{k} {first['args'][k]} vs {saved['args'][k]}" for k in COMBINE_SAME_ARGS
                      if not _same_option(first["args"][k], saved["args"][k])]
            if differ:
                raise usage_error(f"--combine: {first_dir} and {d} ran with different options ({'; '.join(differ)}); "
                                  "combine runs of one workload and engine shape")
            trace_digest = hashlib.sha256((by_seed[seed] / "trace.jsonl").read_bytes()).hexdigest()
            digest = digest or trace_digest
            if trace_digest != digest:
                raise usage_error(f"--combine: seed {seed}'s trace differs between {first_dir} and {d}; "
                                  "combine runs that replayed the same traces")
            for r in saved["runs"]:
                if r["label"] in label_from:
                    raise usage_error(f"--combine: {r['label']!r} ran in both {label_from[r['label']]} and {d}; "
                                      "combine runs of different routers or ceilings")
                label_from[r["label"]] = d
                runs.append({**r, "source": str(d)})
        runs.sort(key=_combined_order)
        per_seed.append((seed, runs))
    for d in seed_folders(out):  # an earlier combination's seeds that this one has not
        if int(d.name.removeprefix("seed-")) not in seeds:
            shutil.rmtree(d)
    for seed, runs in per_seed:  # written once every seed passed
        folder = out / f"seed-{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources[0][1][seed] / "trace.jsonl", folder / "trace.jsonl")
        args = {**loaded[(first_dir, seed)]["args"], "combined_from": [str(d) for d in run_dirs], "out": str(out)}
        (folder / "results.json").write_text(json.dumps(
            {"calibration": None, "calibrations": {str(d): loaded[(d, seed)]["calibration"] for d in run_dirs},
             "baseline": _best_sweep(runs, "real"), "args": args, "runs": runs}, indent=1))
    args = loaded[(first_dir, seeds[0])]["args"]
    return per_seed, float(args["minutes"]), float(args["warmup_minutes"])


async def _engine_info(urls: list[str]) -> dict:
    """KV block count and size of the engines (from vllm:cache_config_info)."""
    async with aiohttp.ClientSession() as http:
        ms = await scrape_engines(http, urls)
    if any(m.num_blocks is None or m.block_size is None for m in ms):
        raise ReplayError("an engine's /metrics lacks vllm:cache_config_info (block size and count)")
    return {"num_blocks": min(m.num_blocks for m in ms), "block_size": ms[0].block_size}


if __name__ == "__main__":
    main()
