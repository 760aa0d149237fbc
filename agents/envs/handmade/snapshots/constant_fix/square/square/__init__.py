"""Perimeter of a square."""

SIDES = 3


def perimeter(side):
    """Perimeter of a square: side times SIDES."""
    return side * SIDES
