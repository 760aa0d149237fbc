"""``python -m router.sim``: run a simulator experiment (Hydra config ``recipes/sim.yaml``).

Writes ``runs/sim/<experiment>-<timestamp>/``: ``results.json`` (every run's metrics,
aggregates over seeds, the config), ``table.md`` (Table-5-like), plots, and
``runs.jsonl`` (one line per run, appended as each finishes). A bad option or trace
prints one line (no traceback) and exits with status 2 for an unknown key, option or
name (experiment, policy option), 1 for a bad value. Ctrl-C or SIGTERM stops
every worker, keeps the finished runs (``results.json`` marked ``"interrupted"``) and
exits with 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import router.sim  # noqa: F401  (registers aimd, tool_pause, progress_ttl, misa_t_oracle)
from common.config import (RECIPES_DIR, Rule, check_values, hydra_entry, is_seed, is_text, number, or_null,
                           register_user_error)
from common.options import build_options
from router.policies import canonical_policy_name, policy_config_class, registered_policy_names
from router.sim.errors import SimError, SimUnknownNameError, as_sim_errors
from router.sim.experiments import (
    P50_RATIO_LIMIT,
    ClusterSpec,
    RunSpec,
    aggregate,
    aggregate_phases,
    best_sweep_label,
    ceilings_headline,
    ceilings_markdown,
    ceilings_points,
    check_policy_params,
    composition_markdown,
    decode_ceiling_headline,
    decode_ceiling_markdown,
    dump_json,
    headline,
    per_class_markdown,
    phase_markdown,
    run_all,
    scale_counts,
    table5_markdown,
    with_params,
)
from router.sim.trace import read_trace
from router.sim.plots import plot_caps, plot_ceilings, plot_hit_rate, plot_mixture

register_user_error(SimError)  # a bad value: exit status 2, as an unknown key
register_user_error(SimUnknownNameError)  # an unknown name: exit status 2


def _shares(v) -> bool:
    return (isinstance(v, dict) and bool(v) and all(number(at_least=0)(x) for x in v.values())
            and sum(v.values()) > 0)


def _sweep(v) -> bool:
    return isinstance(v, dict) and all(isinstance(xs, list) and xs for xs in v.values())


# The values of recipes/sim.yaml, checked before any run starts (a bad one: exit status 2).
VALUE_RULES: dict[str, Rule] = {
    "scale": (number(above=0, at_most=4), "a fraction of the paper-sized system in (0, 4], e.g. 0.25"),
    "seeds": (lambda v: isinstance(v, list) and bool(v) and all(is_seed(x) for x in v),
              "a non-empty list of whole numbers >= 0, e.g. [0,1,2]"),
    "workers": (number(whole=True, at_least=1), "a whole number of processes >= 1"),
    "mixture": (_shares, "shares per workload class >= 0 with a positive sum, e.g. {agent: 48.6, rlvr: 33.1}"),
    "context_limit_tokens": (number(whole=True, at_least=1), "a whole number of tokens >= 1"),
    "shapes": (or_null(lambda v: isinstance(v, list) and bool(v) and all(is_text(x) for x in v)),
               "a non-empty list of model shapes, e.g. [step3.7-like,qwen3.6-like], or null"),
    "ceiling_scope": (lambda v: v in ("total", "per_instance"), "total or per_instance"),
    "prompt_text.chars_per_token": (number(above=0), "characters per token > 0, e.g. 4"),
    "agent_system_prompt_tokens": (number(whole=True, at_least=0), "a whole number of tokens >= 0"),
    "weight_sync_period_s": (or_null(number(above=0)), "seconds > 0, or null"),
    "raise_policy_errors": (lambda v: isinstance(v, bool), "true or false"),
    "trace": (or_null(is_text), "a JSONL trace path, or null"),
    "engine.block_size": (number(whole=True, at_least=1), "a whole number of tokens >= 1"),
    "engine.max_num_batched_tokens": (number(whole=True, at_least=1), "a whole number >= 1"),
    "engine.max_num_seqs": (number(whole=True, at_least=1), "a whole number >= 1"),
    "engine.max_decode_chunk_steps": (number(whole=True, at_least=1), "a whole number >= 1"),
    "signals.scrape_period_s": (number(above=0), "seconds > 0"),
    "signals.metrics_delay_s": (number(at_least=0), "seconds >= 0"),
    "signals.kv_event_delay_s": (number(at_least=0), "seconds >= 0"),
    "signals.metrics_loss": (number(at_least=0, below=1), "a loss probability in [0, 1)"),
    "signals.kv_event_loss": (number(at_least=0, below=1), "a loss probability in [0, 1)"),
    "policy_params": (lambda v: isinstance(v, dict) and all(isinstance(p, dict) for p in v.values()),
                      "a mapping policy -> {option: value}"),
    "run.policy": (is_text, "a policy name such as misa_t"),
    "run.ceiling": (or_null(number(whole=True, at_least=1)), "a whole number of units >= 1, or null"),
    "shift.at_frac": (number(above=0, below=1), "a fraction in (0, 1)"),
    "shift.rlvr_output_factor": (number(above=0), "a factor > 0"),
    "shift.agent_tool_gap_factor": (or_null(number(above=0)), "a factor > 0, or null (from agent_tool_gap_share_after)"),
    "shift.agent_tool_gap_share_after": (number(above=0, below=1), "a share in (0, 1), e.g. 0.5"),
    "shift.kv_event_loss": (number(at_least=0, below=1), "a loss probability in [0, 1)"),
    "shift.baseline": (is_text, "a policy name such as vllm_router"),
    "shift.policies": (lambda v: isinstance(v, list) and all(is_text(x) for x in v), "a list of policy names"),
    "shift.sweep_ceilings": (or_null(lambda v: isinstance(v, list) and bool(v) and all(number(whole=True, at_least=1)(x) for x in v)),
                             "a non-empty list of whole numbers >= 1, or null (sim.sweep_ceilings)"),
    "ceilings.baseline": (is_text, "a policy name such as vllm_router"),
    "ceilings.policies": (lambda v: isinstance(v, list) and bool(v) and all(is_text(x) for x in v),
                          "a non-empty list of policy names, e.g. [kv_horizon]"),
    "ceilings.factors": (lambda v: isinstance(v, list) and bool(v) and all(number(above=0, at_most=100)(x) for x in v),
                         "a non-empty list of factors in (0, 100] on the baseline's best ceiling, e.g. [1, 1.5, 2]"),
    "delay_factor": (number(above=0), "a factor > 0"),
    "sensitivity.policy": (is_text, "a policy name such as misa_t"),
    "sensitivity.params": (_sweep, "a mapping option -> non-empty list of values"),
    "out_dir": (is_text, "a folder"),
    "sim.tp": (number(whole=True, at_least=1), "a whole number of GPUs per replica >= 1"),
    "sim.instances": (number(whole=True, at_least=1), "a whole number of replicas >= 1"),
    "sim.gpu_memory_utilization": (number(above=0, at_most=1), "a fraction in (0, 1]"),
    "sim.tool_gap_share": (number(at_least=0, below=1), "a share in [0, 1)"),
    "sim.turn_time_hint_s": (number(above=0), "seconds > 0"),
    "sim.sweep_ceilings": (lambda v: isinstance(v, list) and bool(v) and all(number(whole=True, at_least=1)(x) for x in v),
                           "a non-empty list of whole numbers >= 1"),
    "sim.permissive_ceiling": (number(whole=True, at_least=1), "a whole number >= 1"),
}


def _policy_params_by_name(policy_params: dict) -> dict:
    """``policy_params`` keyed by canonical policy name (``misa-t`` -> ``misa_t``, as the
    runs look them up).

    Raises:
        SimUnknownNameError: a key that names no registered policy (its options would be
            ignored without a word).
    """
    out: dict = {}
    for name, params in policy_params.items():
        key = canonical_policy_name(name)
        if key not in registered_policy_names():
            raise SimUnknownNameError(f"policy_params.{name}: no such policy; valid names: "
                                      f"{', '.join(registered_policy_names())}")
        out[key] = {**out.get(key, {}), **(params or {})}
    return out


#: The keys that name a policy, each read by one experiment; every one is checked whatever the
#: experiment (as their other values are), so a misspelt name fails before any run starts.
POLICY_NAME_KEYS = ("run.policy", "shift.baseline", "shift.policies", "ceilings.baseline", "ceilings.policies",
                    "sensitivity.policy")


def _check_policy_names(cfg: DictConfig) -> None:
    """Refuse a policy name no policy is registered under, in any of :data:`POLICY_NAME_KEYS`.

    Raises:
        SimUnknownNameError: the registry's message (the name and the valid ones), after its key.
    """
    for key in POLICY_NAME_KEYS:
        value = OmegaConf.select(cfg, key)
        for name in (list(value) if OmegaConf.is_list(value) else [] if value is None else [value]):
            try:
                with as_sim_errors():
                    policy_config_class(str(name))  # canonicalised there; the message keeps the spelling
            except SimError as e:
                raise type(e)(f"{key}: {e}") from None


#: Table 5's static-ceiling routers, each swept over ``sim.sweep_ceilings``: label ->
#: (policy, options over ``policy_params[policy]``, what its table's title says of it).
TABLE5_BASELINES: dict[str, tuple[str, dict, str]] = {
    # The real vLLM Router's cache_aware with its prefix path working: the engines tokenize
    # for it (vLLM started with --enable-scale-out). The paper's baseline.
    "vllm_router": ("vllm_router", {}, ""),
    # The same router as `router=vllm` runs beside vLLM's defaults: the engines refuse to
    # tokenize (403), so it places every request on the least-loaded worker (measured by
    # bench.router_real from the router's own counters).
    "vllm_router_least_loaded": ("vllm_router", {"missing_tokens_share": 1.0},
                                 " (the vLLM Router beside vLLM's defaults: engines refuse to tokenize)"),
    # The exact, eviction-aware KV-event index: the best static placement; nobody ships it.
    "cache_aware": ("cache_aware", {}, " (exact KV-event index, the best static placement)"),
}


class Experiment:
    """Builds run specs from the Hydra config and runs them with a progress bar."""

    def __init__(self, cfg: DictConfig, out_dir: str) -> None:
        self.cfg = cfg
        self.out = out_dir
        raw = OmegaConf.to_container(cfg, resolve=True)
        raw["policy_params"] = _policy_params_by_name(raw["policy_params"])
        _check_policy_names(cfg)
        self.raw = raw
        # unknown keys and ill-typed values of recipes/sim/<name>.yaml
        self.cluster = build_options(ClusterSpec, raw["sim"], f"sim ({cfg.sim.get('name', '?')})",
                                     error=SimError, unknown_error=SimUnknownNameError)
        self.seeds = [int(s) for s in cfg.seeds]
        self.bs = int(raw["engine"]["block_size"])
        if cfg.trace:
            read_trace(cfg.trace)  # a malformed trace fails here, before any run starts
        self.title = self._title()
        self.completed: list[dict] = []  # every finished run, in finishing order

    def _title(self) -> str:
        cfg = self.cfg
        return (f"{self.cluster.name}, scale {cfg.scale}, {len(self.seeds)} seed{'s' if len(self.seeds) != 1 else ''}, "
                f"ceilings {cfg.ceiling_scope.replace('_', ' ')}")

    def write_partial(self, why: str) -> str:
        """results.json with the runs finished so far (``"interrupted": why``); returns its path."""
        path = os.path.join(self.out, "results.json")
        dump_json(path, {"config": self.raw, "interrupted": why, "runs": self.completed})
        return path

    def ceiling(self, c: int) -> int:
        """A full-size ceiling scaled with the system; ``ceiling_scope: per_instance`` reads
        the recipes' ceilings as per replica (the trainer's limit is then times the replicas)."""
        per = self.cluster.instances if self.cfg.ceiling_scope == "per_instance" else 1
        return max(1, round(c * per * self.cfg.scale))

    def spec(self, label: str, policy: str, ceiling: int, seed: int, params: dict | None = None,
             **kw) -> RunSpec:
        """One run of ``policy`` (options: policy_params[policy] updated by ``params``)."""
        merged = dict(self.raw["policy_params"].get(policy, {}) or {})
        merged.update(params or {})
        merged = scale_counts(policy, merged, float(self.cfg.scale))
        return RunSpec(
            label=label, cluster=self.cluster, policy=policy, params=merged, ceiling=ceiling, seed=seed,
            scale=float(self.cfg.scale), engine=self.raw["engine"], signals=self.raw["signals"],
            mixture=self.raw["mixture"], context_limit_tokens=int(self.cfg.context_limit_tokens),
            trace_path=self.cfg.trace, keep_timeline=(seed == self.seeds[0]),
            weight_sync_period_s=self.cfg.weight_sync_period_s,
            chars_per_token=float(self.cfg.prompt_text.chars_per_token),
            agent_system_prompt_tokens=int(self.cfg.agent_system_prompt_tokens),
            raise_policy_errors=bool(self.cfg.raise_policy_errors), **kw,
        )

    def run(self, specs: list[RunSpec], what: str) -> list[dict]:
        """Check every policy's options, then run ``specs`` with a progress bar.

        The bar counts runs, fractions included: a run advances it as its units complete.
        Each finished run is appended to ``runs.jsonl`` at once, so an interrupted
        experiment keeps every run it finished.
        """
        for policy, params in {(s.policy, json.dumps(s.params, sort_keys=True)) for s in specs}:
            check_policy_params(policy, json.loads(params))
        # A bar on a terminal; into a file or pipe (a log) one plain line per finished run,
        # not the bar's carriage-return redraws.
        interactive = sys.stderr.isatty()
        bar = tqdm(total=len(specs), desc=what, unit="run", dynamic_ncols=True,
                   disable=not interactive,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} runs [{elapsed}<{remaining}{postfix}]")
        done = [0.0] * len(specs)
        finished_runs = []  # this call's, for the log lines (self.completed spans calls)

        def advance(i: int, fraction: float) -> None:
            done[i] = min(max(fraction, done[i]), 1.0)
            bar.n = min(sum(done), len(specs))  # a sum, not increments: float error stays below total
            bar.update(0)  # redraws (at most every 0.1 s)

        def finished(i: int, result: dict) -> None:
            advance(i, 1.0)
            record = json.dumps(result, default=float) + "\n"
            with _signals_deferred():  # a SIGTERM between the two would keep one and not the other
                with open(os.path.join(self.out, "runs.jsonl"), "a") as f:
                    f.write(record)
                self.completed.append(result)
            finished_runs.append(i)
            line = (f"{result['label']} s{result['seed']}: "
                    f"{result['summary']['samples_per_min']:.2f} samples/min")
            if interactive:
                bar.set_postfix_str(line)
            else:
                print(f"{what}: {len(finished_runs)}/{len(specs)} runs done; {line}",
                      file=sys.stderr, flush=True)

        try:
            return run_all(specs, int(self.cfg.workers), finished, advance)
        finally:
            bar.close()

    def write(self, results: list[dict], agg: dict, table: str, extra: dict | None = None,
              shown: str | None = None) -> None:
        """results.json (timelines only for the first seed) and table.md (``table``); prints
        ``shown`` (default: ``table``) and the folder."""
        dump_json(os.path.join(self.out, "results.json"),
                  {"config": self.raw, "aggregate": agg, "runs": results, **(extra or {})})
        Path(self.out, "table.md").write_text(table + "\n")
        print(table if shown is None else shown)
        print(f"\nresults: {self.out}")

    def timelines(self, results: list[dict], labels: list[str]) -> dict[str, list[dict]]:
        """First-seed timelines of ``labels``."""
        tl = {r["label"]: r["timeline"] for r in results if "timeline" in r}
        return {lb: tl[lb] for lb in labels if lb in tl}

    # ------------------------------------------------------------------ experiments
    def table5(self) -> None:
        """Table 5 on each of ``shapes`` (default: the ``sim`` group's shape), one folder each
        when there are several; the headlines are printed last, one line per shape and policy."""
        names = list(self.cfg.shapes or [])
        if not names:
            print(self._table5_one())
            return
        base_out, heads = self.out, []
        for name in names:
            path = RECIPES_DIR / "sim" / f"{name}.yaml"
            if not path.is_file():
                raise SimUnknownNameError(f"shapes: no model shape {name!r} (recipes/sim/{name}.yaml); choose from: "
                                          + ", ".join(sorted(p.stem for p in (RECIPES_DIR / "sim").glob("*.yaml"))))
            self.raw["sim"] = OmegaConf.to_container(OmegaConf.load(path))
            self.cluster = build_options(ClusterSpec, self.raw["sim"], f"sim ({name})",
                                         error=SimError, unknown_error=SimUnknownNameError)
            self.title = self._title()
            self.out = os.path.join(base_out, name)
            os.makedirs(self.out, exist_ok=True)
            self.completed = []  # an interruption keeps this shape's finished runs; earlier shapes are written
            heads += [f"[{name}] " + line for line in self._table5_one().splitlines()]
        self.out = base_out
        print("\n".join(heads))

    def _table5_one(self) -> str:
        """Experiments 1-4 (see router/sim/experiments.py), against the static-ceiling routers of
        :data:`TABLE5_BASELINES`, each sweep-tuned over ``sim.sweep_ceilings``. The headlines
        (each policy against each vLLM Router baseline) are printed last; the very last line is
        ``misa_t vs vllm_router (sweep-tuned): ...``, the paper's claim."""
        c = self.cluster
        safe = c.safe_ceiling(self.bs, self.cfg.scale, self.cfg.context_limit_tokens)
        high = self.ceiling(c.permissive_ceiling)
        sweeps = {b: [f"{b}@{self.ceiling(x)}" for x in c.sweep_ceilings] for b in TABLE5_BASELINES}
        plan = [(lb, *TABLE5_BASELINES[b][:2], self.ceiling(x))
                for b, labels in sweeps.items() for lb, x in zip(labels, c.sweep_ceilings)]
        plan += [("vllm_router (128K-safe)", "vllm_router", {}, safe)]
        plan += [(p, p, {}, high) for p in ("session_admission", "misa", "misa_t", "kv_horizon", "aimd", "tool_pause",
                                            "progress_ttl")]
        plan += [("vllm_router (high load)", "vllm_router", {}, high)]
        specs = [self.spec(lb, p, ceil, s, params) for lb, p, params, ceil in plan for s in self.seeds]
        results = self.run(specs, f"table5 {c.name}")
        agg = aggregate(results)
        best = {b: best_sweep_label(agg, labels) for b, labels in sweeps.items()}
        base, exact = best["vllm_router"], best["cache_aware"]
        order = (["vllm_router (128K-safe)", *best.values(), "session_admission", "misa", "misa_t", "kv_horizon",
                  "aimd", "tool_pause", "progress_ttl", "vllm_router (high load)"])
        vs = [table5_markdown(agg, best[b], order, f"Table 5 ({self.title}); baseline: sweep-tuned {best[b]}{note}")
              for b, (_, _, note) in TABLE5_BASELINES.items()]
        table = "\n\n".join([
            *vs,
            per_class_markdown(agg, order),
            "Composition of the completed samples against the released ones (output tokens)\n\n"
            + composition_markdown(agg, order),
            *(table5_markdown(agg, best[b], sweeps[b], f"The static-ceiling sweep of {b}") for b in TABLE5_BASELINES),
            decode_ceiling_markdown(agg, order),
        ])
        # against the vLLM Router as vLLM's defaults leave it first, then with its prefix path;
        # the project's own policy (issue 15) before the paper's misa_t; misa_t vs vllm_router last
        head = "\n".join([*(decode_ceiling_headline(agg, best[b], f"{b} (sweep-tuned)") for b in ("cache_aware", "vllm_router")),
                          *(headline(agg, p, best[b], f"{b} (sweep-tuned)")
                            for b in ("vllm_router_least_loaded", "vllm_router") for p in ("kv_horizon", "misa_t"))])
        self.write(results, agg, table + "\n\n" + head,
                   {"baseline": base, "exact_baseline": exact, "baselines": best, "safe_ceiling": safe,
                    "permissive_ceiling": high, "headline": head},
                   shown=table)  # the headlines once, last (table5)
        tls = self.timelines(results, [base, exact, "misa_t", "session_admission", "vllm_router (high load)"])
        if "misa_t" in tls:
            plot_caps(tls["misa_t"], os.path.join(self.out, "caps_misa_t.png"), f"MISA-T caps, {self.title}")
        plot_hit_rate(tls, os.path.join(self.out, "hit_rate.png"), f"prefix hit rate, {self.title}")
        plot_mixture({k: tls[k] for k in (base, "misa_t") if k in tls}, self.raw["mixture"],
                     os.path.join(self.out, "mixture.png"), f"consumed mixture, {self.title}")
        return head

    def _oracle_params(self, truth: dict, switch_s: float) -> dict:
        return {"switch_s": switch_s, **truth}

    def shift(self) -> None:
        """Experiment 5a (issue 15): a workload shift after a stationary first phase.

        Units released from ``at_s`` on have rlvr outputs x ``shift.rlvr_output_factor`` and
        agent tool gaps stretched so that the gap occupancy gap / (gap + model time) becomes
        ``shift.agent_tool_gap_share_after`` (from the shape's ``sim.tool_gap_share``; or
        ``shift.agent_tool_gap_factor`` when given). ``at_s`` is the same simulated time for
        every policy of a seed: ``at_frac`` of the window of (a) without the shift. Compared,
        each per phase (before / after the shift: samples/min, output tok/min, prefix hit):
        (a) ``shift.baseline`` at the static ceiling sweep-tuned on the unshifted workload,
        (b) the same at the ceiling re-tuned on the phase after the shift (an oracle),
        (c) misa_t with its windowed estimators, (d) misa_t_oracle (misa_t with the true class
        values of (c)'s run), (e) each of ``shift.policies``, and (c), (e) again with snapshots
        delayed ``delay_factor`` x and ``shift.kv_event_loss`` of the KV events lost."""
        sh, cfg = self.raw["shift"], self.cfg
        high = self.ceiling(self.cluster.permissive_ceiling)
        base_pol = canonical_policy_name(sh["baseline"])
        ceilings = [int(c) for c in (sh["sweep_ceilings"] or self.cluster.sweep_ceilings)]
        sweep1 = [f"{base_pol}@{self.ceiling(c)} (phase 1)" for c in ceilings]
        first = self.run([self.spec(lb, base_pol, self.ceiling(c), s) for lb, c in zip(sweep1, ceilings)
                          for s in self.seeds], "shift: phase-1 sweep")
        agg1 = aggregate(first)
        tuned1 = best_sweep_label(agg1, sweep1)
        at = {}
        for r in first:
            if r["label"] == tuned1:
                t0, t1 = r["summary"]["window_s"]
                at[r["seed"]] = t0 + sh["at_frac"] * (t1 - t0)
        factor = sh["agent_tool_gap_factor"]
        if factor is None:  # occupancy s -> s': gap/model ratio s/(1-s) -> s'/(1-s')
            s0, s1 = self.cluster.tool_gap_share, float(sh["agent_tool_gap_share_after"])
            factor = (s1 / (1 - s1)) / max(s0 / (1 - s0), 1e-9)

        def shift_of(seed: int) -> dict:
            return {"at_s": at[seed], "rlvr_output_factor": sh["rlvr_output_factor"], "agent_tool_gap_factor": factor}

        f = float(cfg.delay_factor)
        sig = dict(self.raw["signals"])
        degraded = {**sig, "metrics_delay_s": sig["metrics_delay_s"] * f, "kv_event_delay_s": sig["kv_event_delay_s"] * f,
                    "kv_event_loss": float(sh["kv_event_loss"])}
        tag = f"{f:g}x delay, {float(sh['kv_event_loss']):.0%} KV events lost"
        sweep2 = {c: f"{base_pol}@{self.ceiling(c)} (shift)" for c in ceilings}
        specs = [self.spec(sweep2[c], base_pol, self.ceiling(c), s, shift=shift_of(s)) for c in ceilings
                 for s in self.seeds]
        adaptive = ["misa_t"] + [canonical_policy_name(p) for p in sh["policies"]]
        specs += [self.spec(f"{p} (shift)", p, high, s, shift=shift_of(s), record_truth=(p == "misa_t"))
                  for p in adaptive for s in self.seeds]
        specs += [with_params(self.spec(f"{p} (shift, {tag})", p, high, s, shift=shift_of(s)), signals=degraded)
                  for p in adaptive for s in self.seeds]
        second = self.run(specs, "shift: after the shift")
        truth = {r["seed"]: r["truth"] for r in second if r["label"] == "misa_t (shift)"}
        oracle = self.run([self.spec("misa_t_oracle (shift)", "misa_t_oracle", high, s,
                                     params=self._oracle_params(truth[s], at[s]), shift=shift_of(s))
                           for s in self.seeds], "shift: oracle estimates")
        results = first + second + oracle
        agg = aggregate(results)
        phase_agg = aggregate_phases(results)
        retuned = max((lb for lb in sweep2.values() if lb in phase_agg),
                      key=lambda lb: phase_agg[lb]["after_shift"]["samples_per_min"]["mean"])
        a_label = sweep2[ceilings[sweep1.index(tuned1)]]
        order = [a_label, retuned, "misa_t (shift)", "misa_t_oracle (shift)"]
        order += [f"{p} (shift)" for p in adaptive[1:]] + [f"{p} (shift, {tag})" for p in adaptive]
        order = list(dict.fromkeys(order))  # (a) and (b) may be the same ceiling
        title = (f"Workload shift at {sh['at_frac']:.0%} of the window of {tuned1}: rlvr outputs x"
                 f"{sh['rlvr_output_factor']}, agent tool gaps x{factor:.2f} (shape's occupancy "
                 f"{self.cluster.tool_gap_share:.1%}) ({self.title})")
        table = "\n\n".join([
            phase_markdown(phase_agg, a_label, order, f"{title}; per phase, vs (a) {a_label}, the static ceiling "
                           f"sweep-tuned on phase 1 (b: {retuned}, re-tuned on phase 2)"),
            table5_markdown(agg, a_label, order, "Whole window, vs (a)") + "\n\n" + per_class_markdown(agg, order),
            table5_markdown(agg, tuned1, sweep1, "Phase-1 sweep (no shift)"),
            phase_markdown(phase_agg, a_label, list(sweep2.values()), "Sweep under the shift, per phase"),
        ])
        self.write(results, agg, table, {"shift_at_s": at, "truth": truth, "tool_gap_factor": factor,
                                         "phase_aggregate": phase_agg, "tuned_phase1": tuned1, "retuned_phase2": retuned})
        tls = self.timelines(results, order)
        plot_hit_rate(tls, os.path.join(self.out, "hit_rate.png"), f"prefix hit rate, {self.title}")
        for lb, name in (("misa_t (shift)", "caps_misa_t_shift.png"), ("misa_t_oracle (shift)", "caps_oracle_shift.png")):
            if lb in tls:
                plot_caps(tls[lb], os.path.join(self.out, name), f"{lb} caps, {self.title}")

    def delay(self) -> None:
        """Experiment 5b: snapshot and KV-event delay x delay_factor, misa_t vs misa_t_oracle."""
        high = self.ceiling(self.cluster.permissive_ceiling)
        f = float(self.cfg.delay_factor)
        sig = dict(self.raw["signals"])
        slow = {**sig, "metrics_delay_s": sig["metrics_delay_s"] * f, "kv_event_delay_s": sig["kv_event_delay_s"] * f}
        tag = f"{f:g}x delay"
        first = [self.spec("misa_t", "misa_t", high, s) for s in self.seeds]
        first += [with_params(self.spec(f"misa_t ({tag})", "misa_t", high, s, record_truth=True), signals=slow)
                  for s in self.seeds]
        r1 = self.run(first, "delay: estimators")
        truth = {r["seed"]: r["truth"] for r in r1 if "truth" in r}
        oracle = [with_params(self.spec(f"misa_t_oracle ({tag})", "misa_t_oracle", high, s,
                                        params=self._oracle_params(truth[s], 0.0)), signals=slow)
                  for s in self.seeds]
        results = r1 + self.run(oracle, "delay: oracle")
        agg = aggregate(results)
        order = ["misa_t", f"misa_t ({tag})", f"misa_t_oracle ({tag})"]
        table = table5_markdown(agg, "misa_t", order, f"Snapshot delay x{f:g} ({self.title}); baseline: misa_t "
                                f"at the normal delay") + "\n\n" + per_class_markdown(agg, order)
        self.write(results, agg, table, {"truth": truth})
        tls = self.timelines(results, order)
        plot_hit_rate(tls, os.path.join(self.out, "hit_rate.png"), f"prefix hit rate, {self.title}")
        if f"misa_t ({tag})" in tls:
            plot_caps(tls[f"misa_t ({tag})"], os.path.join(self.out, "caps_misa_t_delay.png"),
                      f"MISA-T caps, {tag}, {self.title}")

    def sensitivity(self) -> None:
        """Experiment 6: the open controller parameters, one at a time."""
        high = self.ceiling(self.cluster.permissive_ceiling)
        pol = canonical_policy_name(self.cfg.sensitivity.policy)  # misa-t is misa_t, with its policy_params
        plan = [(f"{pol} (defaults)", {})]
        for name, values in self.raw["sensitivity"]["params"].items():
            plan += [(f"{pol} {name}={v}", {name: v}) for v in values]
        results = self.run([self.spec(lb, pol, high, s, params=p) for lb, p in plan for s in self.seeds],
                           "sensitivity")
        agg = aggregate(results)
        order = [lb for lb, _ in plan]
        table = table5_markdown(agg, order[0], order, f"Sensitivity of {pol} ({self.title}); baseline: defaults")
        self.write(results, agg, table)

    def ceilings(self) -> None:
        """The policies against the sweep-tuned baseline as the trainer's ceiling moves (issue
        15's mixture goal: no class's p50 completion time above 2x the baseline's). The
        baseline (``ceilings.baseline``) is swept over ``sim.sweep_ceilings``; each of
        ``ceilings.policies`` then runs at ``ceilings.factors`` x its best ceiling (rounded to
        whole units; the tables give the factor after rounding). A unit's
        completion time runs from its release, so past the baseline's ceiling units wait in the
        router's queue (Little's law: the mean grows with the ceiling over the rate): the table
        shows what each ceiling buys in samples/min and costs in completion time."""
        c, cc = self.cluster, self.raw["ceilings"]
        base_pol = canonical_policy_name(cc["baseline"])
        policies = [canonical_policy_name(p) for p in cc["policies"]]
        for pol in [base_pol, *policies]:  # names: checked at start (_check_policy_names)
            check_policy_params(pol, self.spec(pol, pol, 1, self.seeds[0]).params)  # its policy_params
        sweep = [f"{base_pol}@{self.ceiling(x)}" for x in c.sweep_ceilings]
        results = self.run([self.spec(lb, base_pol, self.ceiling(x), s)
                            for lb, x in zip(sweep, c.sweep_ceilings) for s in self.seeds],
                           f"ceilings {c.name}: {base_pol} sweep")
        swept = aggregate(results)
        best = best_sweep_label(swept, sweep)
        best_ceiling = swept[best]["ceiling"]
        rows: list[tuple[str, float]] = []
        specs = []
        for pol in policies:
            for f in cc["factors"]:
                ceil = max(1, round(float(f) * best_ceiling))
                label = f"{pol}@{ceil}"
                if label in dict(rows):
                    continue  # two factors on one ceiling (a small scale): run once
                rows.append((label, ceil / best_ceiling))  # the factor run, after rounding to whole units
                if label not in sweep:  # the baseline's own policy at a swept ceiling: that run
                    specs += [self.spec(label, pol, ceil, s) for s in self.seeds]
        results += self.run(specs, f"ceilings {c.name}: policies")
        agg = aggregate(results)
        order = [best, *(lb for lb, _ in rows)]
        table = "\n\n".join([
            ceilings_markdown(agg, best, rows, f"The trainer's ceiling ({self.title}); baseline: sweep-tuned {best}"),
            per_class_markdown(agg, order),
            table5_markdown(agg, best, sweep, f"The static-ceiling sweep of {base_pol}"),
        ])
        head = "\n".join(ceilings_headline(agg, lb, f, best) for lb, f in rows)
        self.write(results, agg, table + "\n\n" + head,
                   {"baseline": best, "ceiling_factors": dict(rows), "headline": head}, shown=table)
        plot_ceilings(ceilings_points(agg, best, rows), P50_RATIO_LIMIT, os.path.join(self.out, "ceilings.png"),
                      f"policies against the sweep-tuned {best}, {self.title}")
        print(head)

    def single(self) -> None:
        """One policy at one ceiling over the seeds."""
        pol = canonical_policy_name(self.cfg.run.policy)  # misa-t is misa_t, with its policy_params
        ceil = self.ceiling(self.cfg.run.ceiling or self.cluster.permissive_ceiling)
        results = self.run([self.spec(pol, pol, ceil, s) for s in self.seeds], f"run {pol}")
        agg = aggregate(results)
        table = "\n\n".join([table5_markdown(agg, pol, [pol], f"{pol} at ceiling {ceil} ({self.title})"),
                               per_class_markdown(agg, [pol]), decode_ceiling_markdown(agg, [pol])])
        self.write(results, agg, table)
        tls = self.timelines(results, [pol])
        if pol in tls:
            plot_caps(tls[pol], os.path.join(self.out, f"caps_{pol}.png"), f"{pol} caps, {self.title}")
            plot_mixture(tls, self.raw["mixture"], os.path.join(self.out, "mixture.png"),
                         f"consumed mixture, {self.title}")


EXPERIMENTS = {"table5": Experiment.table5, "shift": Experiment.shift, "delay": Experiment.delay,
               "sensitivity": Experiment.sensitivity, "run": Experiment.single, "ceilings": Experiment.ceilings}


class Interrupted(Exception):
    """SIGTERM (or SIGHUP) arrived; raised in the main thread so every ``finally`` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_deferring = False
_pending_signals: list[int] = []


def _raise_interrupted(signum: int, _frame) -> None:
    if _deferring:  # inside _signals_deferred(): raised when it ends
        _pending_signals.append(signum)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_deferred():
    """SIGTERM / SIGHUP arriving inside the block raise :class:`Interrupted` when it ends, so
    a finished run is in ``runs.jsonl`` and in the run list, or in neither."""
    global _deferring
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    if _pending_signals:
        signum = _pending_signals[0]
        _pending_signals.clear()
        raise Interrupted(signum)


@hydra_entry("sim")
def main(cfg: DictConfig) -> None:
    """Run ``cfg.experiment``; a SimError is printed as one line (``hydra_entry``): exit
    status 2 for an unknown name (SimUnknownNameError), 1 for a bad value.

    Ctrl-C, SIGTERM or SIGHUP stop every worker process, write ``results.json`` with the
    runs finished so far (they are also in ``runs.jsonl``) and exit with 128 + the signal.
    """
    experiment = None
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupted)
    check_values(cfg, VALUE_RULES)
    try:
        if cfg.experiment not in EXPERIMENTS:
            raise SimUnknownNameError(f"experiment={cfg.experiment}: unknown experiment {cfg.experiment!r}; "
                                      f"choose one of: {', '.join(EXPERIMENTS)}")
        if cfg.shapes and cfg.experiment != "table5":
            raise SimError(f"shapes={list(cfg.shapes)}: only experiment=table5 runs several model shapes; "
                           f"for experiment={cfg.experiment} choose one with sim=<name> (e.g. sim=qwen3.6-like)")
        out = HydraConfig.get().runtime.output_dir
        os.makedirs(out, exist_ok=True)
        experiment = Experiment(cfg, out)
        EXPERIMENTS[cfg.experiment](experiment)
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        if experiment is not None:
            path = experiment.write_partial(name)
            print(f"\nrouter.sim: {name}: stopped; {len(experiment.completed)} finished run(s) kept in {path}",
                  file=sys.stderr)
        else:
            print(f"\nrouter.sim: {name}: stopped", file=sys.stderr)
        sys.exit(128 + signum)


if __name__ == "__main__":
    main()
