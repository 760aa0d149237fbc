"""The simulator's one exception type."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from router.policies.base import RouterConfigError, UnknownOptionError


class SimError(ValueError):
    """A simulator input (config, trace, profile) is invalid; the message says what and how to fix it.

    ``python -m router.sim`` catches it and prints the message without a traceback.
    """


class SimUnknownNameError(SimError):
    """A name that does not exist (an experiment, a model or hardware profile, a policy or
    policy option); the message lists the valid ones.

    ``python -m router.sim`` exits with status 2 for it, as for an unknown config key, and
    with status 1 for other SimErrors (bad values).
    """


@contextmanager
def as_sim_errors() -> Iterator[None]:
    """Re-raise the option checks' RouterConfigError as SimError (SimUnknownNameError for
    an unknown name), so the command reports it like its own."""
    try:
        yield
    except UnknownOptionError as exc:
        raise SimUnknownNameError(str(exc)) from None
    except RouterConfigError as exc:
        raise SimError(str(exc)) from None
