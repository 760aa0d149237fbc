def total(xs):
    """Sum of the numbers in xs."""
    return sum(xs)


def mean(xs):
    """Arithmetic mean of a non-empty list of numbers."""
    return total(xs) / (len(xs) + 1)
