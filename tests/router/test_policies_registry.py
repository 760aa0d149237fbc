"""The policy registry: names, options, errors; round_robin's cycling."""

from __future__ import annotations

from dataclasses import dataclass

import json

import pytest

from router.policies import (
    POLICY_NAMES,
    RouterConfigError,
    make_policy,
    policy_config_fields,
    register_policy,
    registered_policy_names,
)
from router.policies.base import Admit, ClusterView, Hold, InstanceView, Request


def _view(*healthy: bool) -> ClusterView:
    return ClusterView(tuple(InstanceView(f"w{i}", healthy=h) for i, h in enumerate(healthy)))


def _req(i: int) -> Request:
    return Request(request_id=f"r{i}", session_id=f"s{i}")


def test_every_builtin_name_builds_with_defaults_and_hyphens() -> None:
    for name in POLICY_NAMES:
        assert make_policy(name).name == name
        assert make_policy(name.replace("_", "-")).name == name


def test_unknown_policy_name_lists_valid_names() -> None:
    with pytest.raises(RouterConfigError) as exc:
        make_policy("fastest")
    assert "round_robin" in str(exc.value)


def test_unknown_option_lists_valid_keys() -> None:
    with pytest.raises(RouterConfigError) as exc:
        make_policy("round_robin", {"bogus": 1})
    assert "bogus" in str(exc.value) and "no_healthy_recheck_s" in str(exc.value)


def test_ill_typed_option_is_rejected() -> None:
    with pytest.raises(RouterConfigError, match="must be a number"):
        make_policy("round_robin", {"no_healthy_recheck_s": "soon"})
    with pytest.raises(RouterConfigError, match="> 0"):
        make_policy("round_robin", {"no_healthy_recheck_s": 0})


def test_int_is_accepted_for_float_option() -> None:
    policy = make_policy("round_robin", {"no_healthy_recheck_s": 2})
    assert policy.decide(_req(0), _view(False), now=0.0) == Hold(2.0, reason="no healthy instance")


def test_policy_config_fields_gives_defaults() -> None:
    assert policy_config_fields("round-robin") == {"no_healthy_recheck_s": 1.0}


def test_register_policy_adds_an_extra_policy() -> None:
    @dataclass(frozen=True)
    class EchoConfig:
        target: str = "w0"

    class Echo:
        name = "echo_test"

        def __init__(self, config: EchoConfig) -> None:
            self.config = config

    register_policy("echo-test", Echo, EchoConfig)
    assert "echo_test" in registered_policy_names()
    assert make_policy("echo_test", {"target": "w1"}).config.target == "w1"
    with pytest.raises(RouterConfigError, match="already registered"):
        register_policy("echo_test", object, EchoConfig)


def test_round_robin_cycles_over_healthy_instances_only() -> None:
    policy = make_policy("round_robin")
    view = _view(True, False, True)
    got = [policy.decide(_req(i), view, now=float(i)) for i in range(4)]
    assert got == [Admit("w0", "round_robin"), Admit("w2", "round_robin")] * 2


def test_round_robin_holds_when_nothing_is_healthy() -> None:
    policy = make_policy("round_robin")
    assert isinstance(policy.decide(_req(0), _view(False, False), now=0.0), Hold)
    assert policy.state()["holds"] == 1


def test_omegaconf_params_and_nested_class_priors_are_checked() -> None:
    from omegaconf import OmegaConf

    policy = make_policy("misa-t", OmegaConf.create({"class_k_prior_blocks": {"agent": 512}, "placement": "cost"}))
    assert policy.config.class_k_prior_blocks == {"agent": 512.0} and policy.config.placement == "cost"
    with pytest.raises(RouterConfigError, match="must be a number"):
        make_policy("misa", {"class_k_prior_blocks": {"agent": "big"}})
    with pytest.raises(RouterConfigError, match="'cache_aware', 'cost'"):
        make_policy("misa", {"placement": "best"})


def test_every_policy_state_is_json_serialisable_after_decisions() -> None:
    from router.policies.base import InstanceMetrics, MetricsSampled, RequestStarted

    metrics = InstanceMetrics(num_blocks=50, block_size=16)
    view = ClusterView(tuple(InstanceView(f"w{i}", metrics=metrics, metrics_age_s=0.0) for i in range(2)))
    for name in POLICY_NAMES:
        policy = make_policy(name)
        policy.observe(MetricsSampled("w0", metrics, 0.0))
        for i in range(12):
            r = Request(f"r{i}", f"s{i}", workload_class=("agent", "rlvr")[i % 2], prompt_tokens=100)
            decision = policy.decide(r, view, float(i))
            if isinstance(decision, Admit):
                policy.observe(RequestStarted(r, decision.instance, float(i)))
        state = json.loads(json.dumps(policy.state()))
        assert state["policy"] == name and state["admits"] + state["holds"] == 12


def test_a_simulator_anchor_asked_of_a_live_router_says_where_it_runs(monkeypatch):
    """Without ``router.sim`` imported (a live router) its anchors are not registered: the
    error says they run in the simulator."""
    from router.policies import registry

    monkeypatch.delitem(registry._REGISTRY, "progress_ttl", raising=False)
    with pytest.raises(RouterConfigError) as e:
        make_policy("progress-ttl")
    assert "unknown router policy 'progress-ttl' (progress_ttl is one of the simulator's anchors" in str(e.value)
    assert "python -m router.sim runs it" in str(e.value)
    with pytest.raises(RouterConfigError) as e:
        make_policy("nope")
    assert "simulator" not in str(e.value)
