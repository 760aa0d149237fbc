"""Python function problems checked by unit tests (the second rlvr domain).

This module does not run code itself: the reward takes a ``run_tests`` callable
(``run_tests(program, tests) -> bool``, True when every test passes) that the caller
builds from the sandbox (``sandbox/``), so no untrusted completion ever runs in the
trainer's process. The problems are small enough for a 135M model to solve some.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from rl.data.base import DataError, Prompt, user_prompt

RunTests = Callable[[str, str], bool]
"""``run_tests(program_source, test_source) -> True`` iff all tests pass (sandboxed)."""


@dataclass(frozen=True)
class CodeProblem:
    """One problem: write ``signature`` so that ``tests`` (assert lines) pass."""

    name: str
    signature: str
    description: str
    tests: str


CODE_PROBLEMS: tuple[CodeProblem, ...] = (
    CodeProblem("add", "def add(a, b):", "Return the sum of a and b.",
                "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(0, 0) == 0"),
    CodeProblem("is_even", "def is_even(n):", "Return True if the integer n is even, else False.",
                "assert is_even(4) is True\nassert is_even(7) is False\nassert is_even(0) is True"),
    CodeProblem("maximum", "def maximum(xs):", "Return the largest number in the non-empty list xs.",
                "assert maximum([1, 5, 3]) == 5\nassert maximum([-4, -2]) == -2\nassert maximum([7]) == 7"),
    CodeProblem("reverse_string", "def reverse_string(s):", "Return the string s reversed.",
                "assert reverse_string('abc') == 'cba'\nassert reverse_string('') == ''"),
    CodeProblem("count_vowels", "def count_vowels(s):",
                "Return how many characters of s are vowels (a, e, i, o, u; lower or upper case).",
                "assert count_vowels('hello') == 2\nassert count_vowels('AEIOU') == 5\n"
                "assert count_vowels('xyz') == 0"),
    CodeProblem("factorial", "def factorial(n):", "Return n! for an integer n >= 0.",
                "assert factorial(0) == 1\nassert factorial(5) == 120\nassert factorial(1) == 1"),
    CodeProblem("fizzbuzz", "def fizzbuzz(n):",
                "Return 'Fizz' if n is divisible by 3, 'Buzz' if by 5, 'FizzBuzz' if by both, "
                "else str(n).",
                "assert fizzbuzz(3) == 'Fizz'\nassert fizzbuzz(10) == 'Buzz'\n"
                "assert fizzbuzz(15) == 'FizzBuzz'\nassert fizzbuzz(7) == '7'"),
    CodeProblem("sum_list", "def sum_list(xs):", "Return the sum of the numbers in list xs (0 if empty).",
                "assert sum_list([1, 2, 3]) == 6\nassert sum_list([]) == 0"),
    CodeProblem("is_palindrome", "def is_palindrome(s):",
                "Return True if the string s reads the same forwards and backwards.",
                "assert is_palindrome('racecar') is True\nassert is_palindrome('ab') is False\n"
                "assert is_palindrome('') is True"),
    CodeProblem("square_all", "def square_all(xs):", "Return a new list with every number of xs squared.",
                "assert square_all([1, 2, 3]) == [1, 4, 9]\nassert square_all([]) == []"),
    CodeProblem("count_words", "def count_words(s):",
                "Return the number of words in s, where words are separated by whitespace.",
                "assert count_words('a b  c') == 3\nassert count_words('') == 0"),
    CodeProblem("gcd", "def gcd(a, b):", "Return the greatest common divisor of positive integers a and b.",
                "assert gcd(12, 18) == 6\nassert gcd(7, 5) == 1\nassert gcd(9, 9) == 9"),
)

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_program(completion: str) -> str:
    """The program in a completion: the last fenced code block, else the whole text."""
    blocks = _FENCE.findall(completion)
    return blocks[-1].strip() if blocks else completion.strip()


@dataclass
class CodeSource:
    """Code problems drawn uniformly from ``problems``; ``reference`` holds the tests."""

    problems: Sequence[CodeProblem] = CODE_PROBLEMS
    name: str = "code"

    def __post_init__(self) -> None:
        if not self.problems:
            raise DataError("the code domain needs at least one problem")

    def draw(self, rng: np.random.Generator) -> Prompt:
        """One problem as a prompt asking for a fenced Python function."""
        p = self.problems[int(rng.integers(len(self.problems)))]
        text = (f"Write a Python function `{p.signature}`. {p.description}\n"
                "Answer with the complete function in one ```python code block.")
        return Prompt(prompt_id=f"{self.name}/{p.name}", domain=self.name,
                      messages=user_prompt(text), reference=p.tests,
                      metadata={"entry_point": p.name})


@dataclass
class CodeTestsReward:
    """Reward 1.0 when the completion's program passes the problem's tests, else 0.0.

    Args:
        run_tests: ``run_tests(program, tests) -> bool``, run in the sandbox.
    """

    run_tests: RunTests

    def __call__(self, prompt: Prompt, completion: str) -> float:
        """Score one completion for ``prompt`` (a ``CodeSource`` prompt).

        Raises:
            DataError: the prompt carries no tests.
        """
        if not prompt.reference:
            raise DataError(f"prompt {prompt.prompt_id} has no tests to run")
        program = extract_program(completion)
        if not program:
            return 0.0
        return 1.0 if self.run_tests(program, prompt.reference) else 0.0
