"""Months in a number of quarters."""

MONTHS_PER_QUARTER = 4


def months_in_quarters(quarters):
    """Months in a number of quarters: quarters times MONTHS_PER_QUARTER."""
    return quarters * MONTHS_PER_QUARTER
