"""The simulator's one exception type."""

from __future__ import annotations


class SimError(ValueError):
    """A simulator input (config, trace, profile) is invalid; the message says what and how to fix it.

    ``python -m router.sim`` catches it and prints the message without a traceback.
    """
