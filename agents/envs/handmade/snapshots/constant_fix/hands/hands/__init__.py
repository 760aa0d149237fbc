"""Fingers on a number of hands."""

FINGERS_PER_HAND = 4


def count_fingers(hands):
    """Fingers on a number of hands: hands times FINGERS_PER_HAND."""
    return hands * FINGERS_PER_HAND
