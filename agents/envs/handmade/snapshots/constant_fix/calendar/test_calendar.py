from calendar import days_in_weeks


def test_days_in_weeks():
    assert days_in_weeks(3) == 21


def test_days_in_weeks_of_zero():
    assert days_in_weeks(0) == 0
