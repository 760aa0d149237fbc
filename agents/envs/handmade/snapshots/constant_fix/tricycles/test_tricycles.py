from tricycles import count_wheels


def test_count_wheels():
    assert count_wheels(4) == 12


def test_count_wheels_of_zero():
    assert count_wheels(0) == 0
