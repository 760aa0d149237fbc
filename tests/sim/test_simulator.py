"""Small-trace runs of the whole simulator: the cache_aware collapse, the admission ordering, determinism."""

from __future__ import annotations

import pytest

import router.sim  # noqa: F401  (registers the simulator's policies)
from router.policies import make_policy
from router.policies.base import Admit, Hold, SessionEnded
from router.sim.cost_model import HARDWARE, MODELS, RooflineCost, decode_ceiling
from router.sim.engine import EngineConfig
from router.sim.errors import SimError
from router.sim.simulator import SignalConfig, SimConfig, Simulation
from router.sim.trace import TraceRecord, TraceSession
from router.sim.workload import ClassSpec, LengthDist, WorkloadConfig, generate_trace

LIMIT = 32768
MIX = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}


def mini_classes() -> dict[str, ClassSpec]:
    """The paper's three classes at about a quarter of Table 2's lengths (32K context)."""
    return {
        "agent": ClassSpec(prompt=LengthDist(400, 1500, 64, 4000), output=LengthDist(80, 600, 1, 2000), group_size=2,
                           turns="multi", input_p50=9000, input_p95=24000, turns_mean=12, class_prefix_tokens=512,
                           tool_gap_share=0.2, turn_time_hint_s=3.0),
        "rlhf": ClassSpec(prompt=LengthDist(60, 1000, 1, 1000), output=LengthDist(1500, 5000, 1, LIMIT), group_size=2),
        "rlvr": ClassSpec(prompt=LengthDist(150, 800, 1, 1000), output=LengthDist(6000, 24000, 1, LIMIT),
                          group_size=4),
    }


@pytest.fixture(scope="module")
def mini_trace():
    return generate_trace(WorkloadConfig(units=120, classes=mini_classes(), context_limit_tokens=LIMIT, seed=0))


def run(trace, policy: str, ceiling: int, params: dict | None = None, num_blocks: int = 1200) -> dict:
    cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=num_blocks, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=ceiling,
                    context_limit_tokens=LIMIT, signals=SignalConfig(metrics_delay_s=0.5, kv_event_delay_s=0.1))
    return Simulation(cfg, trace, make_policy(policy, params or {})).run().summary


@pytest.fixture(scope="module")
def ladder(mini_trace):
    cache = {"match_from": "prefix_index"}
    # Agent sessions here hold 9K-24K tokens: a footprint prior of 4,096 tokens (64 blocks
    # of 64) keeps the first admissions from flooding the cache before sessions complete.
    admission = {"k_prior_tokens": 4096}
    return {
        "cache_aware_low": run(mini_trace, "cache_aware", 8, cache),
        "cache_aware_high": run(mini_trace, "cache_aware", 48, cache),
        "session_admission": run(mini_trace, "session_admission", 48, admission),
        "misa_t": run(mini_trace, "misa_t", 48, admission),
    }


@pytest.mark.slow
def test_cache_aware_prefix_hit_rate_collapses_at_a_high_ceiling(ladder):
    low, high = ladder["cache_aware_low"], ladder["cache_aware_high"]
    assert low["prefix_hit_rate"] > 0.8
    assert high["prefix_hit_rate"] < low["prefix_hit_rate"] - 0.4
    # the admission policies keep reuse at the same permissive ceiling
    assert ladder["misa_t"]["prefix_hit_rate"] > high["prefix_hit_rate"] + 0.4


@pytest.mark.slow
def test_misa_t_completes_more_samples_than_session_admission(ladder):
    assert ladder["session_admission"]["samples_per_min"] < ladder["misa_t"]["samples_per_min"]


@pytest.mark.slow
def test_every_released_unit_completes_and_the_mixture_stays_near_the_target(ladder):
    for summary in ladder.values():
        assert summary["units_completed"] == summary["units_released"]
    assert ladder["cache_aware_low"]["tv_distance"] < 0.05


def test_same_seed_gives_the_same_run(mini_trace):
    a = run(mini_trace, "round_robin", 16)
    b = run(mini_trace, "round_robin", 16)
    assert a == b


def test_kv_events_reach_the_policy_prefix_index(mini_trace):
    cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=1200, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=8,
                    context_limit_tokens=LIMIT, horizon_s=60.0)
    policy = make_policy("cache_aware", {"match_from": "prefix_index"})
    sim = Simulation(cfg, mini_trace, policy)
    sim.run()
    for e in sim.engines:
        cached = len(e.kv.ref) + len(e.kv.lru)
        assert cached > 0 and policy.index.blocks_of(e.instance) == cached


def test_recorded_hashes_at_another_block_size_are_refused_before_the_run():
    rec = TraceRecord("s", "agent", 0, 128, 4, prompt_hashes=[1, 2], block_size=64, session_end=True)
    cfg = SimConfig(instances=1, engine=EngineConfig(num_blocks=100, block_size=16),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture={"agent": 1}, ceiling=1,
                    context_limit_tokens=1024)
    with pytest.raises(SimError, match="block_size 64"):
        Simulation(cfg, [TraceSession("s", "agent", "s", None, [rec])], make_policy("round_robin"))


def test_admit_on_an_unknown_instance_is_reported(mini_trace):
    class Stray:
        name = "stray"

        def decide(self, request, view, now):
            return Admit("nowhere")

        def observe(self, event):
            pass

        def state(self):
            return {}

    cfg = SimConfig(instances=1, engine=EngineConfig(num_blocks=600, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=2,
                    context_limit_tokens=LIMIT)
    with pytest.raises(SimError, match="unknown instance 'nowhere'"):
        Simulation(cfg, mini_trace, Stray()).run()


def test_weight_sync_resets_lower_the_prefix_hit_rate(mini_trace):
    cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=1200, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=8,
                    context_limit_tokens=LIMIT, horizon_s=200.0)
    no_sync = Simulation(cfg, mini_trace, make_policy("cache_aware", {"match_from": "prefix_index"})).run().summary
    cfg_sync = SimConfig(**{**cfg.__dict__, "weight_sync_period_s": 20.0})
    policy = make_policy("cache_aware", {"match_from": "prefix_index"})
    with_sync = Simulation(cfg_sync, mini_trace, policy).run().summary
    assert with_sync["prefix_hit_rate"] < no_sync["prefix_hit_rate"]


class OneSessionAtATime:
    """A test policy: one open session at a time; everyone else is held for 1 s."""

    name = "one_at_a_time"

    def __init__(self) -> None:
        self.open: set[str] = set()
        self.calls: list[tuple[float, str, str]] = []

    def decide(self, request, view, now):
        if request.session_id in self.open or not self.open:
            self.open.add(request.session_id)
            self.calls.append((now, request.session_id, "admit"))
            return Admit(view.instances[0].instance)
        self.calls.append((now, request.session_id, "hold"))
        return Hold(1.0)

    def observe(self, event):
        if isinstance(event, SessionEnded):
            self.open.discard(event.session_id)

    def state(self):
        return {}


def single_turn_sessions(n: int, cls: str = "rlvr") -> list[TraceSession]:
    return [TraceSession(f"s{i}", cls, f"s{i}", None, [TraceRecord(f"s{i}", cls, 0, 512, 256, session_end=True)])
            for i in range(n)]


def test_only_the_oldest_held_new_session_of_a_class_is_rechecked():
    cfg = SimConfig(instances=1, engine=EngineConfig(num_blocks=600, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture={"rlvr": 1}, ceiling=5,
                    context_limit_tokens=LIMIT)
    policy = OneSessionAtATime()
    summary = Simulation(cfg, single_turn_sessions(5), policy).run().summary
    assert summary["units_completed"] == 5
    admitted = [sid for _, sid, what in policy.calls if what == "admit"]
    assert admitted == [f"s{i}" for i in range(5)]  # in arrival order
    for k in range(2, 5):
        mine = [t for t, sid, _ in policy.calls if sid == f"s{k}"]
        # asked on arrival, then not until the one before it is admitted (from the held
        # queue, where s1 was the head): at that very moment
        previous_admitted_s = next(t for t, sid, what in policy.calls if sid == f"s{k - 1}" and what == "admit")
        assert mine[0] == 0.0 < previous_admitted_s == mine[1]
    # holds are rechecked after recheck_after_s, not sooner: a few per second at most
    holds = sum(what == "hold" for _, _, what in policy.calls)
    assert holds <= 4 + 2 * summary["sim_end_s"]


def test_an_engine_smaller_than_one_full_context_sequence_is_refused():
    cfg = SimConfig(instances=1, engine=EngineConfig(num_blocks=100, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture={"rlvr": 1}, ceiling=1,
                    context_limit_tokens=LIMIT)
    with pytest.raises(SimError, match="less than one sequence at the context limit"):
        Simulation(cfg, single_turn_sessions(1), make_policy("round_robin"))


def test_a_prompt_beyond_the_context_limit_is_refused_before_the_run():
    cfg = SimConfig(instances=1, engine=EngineConfig(num_blocks=600, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture={"rlvr": 1}, ceiling=1,
                    context_limit_tokens=LIMIT)
    trace = [TraceSession("s", "rlvr", "s", None, [TraceRecord("s", "rlvr", 0, LIMIT, 8, session_end=True)])]
    with pytest.raises(SimError, match="session 's' turn 0: prompt of 32768 tokens"):
        Simulation(cfg, trace, make_policy("round_robin"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scale", [0.01, 0.04])
def test_a_tiny_scale_run_terminates_with_every_unit_complete(scale):
    # Below scale ~0.042 the scaled KV pool of a step3.7-like replica no longer holds one
    # 128K-token sequence; such a request used to preempt itself forever.
    from router.sim.experiments import ClusterSpec, RunSpec, run_one

    cluster = ClusterSpec("step3.7-like", "step3.7-like", "H200", 8, 2)
    spec = RunSpec("tiny", cluster, "misa_t", {"k_prior_tokens": 16384}, ceiling=max(1, round(512 * scale)),
                   seed=0, scale=scale, engine={"block_size": 256}, signals={},
                   mixture={"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2})
    assert cluster.kv_blocks(256, scale, 131072) * 256 >= 131072
    summary = run_one(spec)["summary"]
    assert summary["units_completed"] == summary["units_released"] > 0


def test_vllm_router_runs_in_the_simulator_on_synthetic_text(mini_trace):
    # The text tree is fed at routing time from the synthetic prompts: the policy sees text
    # (it records tree characters) and places every request; the run completes every unit.
    cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=1200, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=16,
                    context_limit_tokens=LIMIT, chars_per_token=4.0)
    policy = make_policy("vllm_router", {"balance_abs_threshold": 4})
    summary = Simulation(cfg, mini_trace, policy).run().summary
    assert summary["units_completed"] == summary["units_released"]
    assert sum(policy.tree.tenant_sizes_chars().values()) > 0
    # 0.1.17's HTTP path: per-worker matches (later turns and GRPO siblings hit), imbalance
    assert policy.decisions.get("prefix_hit", 0) > 0 and policy.decisions.get("load_imbalance", 0) > 0
    assert summary["composition"]["total"]["samples"] > 0
    # the legacy path runs too, with its session keys
    legacy = make_policy("vllm_router", {"balance_abs_threshold": 4, "match_rule": "tree_owner",
                                         "session_affinity": True})
    Simulation(cfg, mini_trace, legacy).run()
    assert legacy.decisions.get("session_id_match", 0) > 0 and legacy.decisions.get("full_history_match", 0) > 0


def test_a_shift_run_reports_each_phase_and_the_longer_outputs_after_it(mini_trace):
    from router.sim.simulator import WorkloadShift

    base = run(mini_trace, "cache_aware", 8, {"match_from": "prefix_index"})
    t0, t1 = base["window_s"]
    at = t0 + 0.4 * (t1 - t0)
    cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=1200, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=8,
                    context_limit_tokens=LIMIT, shift=WorkloadShift(at_s=at, rlvr_output_factor=3.0))
    shifted = Simulation(cfg, mini_trace, make_policy("cache_aware", {"match_from": "prefix_index"})).run().summary
    phases = shifted["phases"]
    assert base["phases"] == {}  # no shift: no phases
    assert phases["before_shift"]["window_s"][1] == pytest.approx(at) == phases["after_shift"]["window_s"][0]
    for fig in phases.values():
        assert fig["samples_per_min"] > 0 and 0 < fig["prefix_hit_rate"] <= 1
    # rlvr outputs x3 after the shift: the same ceiling completes fewer samples per minute
    assert phases["after_shift"]["samples_per_min"] < phases["before_shift"]["samples_per_min"]


def test_the_summary_counts_the_engines_steps_of_its_window(mini_trace):
    cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=1200, block_size=64),
                    cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture=MIX, ceiling=8,
                    context_limit_tokens=LIMIT, horizon_s=60.0)
    marks = {}
    sim = Simulation(cfg, mini_trace, make_policy("round_robin", {}))
    mark = sim._mark_window

    def recording(edge: str) -> None:  # the engines' own counters at each window edge
        mark(edge)
        marks[edge] = [(e.clock, e.counters.busy_s, e.counters.prefill_computed_tokens, e.counters.generation_tokens)
                       for e in sim.engines]

    sim._mark_window = recording
    s = sim.run().summary
    d = [sum(b[j] - a[j] for a, b in zip(marks["start"], marks["stop"])) for j in range(4)]
    window = s["window_s"][1] - s["window_s"][0]
    figures = s["engine_steps"]
    assert d[0] > 0 and figures["steps_per_s"] * window == pytest.approx(d[0])
    assert figures["ms_per_step"] == pytest.approx(1000 * d[1] / d[0])
    assert figures["prefill_tokens_per_step"] == pytest.approx(d[2] / d[0]) and d[2] > 0
    assert figures["decode_seqs_per_step"] == pytest.approx(d[3] / d[0]) and d[3] > 0


def test_the_summary_sets_the_decode_rate_against_the_kv_bound_ceiling(mini_trace):
    engine = EngineConfig(num_blocks=1200, block_size=64)
    cost = RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4)
    cfg = SimConfig(instances=2, engine=engine, cost=cost, mixture=MIX, ceiling=16, context_limit_tokens=LIMIT)
    s = Simulation(cfg, mini_trace, make_policy("round_robin", {})).run().summary
    ctx, sharing = s["mean_decode_context_tokens"], s["context_per_kv_token"]
    assert 0 < ctx < LIMIT and sharing >= 1.0
    per_engine = decode_ceiling(cost, int(sharing * 1200 * 64), ctx, engine.max_num_seqs)[0]
    assert s["decode_ceiling_tok_s"] == pytest.approx(2 * per_engine)
    # the engines decode below their ceiling: the window holds prefill, idle time and smaller batches
    assert 0 < s["decode_step_tok_s"] <= s["decode_tok_s"]  # the latter counts prefill steps' first tokens
    assert s["decode_ceiling_headroom"] == pytest.approx(s["decode_ceiling_tok_s"] / s["decode_step_tok_s"] - 1)
    assert s["decode_ceiling_headroom"] > 0
    # and the policy's own counts at the end, numbers only
    assert s["policy_counters"] and all(isinstance(v, (int, float)) for v in s["policy_counters"].values())


def test_a_kv_horizon_run_reports_its_backfill_admissions(mini_trace):
    s = run(mini_trace, "kv_horizon", 48, {"backfill_share": 0.2, "footprint_prior_tokens": 4096}, num_blocks=600)
    counters = s["policy_counters"]
    assert counters["backfill_admissions"] > 0 and counters["holds_queue"] > 0
    assert counters["over_budget_admissions"] <= counters["floor_admissions"]  # a backfill never breaks Eq. 3


def test_a_window_without_decode_steps_has_no_ceiling_figures_and_seeds_aggregate_without_them():
    from router.sim.experiments import aggregate
    from router.sim.metrics import ZERO_SNAPSHOT, decode_ceiling_figures

    assert decode_ceiling_figures(None, [ZERO_SNAPSHOT], [ZERO_SNAPSHOT], 60.0) == {}
    base = {m: 1.0 for m in ("samples_per_min", "requests_per_min", "prefix_hit_rate", "prefill_tok_s",
                             "decode_tok_s", "tv_distance", "output_tokens_per_min",
                             "length_adjusted_samples_per_min", "decode_tokens_per_sample")}
    base.update(consumed_mixture={}, completion_s={}, preemptions=0)
    runs = [{"label": "x", "policy": "p", "ceiling": 1, "tags": {}, "summary": dict(base)} for _ in range(2)]
    runs[0]["summary"].update(decode_ceiling_headroom=0.2)  # one seed has it, the other not: left out
    agg = aggregate(runs)["x"]
    assert "decode_ceiling_headroom" not in agg and agg["samples_per_min"]["mean"] == 1.0
    del runs[1]["summary"]["samples_per_min"]  # any other metric missing is an error, not skipped
    with pytest.raises(KeyError, match="samples_per_min"):
        aggregate(runs)


def test_request_overhead_delays_each_request_before_the_router():
    """One two-turn session with a 1 s tool gap: 2 s outside the engines per request make the
    run 4 s longer, and the policy sees the first request arrive at 2 s; a client that takes
    0.5 s more between a response and the next request makes it 0.5 s longer again."""
    session = TraceSession("a0", "agent", "a0", None, [TraceRecord("a0", "agent", 0, 512, 64, tool_gap_s=1.0),
                                                     TraceRecord("a0", "agent", 1, 640, 64, session_end=True)])
    ends, arrivals = [], []
    for overhead, between in ((0.0, 0.0), (2.0, 0.0), (2.0, 0.5)):
        cfg = SimConfig(instances=1, engine=EngineConfig(num_blocks=600, block_size=64),
                        cost=RooflineCost(MODELS["qwen3.6-like"], HARDWARE["H100"], 4), mixture={"agent": 1},
                        ceiling=1, context_limit_tokens=LIMIT, request_overhead_s=overhead,
                        continuation_delay_s=between)
        policy = OneSessionAtATime()
        ends.append(Simulation(cfg, [session], policy).run().summary["sim_end_s"])
        arrivals.append(policy.calls[0][0])
    assert ends[1] - ends[0] == pytest.approx(4.0) and ends[2] - ends[1] == pytest.approx(0.5)
    assert arrivals == [0.0, 2.0, 2.0]


def test_each_engine_can_have_its_own_step_cost(mini_trace):
    """A list of step-time models gives one per engine: with one engine 3x slower than the other,
    that engine steps a third as often over the same load; a list of the wrong length is refused."""
    from router.sim.cost_model import LinearStepCost

    fast = LinearStepCost(c0_s=0.01, c_prefill_s=1e-5, c_decode_s=1e-4)
    slow = fast.scaled(3.0)

    def engines(cost):
        cfg = SimConfig(instances=2, engine=EngineConfig(num_blocks=1200, block_size=64), cost=cost, mixture=MIX,
                        ceiling=8, context_limit_tokens=LIMIT, horizon_s=600.0)
        return Simulation(cfg, mini_trace, make_policy("round_robin", {})).run().summary["engines"]

    same = engines(fast)
    mixed = engines([fast, slow])
    assert mixed[1]["ms_per_step"] == pytest.approx(3 * mixed[0]["ms_per_step"], rel=0.5)
    assert mixed[1]["ms_per_step"] > 2 * same[1]["ms_per_step"]
    with pytest.raises(SimError, match="3 step-time models for 2 instances"):
        engines([fast, fast, slow])
