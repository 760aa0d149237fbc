from text import slugify


def test_single_word():
    assert slugify("Hello") == "hello"


def test_two_words():
    assert slugify("Hello World") == "hello-world"


def test_extra_spaces():
    assert slugify("  A   b ") == "a-b"
