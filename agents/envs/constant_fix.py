"""Constant-fix tasks: the easiest agent level, one wrong digit in a tiny package.

A small model (SmolLM2-135M) solves none of the bug-injected project tasks
(``agents.envs.build``) nor the two hand-made ones, so every agent group of the default run
had reward 0 and carried no gradient. These tasks give it a chance: each package has one
module-level constant with a wrong one-digit value; the fix is one token. The grading is
the SWE-bench rule, as for every task (``agents.envs.task.evaluate``: FAIL_TO_PASS and
PASS_TO_PASS tests run in the episode's sandbox), so a reward of 1 means the tests pass.

Graded by how much the problem statement gives away (``LEVELS``):

1. the file, the line, the old and the new text, and the exact ``str_replace`` tool call
   to make (the model has to copy it). The call shown is the shortest exact one
   (``old_str`` ``= 3``, which occurs once in the file): with the full constant line it
   was 60-77 tokens of SmolLM2's tokenizer, more than the default recipe's 64-token turn,
   so a model that copied it was cut off; now it is 54-57;
2. the file, the line, the old and the new text (the model writes the tool call);
3. the file, the line and the constant's name, and what the function returns against what
   it should (the model works out the value).

All levels of one package share its snapshot. The committed set under
``agents/envs/handmade`` (``constant_fix_l<level>.jsonl``) is this module's output;
regenerate it with ``python -m agents.envs.constant_fix`` (a test checks it is current).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agents.envs.task import DEFAULT_TEST_CMD, Task, write_tasks
from agents.toolcall import format_tool_call
from common.config import CommandParser
from sandbox import unified_diff

LEVELS = (1, 2, 3)
"""Difficulty levels, easiest first (module docstring)."""

CONSTANT_LINE = 3
"""Line of the constant in every package's ``__init__.py`` (after the docstring and a blank)."""


@dataclass(frozen=True)
class ConstantBug:
    """One package whose constant ``name`` is ``wrong`` where it must be ``right``.

    Attributes:
        package: package folder (also the task's short name).
        doc: the module's docstring.
        name: the constant (``UPPER_CASE``).
        wrong, right: one-digit values (the fix changes one token).
        function: the function using it, ``function(arg) = arg * name``.
        arg: the function's argument name.
        example: the argument of the failing test; ``function(example)`` should be
            ``example * right``.
    """

    package: str
    doc: str
    name: str
    wrong: int
    right: int
    function: str
    arg: str
    example: int

    @property
    def path(self) -> str:
        return f"{self.package}/__init__.py"

    def module(self, value: int) -> str:
        return (f'"""{self.doc}"""\n\n{self.name} = {value}\n\n\n'
                f"def {self.function}({self.arg}):\n"
                f'    """{self.doc.rstrip(".")}: {self.arg} times {self.name}."""\n'
                f"    return {self.arg} * {self.name}\n")

    def tests(self) -> str:
        f = self.function
        return (f"from {self.package} import {f}\n\n\n"
                f"def test_{f}():\n    assert {f}({self.example}) == {self.example * self.right}\n\n\n"
                f"def test_{f}_of_zero():\n    assert {f}(0) == 0\n")


BUGS = (
    ConstantBug("shipping", "Shipping cost of a parcel in dollars.", "RATE_PER_KG", 3, 5,
                "shipping_cost", "weight_kg", 2),
    ConstantBug("square", "Perimeter of a square.", "SIDES", 3, 4, "perimeter", "side", 2),
    ConstantBug("calendar", "Days in a number of weeks.", "DAYS_PER_WEEK", 5, 7,
                "days_in_weeks", "weeks", 3),
    ConstantBug("spiders", "Legs of a number of spiders.", "LEGS_PER_SPIDER", 6, 8,
                "count_legs", "spiders", 2),
    ConstantBug("dice", "Faces of a number of dice.", "FACES_PER_DIE", 4, 6, "count_faces",
                "dice", 2),
    ConstantBug("tricycles", "Wheels of a number of tricycles.", "WHEELS_PER_TRICYCLE", 2, 3,
                "count_wheels", "tricycles", 4),
    ConstantBug("hands", "Fingers on a number of hands.", "FINGERS_PER_HAND", 4, 5,
                "count_fingers", "hands", 3),
    ConstantBug("quarters", "Months in a number of quarters.", "MONTHS_PER_QUARTER", 4, 3,
                "months_in_quarters", "quarters", 2),
)
"""The packages, one task per package and level."""


def fix_call(bug: ConstantBug) -> str:
    """The shortest ``str_replace`` tool call that fixes ``bug`` (shown at level 1, in the
    agent server's default Hermes format): ``= <wrong>`` occurs once in the module (the
    docstrings have no digits)."""
    return format_tool_call("str_replace", {"path": bug.path, "old_str": f"= {bug.wrong}",
                                            "new_str": f"= {bug.right}"})


def problem_statement(bug: ConstantBug, level: int) -> str:
    """The issue text of ``bug`` at ``level`` (module docstring).

    Raises:
        ValueError: ``level`` is not in ``LEVELS``.
    """
    got, want = bug.example * bug.wrong, bug.example * bug.right
    where = f"Line {CONSTANT_LINE} of {bug.path}"
    symptom = f"{bug.function}({bug.example}) returns {got} but must return {want}."
    if level == 3:
        return (f"{symptom} {where} sets the constant {bug.name} to a wrong value. "
                f"Change that one number so that {bug.function}({bug.example}) == {want}.")
    edit = (f"{symptom} {where} reads `{bug.name} = {bug.wrong}`; the value must be "
            f"{bug.right}. Change that line to `{bug.name} = {bug.right}`.")
    if level == 2:
        return edit
    if level == 1:
        return f"{edit} Make exactly this tool call:\n{fix_call(bug)}"
    raise ValueError(f"constant-fix level {level}: choose one of {', '.join(map(str, LEVELS))}")


def build_constant_fix(out_dir: Path, bugs: tuple[ConstantBug, ...] = BUGS) -> list[Path]:
    """Write the task files ``constant_fix_l<level>.jsonl`` and the shared snapshots
    ``snapshots/constant_fix/<package>/`` into ``out_dir``; returns the task files.

    Deterministic: the same ``bugs`` give byte-identical files.
    """
    out_dir = Path(out_dir)
    snaps = out_dir / "snapshots" / "constant_fix"
    shutil.rmtree(snaps, ignore_errors=True)
    gold: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="constant-fix-") as tmp:
        for bug in bugs:
            for root, value in ((snaps / bug.package, bug.wrong), (Path(tmp) / bug.package, bug.right)):
                (root / bug.package).mkdir(parents=True)
                (root / bug.path).write_text(bug.module(value))
                (root / f"test_{bug.package}.py").write_text(bug.tests())
            gold[bug.package] = unified_diff(snaps / bug.package, Path(tmp) / bug.package)
    paths = []
    for level in LEVELS:
        tasks = [Task(
            instance_id=f"constant_fix__L{level}__{bug.package}", repo="constant_fix",
            base_commit="v1", snapshot=str(snaps / bug.package),
            problem_statement=problem_statement(bug, level),
            FAIL_TO_PASS=(f"test_{bug.package}.py::test_{bug.function}",),
            PASS_TO_PASS=(f"test_{bug.package}.py::test_{bug.function}_of_zero",),
            test_cmd=DEFAULT_TEST_CMD, patch=gold[bug.package],
            metadata={"level": level, "path": bug.path, "line": CONSTANT_LINE,
                      "constant": bug.name, "wrong": bug.wrong, "right": bug.right})
            for bug in bugs]
        paths.append(out_dir / f"constant_fix_l{level}.jsonl")
        write_tasks(tasks, paths[-1])
    return paths


def main() -> None:
    """``python -m agents.envs.constant_fix [--out DIR]``: (re)write the committed set."""
    ap = CommandParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "handmade",
                    help="folder for the task files and snapshots (default: the committed set)")
    args = ap.parse_args()
    if args.out.exists() and not args.out.is_dir():
        print(f"error: --out {args.out} is not a folder; give a folder.", file=sys.stderr)
        sys.exit(2)
    for p in build_constant_fix(args.out):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
