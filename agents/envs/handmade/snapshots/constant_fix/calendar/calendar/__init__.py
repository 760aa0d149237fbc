"""Days in a number of weeks."""

DAYS_PER_WEEK = 5


def days_in_weeks(weeks):
    """Days in a number of weeks: weeks times DAYS_PER_WEEK."""
    return weeks * DAYS_PER_WEEK
