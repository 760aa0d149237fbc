"""Routing policies (paper section 4) behind one registry.

Build a policy with ``make_policy(name, params)``; ``POLICY_NAMES`` lists the built-in
names, ``policy_config_fields(name)`` their options and defaults, and
``register_policy(name, factory, config_cls)`` adds an extra policy (the simulator's).
"""

from __future__ import annotations

from router.policies.base import RouterConfigError, UnknownOptionError
from router.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from router.policies.kv_horizon import KvHorizonConfig, KvHorizonPolicy
from router.policies.misa import MisaConfig, MisaPolicy
from router.policies.misa_t import MisaTConfig, MisaTPolicy
from router.policies.registry import (
    canonical_policy_name,
    make_policy,
    policy_config_class,
    policy_config_fields,
    register_policy,
    registered_policy_names,
)
from router.policies.round_robin import RoundRobinConfig, RoundRobinPolicy
from router.policies.session_admission import SessionAdmissionConfig, SessionAdmissionPolicy
from router.policies.vllm_router import VllmRouterConfig, VllmRouterPolicy

POLICY_NAMES: tuple[str, ...] = (
    "round_robin", "vllm_router", "cache_aware", "session_admission", "misa", "misa_t", "kv_horizon",
)
"""The built-in policies (paper section 5.1's four, plus round_robin, the exact-index cache_aware anchor
and the project's own kv_horizon)."""

for _name, _factory, _config in (
    ("round_robin", RoundRobinPolicy, RoundRobinConfig),
    ("vllm_router", VllmRouterPolicy, VllmRouterConfig),
    ("cache_aware", CacheAwarePolicy, CacheAwareConfig),
    ("session_admission", SessionAdmissionPolicy, SessionAdmissionConfig),
    ("misa", MisaPolicy, MisaConfig),
    ("misa_t", MisaTPolicy, MisaTConfig),
    ("kv_horizon", KvHorizonPolicy, KvHorizonConfig),
):
    register_policy(_name, _factory, _config)

__all__ = [
    "POLICY_NAMES",
    "RouterConfigError",
    "UnknownOptionError",
    "canonical_policy_name",
    "make_policy",
    "policy_config_class",
    "policy_config_fields",
    "register_policy",
    "registered_policy_names",
    "CacheAwareConfig",
    "CacheAwarePolicy",
    "KvHorizonConfig",
    "KvHorizonPolicy",
    "MisaConfig",
    "MisaPolicy",
    "MisaTConfig",
    "MisaTPolicy",
    "RoundRobinConfig",
    "RoundRobinPolicy",
    "SessionAdmissionConfig",
    "SessionAdmissionPolicy",
    "VllmRouterConfig",
    "VllmRouterPolicy",
]
