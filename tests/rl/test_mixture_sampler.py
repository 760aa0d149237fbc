"""Sampler and mixture ledger: the released mixture tracks rho, runs are deterministic
and resumable, groups fan out, and the ledger's books add up."""

import json

import numpy as np
import pytest

from rl.data import ArithmeticSource, InstructionSource
from rl.data.base import Prompt, user_prompt
from rl.mixture import DEFAULT_RHO, MixtureError, MixtureLedger, normalize_mixture, tv_distance
from rl.sampler import MixtureSampler, RolloutUnit, WorkloadClassSpec, largest_deficit


class _TaskSource:
    """A stand-in agent domain: task ids drawn from the generator."""

    name = "tasks"

    def draw(self, rng):
        k = int(rng.integers(1000))
        return Prompt(f"tasks/{k}", "tasks", user_prompt(f"fix bug {k}"))


def make_sampler(seed=0, group_sizes=(4, 8, 8)):
    g_agent, g_rlvr, g_rlhf = group_sizes
    classes = {
        "agent": WorkloadClassSpec({"tasks": (_TaskSource(), 1.0)}, group_size=g_agent),
        "rlvr": WorkloadClassSpec({"arithmetic": (ArithmeticSource(levels=(1, 2)), 2.0),
                                   "arith-hard": (ArithmeticSource(levels=(5,), name="arith-hard"), 1.0)},
                                  group_size=g_rlvr),
        "rlhf": WorkloadClassSpec({"instructions": (InstructionSource(), 1.0)}, group_size=g_rlhf),
    }
    return MixtureSampler(DEFAULT_RHO, classes, seed=seed, run_id="t")


def test_released_mixture_stays_within_one_group_of_rho():
    s = make_sampler()
    rho = normalize_mixture(DEFAULT_RHO)
    for _ in range(300):
        s.next_group(policy_version=0)
        total = sum(s.released_units.values())
        for b, share in rho.items():
            # deficit release: never more than one (largest) group off the exact target
            assert abs(s.released_units[b] - share * total) <= 8 + 1e-9
    assert tv_distance(s.released_mixture(), rho) < 0.005


def test_domains_within_a_class_follow_their_weights():
    s = make_sampler()
    for _ in range(300):
        s.next_group(0)
    doms = s.released_groups_by_domain["rlvr"]
    assert abs(doms["arithmetic"] - 2 * doms["arith-hard"]) <= 2


def test_same_seed_same_units_different_seed_different_prompts():
    a = [u.to_dict() for _ in range(20) for u in make_sampler(seed=1).next_group(0)]
    b = [u.to_dict() for _ in range(20) for u in make_sampler(seed=1).next_group(0)]
    assert a == b
    s1, s2 = make_sampler(seed=1), make_sampler(seed=2)
    p1 = [s1.next_group(0)[0].prompt.prompt_id for _ in range(20)]
    p2 = [s2.next_group(0)[0].prompt.prompt_id for _ in range(20)]
    assert p1 != p2


def test_state_round_trip_gives_the_same_continuation():
    s = make_sampler(seed=3)
    for _ in range(17):
        s.next_group(0)
    state = json.loads(json.dumps(s.state_dict()))  # survives JSON, as in a checkpoint
    expected = [u.to_dict() for _ in range(25) for u in s.next_group(5)]
    r = make_sampler(seed=99)
    r.load_state_dict(state)
    assert [u.to_dict() for _ in range(25) for u in r.next_group(5)] == expected


def test_group_fan_out_shares_prompt_and_labels():
    s = make_sampler(group_sizes=(4, 8, 3))
    seen_classes = set()
    for _ in range(10):
        units = s.next_group(policy_version=7)
        b = units[0].workload_class
        seen_classes.add(b)
        assert len(units) == {"agent": 4, "rlvr": 8, "rlhf": 3}[b]
        assert len({u.group_id for u in units}) == 1
        assert len({u.unit_id for u in units}) == len(units)
        assert all(u.prompt == units[0].prompt and u.policy_version == 7 for u in units)
        assert [u.group_index for u in units] == list(range(len(units)))
        h = units[1].headers()
        assert h == {"X-Session-Id": units[1].session_id, "X-Workload-Class": b,
                     "X-Group-Id": units[1].group_id, "X-Rollout-Unit": units[1].unit_id}
    assert seen_classes == {"agent", "rlvr", "rlhf"}


def test_release_never_splits_a_group_or_exceeds_slots():
    s = make_sampler(group_sizes=(4, 8, 8))
    out = s.release(max_units=13, policy_version=0)
    assert len(out) <= 13
    sizes = {}
    for u in out:
        sizes[u.group_id] = sizes.get(u.group_id, 0) + 1
    assert out and all(n == next(u.group_size for u in out if u.group_id == g)
                       for g, n in sizes.items())
    assert s.release(max_units=3, policy_version=0) == []


def test_unit_round_trips_through_dict():
    u = make_sampler().next_group(2)[0]
    assert RolloutUnit.from_dict(json.loads(json.dumps(u.to_dict()))) == u


def test_class_with_weight_but_no_source_is_an_error():
    with pytest.raises(MixtureError, match="agent"):
        MixtureSampler(DEFAULT_RHO, {"rlvr": WorkloadClassSpec({"a": (ArithmeticSource(), 1)})})


def test_zero_weight_class_is_never_released():
    s = MixtureSampler({"agent": 0, "rlvr": 1},
                       {"rlvr": WorkloadClassSpec({"a": (ArithmeticSource(), 1)}, group_size=2)})
    assert {u.workload_class for _ in range(5) for u in s.next_group(0)} == {"rlvr"}


def test_largest_deficit_breaks_ties_by_larger_share():
    assert largest_deficit({"a": 0.3, "b": 0.7}, {}) == "b"
    assert largest_deficit({"a": 0.5, "b": 0.5}, {"a": 1, "b": 0}) == "b"


# ------------------------------------------------------------------------ ledger


def test_tv_distance_on_hand_worked_mixtures():
    assert tv_distance({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}) == 0.0
    # |0.6-0.4| + |0.4-0.5| + |0-0.1| = 0.4 -> 0.2
    assert tv_distance({"a": 0.6, "b": 0.4}, {"a": 0.4, "b": 0.5, "c": 0.1}) == pytest.approx(0.2)


def test_normalize_rejects_negative_and_all_zero_weights():
    with pytest.raises(MixtureError):
        normalize_mixture({"a": -1, "b": 2})
    with pytest.raises(MixtureError):
        normalize_mixture({"a": 0})
    assert normalize_mixture({"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75}


def test_ledger_counts_backlog_and_consumed_mixture():
    led = MixtureLedger({"agent": 1, "rlvr": 1})
    for i in range(4):
        led.record_released(f"a{i}", "agent")
    for i in range(2):
        led.record_released(f"v{i}", "rlvr")
    led.record_completed("a0")
    led.record_completed("v0")
    led.record_completed("v1")
    led.record_dropped("a1")
    assert led.in_flight() == 2 and led.in_flight("agent") == 2 and led.in_flight("rlvr") == 0
    # Q_b = A_b - N_b: agent 4 - 1, rlvr 2 - 2
    assert led.backlog() == {"agent": 3, "rlvr": 0}
    assert led.consumed_mixture() == pytest.approx({"agent": 1 / 3, "rlvr": 2 / 3})
    assert led.consumed_tv() == pytest.approx(0.5 * (abs(1 / 3 - 0.5) + abs(2 / 3 - 0.5)))
    snap = led.snapshot()
    assert snap["dropped"] == {"agent": 1, "rlvr": 0}


def test_ledger_rejects_double_reports():
    led = MixtureLedger({"rlvr": 1})
    led.record_released("u", "rlvr")
    with pytest.raises(MixtureError):
        led.record_released("u", "rlvr")
    led.record_completed("u")
    with pytest.raises(MixtureError):
        led.record_dropped("u")


def test_ledger_state_round_trip_and_rho_mismatch():
    led = MixtureLedger(DEFAULT_RHO)
    led.record_released("u1", "rlvr")
    led.record_released("u2", "agent")
    led.record_completed("u1")
    state = json.loads(json.dumps(led.state_dict()))
    back = MixtureLedger(DEFAULT_RHO)
    back.load_state_dict(state)
    assert back.snapshot() == led.snapshot()
    with pytest.raises(MixtureError, match="rho"):
        MixtureLedger({"rlvr": 1}).load_state_dict(state)


def test_sampler_feeding_ledger_keeps_consumed_tv_small_when_all_complete():
    s, led = make_sampler(), MixtureLedger(DEFAULT_RHO)
    rng = np.random.default_rng(0)
    pending = []
    for _ in range(200):
        for u in s.next_group(0):
            led.record_released(u.unit_id, u.workload_class)
            pending.append(u.unit_id)
        rng.shuffle(pending)
        while len(pending) > 40:  # completions arrive out of order, 40 stay in flight
            led.record_completed(pending.pop())
    assert led.consumed_tv() < 0.02


def _trainer_recipe() -> dict:
    """The composed default ``trainer`` config, resolved, as plain containers; GSM8K is read
    from the tests' tiny fixture (the real file lies outside the repository)."""
    from omegaconf import OmegaConf

    from common.config import compose
    from tests.conftest import GSM8K_TINY

    return OmegaConf.to_container(compose("train", ["run_dir=runs/test",
                                                    f"trainer.domains.rlvr.gsm8k.path={GSM8K_TINY}"]
                                          ).trainer, resolve=True)


def test_sampler_from_the_trainer_recipe_releases_every_configured_class():
    from rl.sampler import sampler_from_config

    tcfg = _trainer_recipe()
    s = sampler_from_config(tcfg, seed=0, run_id="r",
                            extra_sources={"agent": {"tasks": (_TaskSource(), 1.0)}})
    units = [u for _ in range(30) for u in s.next_group(0)]
    assert {u.workload_class for u in units} == {"agent", "rlvr", "rlhf"}
    weighted = {name for cls in tcfg["domains"].values() for name, d in cls.items()
                if float(d.get("weight", 1.0)) > 0}  # the recipe may switch a domain off
    assert weighted and {u.domain for u in units} >= weighted | {"tasks"}
    tcfg["group_size"].pop("rlhf")
    with pytest.raises(MixtureError, match="rlhf"):
        sampler_from_config(tcfg, seed=0)


def test_trainer_recipe_builds_loss_learner_and_sync_configs():
    from rl.grpo import GRPOError, async_limits, loss_config
    from rl.learner import learner_config
    from rollout.weight_sync import weight_sync_config

    tcfg = _trainer_recipe()
    assert loss_config(tcfg["loss"]).eps_high == 0.28
    assert async_limits(tcfg).max_staleness == 1
    assert learner_config(tcfg).loss.loss_agg == "token_mean"
    assert weight_sync_config(tcfg["weight_sync"], "http://r").router_url == "http://r"
    with pytest.raises(GRPOError, match="eps_hi.*valid"):
        loss_config({"eps_hi": 0.3})
