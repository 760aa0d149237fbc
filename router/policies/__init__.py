"""Routing policies (paper section 4) behind one registry.

Build a policy with ``make_policy(name, params)``; ``POLICY_NAMES`` lists the built-in
names, ``policy_config_fields(name)`` their options and defaults, and
``register_policy(name, factory, config_cls)`` adds an extra policy (the simulator's).
"""

from __future__ import annotations

from router.policies.base import RouterConfigError
from router.policies.registry import (
    build_config,
    canonical_policy_name,
    make_policy,
    policy_config_class,
    policy_config_fields,
    register_policy,
    registered_policy_names,
)
from router.policies.round_robin import RoundRobinConfig, RoundRobinPolicy

register_policy("round_robin", RoundRobinPolicy, RoundRobinConfig)

POLICY_NAMES: tuple[str, ...] = ("round_robin",)
"""The built-in policies (more are added as they land: cache_aware, session_admission, misa, misa_t)."""

__all__ = [
    "POLICY_NAMES",
    "RouterConfigError",
    "build_config",
    "canonical_policy_name",
    "make_policy",
    "policy_config_class",
    "policy_config_fields",
    "register_policy",
    "registered_policy_names",
    "RoundRobinConfig",
    "RoundRobinPolicy",
]
