"""Generated arithmetic and word problems with graded difficulty (an rlvr domain).

A 135M model gets level 1 right often and level 5 rarely, so a mix of levels gives GRPO
groups with both right and wrong answers (a group whose rewards are all equal has zero
advantage and teaches nothing).

Levels:
    1. one-digit addition or subtraction (``7 + 5``)
    2. two-digit addition or subtraction (``48 - 19``)
    3. a two-digit by one-digit product plus a term (``16 * 7 + 12``)
    4. two-step word problem (buy, spend, share)
    5. three-operation expression with parentheses, or a three-step word problem
"""

from __future__ import annotations

import zlib

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from rl.data.base import DataError, Prompt, user_prompt

MAX_LEVEL = 5
ANSWER_FORMAT = "Give the final answer as a number in \\boxed{}."

_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells")


def _add_or_subtract(rng: np.random.Generator, lo: int, hi: int) -> tuple[str, int]:
    """a + b or a - b (a >= b, so the answer is >= 0) with operands in [lo, hi)."""
    a, b = (int(x) for x in rng.integers(lo, hi, size=2))
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def _level1(rng: np.random.Generator) -> tuple[str, int]:
    return _add_or_subtract(rng, 1, 10)


def _level2(rng: np.random.Generator) -> tuple[str, int]:
    return _add_or_subtract(rng, 10, 100)


def _level3(rng: np.random.Generator) -> tuple[str, int]:
    a, b = int(rng.integers(11, 30)), int(rng.integers(2, 10))
    c = int(rng.integers(1, 50))
    return f"What is {a} * {b} + {c}?", a * b + c


def _level4(rng: np.random.Generator) -> tuple[str, int]:
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    item = _ITEMS[int(rng.integers(len(_ITEMS)))]
    boxes, per_box = int(rng.integers(2, 10)), int(rng.integers(2, 12))
    given = int(rng.integers(1, boxes * per_box))
    text = (f"{name} buys {boxes} boxes of {item} with {per_box} {item} in each box, "
            f"then gives away {given} {item}. How many {item} does {name} have left?")
    return text, boxes * per_box - given


def _level5(rng: np.random.Generator) -> tuple[str, int]:
    if rng.random() < 0.5:
        a, b, c, d = (int(x) for x in rng.integers(2, 20, size=4))
        return f"What is ({a} + {b}) * {c} - {d}?", (a + b) * c - d
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    friends = int(rng.integers(2, 6))
    share = int(rng.integers(2, 9))
    price = int(rng.integers(2, 10))
    kept = int(rng.integers(1, 10))
    total = friends * share + kept
    text = (f"{name} has some cookies. After giving {share} cookies to each of {friends} "
            f"friends, {name} has {kept} cookies left. Each cookie cost ${price}. "
            f"How many dollars did all of {name}'s cookies cost?")
    return text, total * price


_LEVELS: dict[int, Callable[[np.random.Generator], tuple[str, int]]] = {
    1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5}


@dataclass
class ArithmeticSource:
    """Arithmetic/word problems; each draw picks a level from ``levels`` uniformly.

    Args:
        levels: difficulty levels to draw from, each in 1..5.
        name: domain name written into each prompt.

    Raises:
        DataError: a level outside 1..5, or no level at all.
    """

    levels: Sequence[int] = (1, 2, 3, 4, 5)
    name: str = "arithmetic"
    split: str = "train"
    """``train`` never draws a held-out problem (see ``is_heldout_arithmetic``),
    ``heldout`` draws only those (evaluation), ``all`` both."""

    def __post_init__(self) -> None:
        self.levels = tuple(int(x) for x in self.levels)
        bad = [x for x in self.levels if x not in _LEVELS]
        if not self.levels or bad:
            raise DataError(f"arithmetic levels must be a non-empty list of 1..{MAX_LEVEL}, "
                            f"got {list(self.levels)}")
        if self.split not in ("train", "heldout", "all"):
            raise DataError(f"arithmetic split {self.split!r}: choose train, heldout or all")

    def draw(self, rng: np.random.Generator) -> Prompt:
        """One problem; ``reference`` is the integer answer as text."""
        while True:
            level = self.levels[int(rng.integers(len(self.levels)))]
            text, answer = _LEVELS[level](rng)
            key = int(rng.integers(2**62))  # id from the draw, stable for the same rng state
            question = f"{text} {ANSWER_FORMAT}"
            if self.split == "all" or is_heldout_arithmetic(question) == (self.split == "heldout"):
                return Prompt(prompt_id=f"{self.name}/L{level}/{key:016x}", domain=self.name,
                              messages=user_prompt(question), reference=str(answer),
                              metadata={"difficulty": level})


HOLDOUT_BUCKETS = 10


def is_heldout_arithmetic(question: str, holdout_buckets: int = HOLDOUT_BUCKETS) -> bool:
    """True when ``question`` (the prompt's user text) is in the held-out bucket: 1 in
    ``holdout_buckets`` of all problems, by a hash of the text, never drawn for training."""
    return zlib.crc32(question.encode()) % holdout_buckets == 0
