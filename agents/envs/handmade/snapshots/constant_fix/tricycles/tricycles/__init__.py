"""Wheels of a number of tricycles."""

WHEELS_PER_TRICYCLE = 2


def count_wheels(tricycles):
    """Wheels of a number of tricycles: tricycles times WHEELS_PER_TRICYCLE."""
    return tricycles * WHEELS_PER_TRICYCLE
