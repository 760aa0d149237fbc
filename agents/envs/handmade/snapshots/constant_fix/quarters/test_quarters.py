from quarters import months_in_quarters


def test_months_in_quarters():
    assert months_in_quarters(2) == 6


def test_months_in_quarters_of_zero():
    assert months_in_quarters(0) == 0
