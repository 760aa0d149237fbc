"""The policy registry: policy names -> (factory, config dataclass), and config parsing.

Every routing policy has a name (``misa_t``), a config dataclass whose fields all have
defaults (``MisaTConfig``), and a factory ``factory(config) -> Policy``. The live router
and the simulator build policies only through :func:`make_policy`, so a name or an option
is checked in one place: an unknown name, an unknown key or a value of the wrong type
raises :class:`RouterConfigError` whose message lists what is valid.

Hyphenated spellings (``misa-t``, ``cache-aware``) are accepted everywhere a name is.
Extra policies (the simulator's ``aimd``, ``tool_pause`` and ``progress_ttl``) register themselves with
:func:`register_policy` without editing this package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from common.config import register_user_error
from common.options import build_options
from router.policies.base import Policy, RouterConfigError, UnknownOptionError

PolicyFactory = Callable[[Any], Policy]
"""``factory(config) -> Policy``; ``config`` is an instance of the registered dataclass."""

_REGISTRY: dict[str, tuple[PolicyFactory, type]] = {}


def canonical_policy_name(name: str) -> str:
    """``"misa-t"`` -> ``"misa_t"``: names are stored with underscores, lower case."""
    return str(name).strip().lower().replace("-", "_")


def register_policy(name: str, factory: PolicyFactory, config_cls: type) -> None:
    """Make policy ``name`` buildable by :func:`make_policy`.

    Args:
        name: the policy's name; hyphens are turned into underscores.
        factory: ``factory(config) -> Policy``.
        config_cls: a dataclass whose fields all have defaults (the policy's options).

    Raises:
        RouterConfigError: ``config_cls`` is not a dataclass, a field lacks a default,
            or ``name`` is already registered with a different factory.
    """
    key = canonical_policy_name(name)
    if not dataclasses.is_dataclass(config_cls) or not isinstance(config_cls, type):
        raise RouterConfigError(f"policy {key!r}: config_cls must be a dataclass type, got {config_cls!r}")
    for f in dataclasses.fields(config_cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RouterConfigError(
                f"policy {key!r}: config field {f.name!r} of {config_cls.__name__} needs a default"
            )
    if key in _REGISTRY and _REGISTRY[key] != (factory, config_cls):
        raise RouterConfigError(f"policy {key!r} is already registered; choose another name")
    _REGISTRY[key] = (factory, config_cls)


def registered_policy_names() -> tuple[str, ...]:
    """All names :func:`make_policy` accepts now (built-in and registered), sorted."""
    return tuple(sorted(_REGISTRY))


SIMULATOR_POLICIES = ("aimd", "tool_pause", "progress_ttl", "misa_t_oracle")
"""The anchors ``router.sim`` registers when imported: a live router does not have them."""


def _lookup(name: str) -> tuple[PolicyFactory, type]:
    key = canonical_policy_name(name)
    if key not in _REGISTRY:
        where = (f" ({key} is one of the simulator's anchors, {', '.join(SIMULATOR_POLICIES)}: "
                 "python -m router.sim runs it)" if key in SIMULATOR_POLICIES else "")
        raise UnknownOptionError(
            f"unknown router policy {name!r}{where}; choose one of: {', '.join(registered_policy_names())}"
        )
    return _REGISTRY[key]


def policy_config_class(name: str) -> type:
    """The config dataclass of policy ``name``. Raises RouterConfigError if unknown."""
    return _lookup(name)[1]


# Config fields the transport sets, one knob for the transport and the policy: never given in
# ``router.params`` (refused, naming the transport's key), passed to make_policy by keyword.
TRANSPORT_OPTIONS = {"long_hold_s": "server.long_hold_s"}
DEFAULT_LONG_HOLD_S = 30.0
"""Holds longer than this are long holds (``server.long_hold_s``; the policy's
``state()["long_holds"]`` and the live router's ``router_long_holds_total``)."""


def policy_config_fields(name: str) -> dict[str, Any]:
    """``{field: default}`` of policy ``name``'s config, in declaration order.

    Used by the service to write Hydra yaml defaults and by the simulator to sweep
    parameters. Mutable defaults (dicts) are returned as fresh copies.

    Raises:
        RouterConfigError: unknown policy name.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(policy_config_class(name)):
        if f.name not in TRANSPORT_OPTIONS:
            out[f.name] = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return out


def make_policy(name: str, params: Mapping[str, Any] | None = None, *,
                long_hold_s: float = DEFAULT_LONG_HOLD_S) -> Policy:
    """Build policy ``name`` with options ``params`` (missing keys take their defaults).

    Args:
        name: one of :func:`registered_policy_names` (hyphens allowed).
        params: option values; a plain dict or an OmegaConf DictConfig.
        long_hold_s: seconds; the transport's long-hold threshold (``server.long_hold_s``),
            given to a policy that reports long holds (session_admission, misa, misa_t).

    Raises:
        UnknownOptionError: unknown name or key (a key of ``TRANSPORT_OPTIONS``: the
            transport's key to give instead); the message names the valid choices.
        RouterConfigError: ill-typed value, or a value the config's own validation rejects.
    """
    factory, config_cls = _lookup(name)
    for key, transport_key in TRANSPORT_OPTIONS.items():
        if params is not None and key in params:
            raise UnknownOptionError(
                f"router.params.{key} is no policy option any more: the router service's {transport_key} sets it "
                f"for the policy and /metrics alike; give {transport_key}=... instead")
    config = build_options(config_cls, params, f"router policy {canonical_policy_name(name)!r}",
                           error=RouterConfigError, unknown_error=UnknownOptionError,
                           not_options=TRANSPORT_OPTIONS)
    if any(f.name == "long_hold_s" for f in dataclasses.fields(config)):
        if not long_hold_s > 0:
            raise RouterConfigError(f"server.long_hold_s must be > 0, got {long_hold_s!r}")
        config = dataclasses.replace(config, long_hold_s=float(long_hold_s))
    return factory(config)


def router_params_help(cfg: Any) -> str:
    """What ``router.params`` takes in the composed config ``cfg``: the policy's options
    (``common.config`` adds it to the message for an unknown key there)."""
    impl, policy = cfg.router.get("impl"), cfg.router.get("policy")
    if impl != "ours" or policy is None:
        keys = ", ".join(str(k) for k in cfg.router if k not in ("impl", "policy", "params"))
        return f"Router impl {impl!r} takes no policy options; its settings are the keys under 'router': {keys}."
    try:
        return f"Valid options of policy {policy!r}: {', '.join(policy_config_fields(policy))}."
    except RouterConfigError as exc:
        return str(exc)


# Entry points that build a router (python -m router, rl.train, rollout.serve, ...) print
# these as one line and exit 2, like an unknown config key.
register_user_error(RouterConfigError)
register_user_error(UnknownOptionError)
