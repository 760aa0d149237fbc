"""Synthetic mixed-rollout traces shaped like the MISA-T paper's (Tables 2 and 3).

Three workload classes (paper Table 1):

- ``agent``: multi-turn sessions. Turn k+1's prompt is turn k's prompt + output + a tool
  observation, so prefixes are long and growing; outputs are short; a tool gap separates
  turns. The session length (final context) is drawn so that the request-weighted prompt
  lengths match Table 2's p50/p95 (:func:`fit_agent_session_length`), and the observation
  size so that sessions average ``turns_mean`` requests (73,659 / 1,058 = 69.6 in Table 2).
- ``rlhf``: single-turn, medium prompt and output.
- ``rlvr``: single-turn, short prompt, long decode tail (clipped at the context limit).

Every class fans out into GRPO groups of ``group_size`` units sharing the group's prompt.
Lengths are log-normal, fitted to Table 2's p50 and p95 (:func:`lognormal_from_quantiles`),
and clipped to the 128K context limit. Tool gaps are log-normal with a mean that makes
the tool share of an agent session's time the Table 3 value, given a hint of how long
one agent turn's model request takes (the simulator reports the share it actually got).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from router.sim.errors import SimError
from router.sim.trace import TraceRecord, TraceSession

Z95 = 1.6448536269514722  # standard normal quantile at 0.95


@dataclass(frozen=True)
class LengthDist:
    """A log-normal length in tokens given by its p50 and p95, clipped to [lo, hi]."""

    p50: float
    p95: float
    lo: int = 1
    hi: int = 131072

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths (tokens)."""
        mu, sigma = lognormal_from_quantiles(self.p50, self.p95)
        return np.clip(np.rint(rng.lognormal(mu, sigma, n)), self.lo, self.hi).astype(np.int64)


def lognormal_from_quantiles(p50: float, p95: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal with median ``p50`` and 95th percentile ``p95``.

    Raises:
        SimError: unless 0 < p50 <= p95.
    """
    if not 0 < p50 <= p95:
        raise SimError(f"length quantiles need 0 < p50 <= p95, got p50={p50}, p95={p95}")
    return math.log(p50), (math.log(p95) - math.log(p50)) / Z95


@dataclass(frozen=True)
class ClassSpec:
    """One workload class of the generator.

    Attributes:
        prompt: single-turn prompt length; for ``agent`` the *task* part of turn 0's prompt.
        output: output length per request.
        group_size: GRPO fan-out G (units per prompt).
        turns: "single" or "multi" (agentic).
        input_p50, input_p95: multi-turn only: Table 2 quantiles of the request prompt lengths.
        turns_mean: multi-turn only: mean requests per session.
        class_prefix_tokens: system prompt shared by every session of the class.
        tool_gap_share: multi-turn only: tool time / (tool + model time), Table 3.
        turn_time_hint_s: multi-turn only: expected model time of one turn (sets the gap mean).
    """

    prompt: LengthDist
    output: LengthDist
    group_size: int = 1
    turns: str = "single"
    input_p50: float = 0.0
    input_p95: float = 0.0
    turns_mean: float = 1.0
    class_prefix_tokens: int = 0
    tool_gap_share: float = 0.0
    turn_time_hint_s: float = 10.0


def paper_classes(context_limit_tokens: int = 131072, tool_gap_share: float = 0.066,
                  turn_time_hint_s: float = 8.0, agent_system_prompt_tokens: int = 3000) -> dict[str, ClassSpec]:
    """The three classes with Table 2's quantiles (and Table 3's tool share, Step3.7 by default).

    ``agent_system_prompt_tokens``: the agent class prefix. The paper gives no system-prompt
    length; 3,000 tokens against the task prompt's p50 of 1,500 makes it 2/3 of a median
    first-turn agent prompt (4,500 tokens, well under Table 2's agent input p50).

    Raises:
        SimError: a negative system prompt length.
    """
    if agent_system_prompt_tokens < 0:
        raise SimError(f"agent_system_prompt_tokens must be >= 0, got {agent_system_prompt_tokens}")
    cap = context_limit_tokens
    return {
        "agent": ClassSpec(
            prompt=LengthDist(1500, 6000, 64, cap // 4), output=LengthDist(148, 1612, 1, 16384), group_size=4,
            turns="multi", input_p50=37757, input_p95=103209, turns_mean=73659 / 1058,
            class_prefix_tokens=agent_system_prompt_tokens, tool_gap_share=tool_gap_share, turn_time_hint_s=turn_time_hint_s,
        ),
        "rlhf": ClassSpec(prompt=LengthDist(60, 2564, 1, 2564), output=LengthDist(7344, 24447, 1, cap), group_size=4),
        "rlvr": ClassSpec(prompt=LengthDist(156, 1129, 1, 1277), output=LengthDist(47583, 130815, 1, cap), group_size=8),
    }


@dataclass(frozen=True)
class WorkloadConfig:
    """What to generate.

    Attributes:
        units: rollout units in the trace (2,466 = Table 2's sessions; ``scale`` multiplies it).
        pool_mixture: relative share of units per class in the generated pool (default:
            Table 2's sessions, 1,058 / 809 / 599, which gives about 75,000 requests).
        context_limit_tokens: prompt + output never exceeds it (128K).
        classes: per-class specs (default :func:`paper_classes`).
        seed: RNG seed.
    """

    units: int = 2466
    pool_mixture: dict[str, float] = field(default_factory=lambda: {"agent": 1058, "rlvr": 809, "rlhf": 599})
    context_limit_tokens: int = 131072
    classes: dict[str, ClassSpec] = field(default_factory=paper_classes)
    seed: int = 0


@lru_cache(maxsize=32)
def fit_agent_session_length(input_p50: float, input_p95: float, start_tokens: float,
                             context_limit_tokens: int, n: int = 8000) -> tuple[float, float]:
    """(mu, sigma) of the log-normal final context length of agent sessions.

    Model: a session's prompts grow about linearly from ``start_tokens`` to its final
    length L, and it makes turns in proportion to L - start, so request prompt lengths
    are a length-biased mixture of uniforms. The fit matches that mixture's p50 and p95
    to ``input_p50``/``input_p95`` (bisection on mu for p50, grid on sigma for p95),
    with a fixed RNG so the fit is deterministic.

    Raises:
        SimError: quantiles that no session-length distribution below the limit can give.
    """
    if not start_tokens < input_p50 < input_p95 < context_limit_tokens:
        raise SimError(
            f"agent input quantiles need start ({start_tokens:.0f}) < p50 ({input_p50}) < p95 ({input_p95}) "
            f"< context limit ({context_limit_tokens})"
        )
    rng = np.random.default_rng(12345)
    z = rng.standard_normal(n)
    u = rng.random(n)
    pick = rng.random(n)

    def quantiles(mu: float, sigma: float) -> tuple[float, float]:
        length = np.minimum(np.exp(mu + sigma * z), context_limit_tokens)
        weight = np.maximum(length - start_tokens, 1.0)
        cdf = np.cumsum(weight) / weight.sum()
        chosen = np.searchsorted(cdf, pick)
        prompts = start_tokens + u * (length[chosen] - start_tokens)
        q50, q95 = np.quantile(prompts, [0.5, 0.95])
        return float(q50), float(q95)

    best = None
    for sigma in np.linspace(0.1, 1.5, 15):
        lo, hi = math.log(start_tokens), math.log(context_limit_tokens) + 3
        for _ in range(24):
            mid = (lo + hi) / 2
            if quantiles(mid, sigma)[0] < input_p50:
                lo = mid
            else:
                hi = mid
        q50, q95 = quantiles(lo, sigma)
        err = abs(math.log(q95 / input_p95)) + abs(math.log(q50 / input_p50))
        if best is None or err < best[0]:
            best = (err, lo, float(sigma))
    return best[1], best[2]


def generate_trace(cfg: WorkloadConfig) -> list[TraceSession]:
    """Generate a mixed trace: ``cfg.units`` units split by ``pool_mixture``, in GRPO groups.

    Returns sessions (one per unit) in generation order; session ids are
    ``"<class>-g<group>-<k>"``. Raises SimError for an invalid config.
    """
    total = sum(cfg.pool_mixture.values())
    if total <= 0 or any(v < 0 for v in cfg.pool_mixture.values()):
        raise SimError(f"pool_mixture must be non-negative shares with a positive sum, got {cfg.pool_mixture}")
    missing = sorted(set(cfg.pool_mixture) - set(cfg.classes))
    if missing:
        raise SimError(f"pool_mixture names class(es) {missing} without a spec; known: {sorted(cfg.classes)}")
    rng = np.random.default_rng(cfg.seed)
    sessions: list[TraceSession] = []
    for cls, share in cfg.pool_mixture.items():
        spec = cfg.classes[cls]
        n_units = int(round(cfg.units * share / total))
        n_groups = max(1, -(-n_units // spec.group_size)) if n_units else 0
        if spec.turns == "multi":
            sessions += _agent_sessions(cls, spec, n_groups, cfg.context_limit_tokens, rng)
        else:
            sessions += _single_turn_sessions(cls, spec, n_groups, cfg.context_limit_tokens, rng)
    return sessions


def _single_turn_sessions(cls: str, spec: ClassSpec, n_groups: int, limit: int,
                          rng: np.random.Generator) -> list[TraceSession]:
    prompts = spec.prompt.sample(rng, n_groups)
    outputs = spec.output.sample(rng, n_groups * spec.group_size)
    out = []
    for g in range(n_groups):
        gid = f"{cls}-g{g}"
        p = int(prompts[g])
        for k in range(spec.group_size):
            sid = f"{gid}-{k}"
            o = int(min(outputs[g * spec.group_size + k], limit - p))
            rec = TraceRecord(sid, cls, 0, p, max(o, 1), unit_id=sid, group_id=gid, session_end=True,
                              group_prefix_tokens=p, class_prefix_tokens=min(spec.class_prefix_tokens, p))
            out.append(TraceSession(sid, cls, sid, gid, [rec]))
    return out


def _agent_sessions(cls: str, spec: ClassSpec, n_groups: int, limit: int,
                    rng: np.random.Generator) -> list[TraceSession]:
    start = spec.class_prefix_tokens + spec.prompt.p50
    mu_len, sigma_len = fit_agent_session_length(spec.input_p50, spec.input_p95, start, limit)
    # Mean growth per turn so that a session averages turns_mean requests:
    # E[L - start] / turns_mean = E[output] + E[observation].
    lengths = np.minimum(np.exp(mu_len + sigma_len * rng.standard_normal(20000)), limit)
    growth = float(np.mean(lengths - start)) / spec.turns_mean
    out_mean = float(np.mean(spec.output.sample(rng, 20000)))
    obs_sigma = 1.0
    obs_median = max(growth - out_mean, 1.0) / math.exp(obs_sigma**2 / 2)
    gap_sigma = 0.8
    gap_mean_s = spec.turn_time_hint_s * spec.tool_gap_share / max(1e-9, 1 - spec.tool_gap_share)
    gap_mu = math.log(gap_mean_s) - gap_sigma**2 / 2 if gap_mean_s > 0 else None
    out = []
    for g in range(n_groups):
        gid = f"{cls}-g{g}"
        task = int(spec.prompt.sample(rng, 1)[0])
        first = spec.class_prefix_tokens + task
        for k in range(spec.group_size):
            sid = f"{gid}-{k}"
            final = min(max(float(np.exp(mu_len + sigma_len * rng.standard_normal())), first + 1), limit)
            recs: list[TraceRecord] = []
            prompt = first
            # Draw a session's worth of lengths at once (numpy calls dominate otherwise).
            outs = spec.output.sample(rng, 4 * int(spec.turns_mean) + 64).tolist()
            obss = np.rint(rng.lognormal(math.log(obs_median), obs_sigma, len(outs))).astype(int).tolist()
            while True:
                t = len(recs) % len(outs)
                o, obs = int(min(outs[t], limit - prompt)), obss[t]
                nxt = prompt + o + obs
                last = nxt >= final or nxt + 1 >= limit
                gap = 0.0 if last or gap_mu is None else float(rng.lognormal(gap_mu, gap_sigma))
                recs.append(TraceRecord(sid, cls, len(recs), prompt, max(o, 1), unit_id=sid, group_id=gid,
                                        tool_gap_s=gap, session_end=last, group_prefix_tokens=first,
                                        class_prefix_tokens=spec.class_prefix_tokens))
                if last:
                    break
                prompt = nxt
            out.append(TraceSession(sid, cls, sid, gid, recs))
    return out


def request_quantiles(sessions: list[TraceSession], cls: str, qs=(0.5, 0.95, 0.99)) -> dict[str, list[float]]:
    """Prompt and output length quantiles of class ``cls``'s requests (for checks against Table 2)."""
    prompts = [r.prompt_tokens for s in sessions if s.workload_class == cls for r in s.requests]
    outputs = [r.output_tokens for s in sessions if s.workload_class == cls for r in s.requests]
    if not prompts:
        raise SimError(f"no requests of class {cls!r} in the trace")
    return {"input": np.quantile(prompts, qs).tolist(), "output": np.quantile(outputs, qs).tolist()}
