"""Legs of a number of spiders."""

LEGS_PER_SPIDER = 6


def count_legs(spiders):
    """Legs of a number of spiders: spiders times LEGS_PER_SPIDER."""
    return spiders * LEGS_PER_SPIDER
