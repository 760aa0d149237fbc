from spiders import count_legs


def test_count_legs():
    assert count_legs(2) == 16


def test_count_legs_of_zero():
    assert count_legs(0) == 0
