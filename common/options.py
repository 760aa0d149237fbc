"""One mechanism that builds an options dataclass from a recipe section.

Every part's config dataclass (a router policy's ``MisaTConfig``, the agent server's
``EpisodeLimits``, the trainer's ``GRPOLossConfig`` / ``LearnerConfig``, the rollout side's
``WeightSyncConfig``, the simulator's ``ClusterSpec``) is built by :func:`build_options`:
an unknown key is refused with the valid keys listed, a value is checked against its
field's annotation (ints are accepted for floats), and the dataclass's own
``__post_init__`` checks the rest. Each part passes its own exception type, so the entry
point prints the message as that part's user error.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, Literal


def build_options(config_cls: type, params: Mapping[str, Any] | None, where: str,
                  error: type[Exception] = ValueError, unknown_error: type[Exception] | None = None,
                  not_options: Collection[str] = ()) -> Any:
    """Instantiate dataclass ``config_cls`` from ``params``, checking keys and types.

    Args:
        config_cls: the options dataclass; keys of ``params`` are its ``init`` fields.
        params: option values (a plain mapping; None = all defaults).
        where: the section's name in messages (``trainer.loss``, ``router policy 'misa_t'``).
        error: the part's exception type for a bad value.
        unknown_error: the type for an unknown key (default: ``error``).
        not_options: fields another part sets (not keys of ``params``): refused as unknown
            and left out of the list of valid options.

    Raises:
        unknown_error: an unknown key (the message lists the valid keys).
        error: a value whose type does not match the field's annotation, or that the
            dataclass's own validation rejects with a ``TypeError`` / ``ValueError``
            (one of type ``error`` passes through unchanged).
    """
    params = dict(params or {})
    hints = typing.get_type_hints(config_cls)
    names = [f.name for f in dataclasses.fields(config_cls) if f.init and f.name not in not_options]
    unknown = sorted(set(params) - set(names))
    if unknown:
        guesses = {u: difflib.get_close_matches(u, names, n=1) for u in unknown}
        if len(unknown) == 1:
            guess = f" (did you mean {guesses[unknown[0]][0]!r}?)" if guesses[unknown[0]] else ""
        else:
            guess = "".join(f" (did you mean {g[0]!r} for {u!r}?)" for u, g in guesses.items() if g)
        raise (unknown_error or error)(
            f"{where}: unknown option(s) {', '.join(map(repr, unknown))}{guess}; valid options: {', '.join(names)}"
        )
    values = {key: _coerce(value, hints[key], f"{where}: option {key!r}", error) for key, value in params.items()}
    try:
        return config_cls(**values)
    except error:
        raise
    except (TypeError, ValueError) as exc:
        raise error(f"{where}: {exc}") from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str, error: type[Exception]) -> Any:
    """Check ``value`` against annotation ``tp``; ints are accepted for floats, lists for
    tuples. A type this function does not know (a list, a nested dataclass, ``Path``) is
    left to the dataclass's own validation."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _coerce(value, arg, where, error)
            except error:
                continue
        raise error(f"{where} must be {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise error(f"{where} must be None, got {value!r}")
    if origin is Literal:
        if value in args:
            return value
        raise error(f"{where} must be one of {', '.join(map(repr, args))}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise error(f"{where} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise error(f"{where} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise error(f"{where} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise error(f"{where} must be a string, got {value!r}")
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise error(f"{where} must be a mapping, got {value!r}")
        if not args:
            return dict(value)
        return {_coerce(k, args[0], f"{where} key", error): _coerce(v, args[1], f"{where}[{k!r}]", error)
                for k, v in value.items()}
    if origin is tuple:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise error(f"{where} must be a list, got {value!r}")
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, f"{where} item", error) for v in value)
    return value
