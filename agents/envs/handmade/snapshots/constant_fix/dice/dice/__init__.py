"""Faces of a number of dice."""

FACES_PER_DIE = 4


def count_faces(dice):
    """Faces of a number of dice: dice times FACES_PER_DIE."""
    return dice * FACES_PER_DIE
