from hands import count_fingers


def test_count_fingers():
    assert count_fingers(3) == 15


def test_count_fingers_of_zero():
    assert count_fingers(0) == 0
