from dice import count_faces


def test_count_faces():
    assert count_faces(2) == 12


def test_count_faces_of_zero():
    assert count_faces(0) == 0
