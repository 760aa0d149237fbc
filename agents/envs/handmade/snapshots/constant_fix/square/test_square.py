from square import perimeter


def test_perimeter():
    assert perimeter(2) == 8


def test_perimeter_of_zero():
    assert perimeter(0) == 0
