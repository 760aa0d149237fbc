"""SWE-style grading (the resolved rule in the sandbox), task loading and bad
tasks, and SWE episodes through the evaluation with a scripted model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.chat import ByteTokenizer
from agents.envs.task import load_tasks, task_problem
from agents.loop import EpisodeConfig, EpisodeLimits
from agents.server import HANDMADE_TASKS
from rl.evaluation import EvalError, EvalSettings, SweBenchmark, evaluate
from rl.evaluation.swe import grade_patch, load_task_problems, task_of

HANDMADE = load_tasks(HANDMADE_TASKS)


def test_handmade_tasks_carry_a_gold_patch():
    assert HANDMADE and all(t.patch.strip() for t in HANDMADE.values())


@pytest.mark.parametrize("iid", sorted(HANDMADE))
async def test_gold_patch_is_resolved(iid):
    resolved, detail = await grade_patch(HANDMADE[iid], HANDMADE[iid].patch)
    assert resolved
    assert all(v == "passed" for v in detail["test_outcomes"].values())


@pytest.mark.parametrize("patch", ["", "\n  \n"])
async def test_empty_patch_is_reported_as_empty_patch(patch):
    # As the SWE-bench harness (its empty_patch_ids): not resolved, no test run.
    resolved, detail = await grade_patch(HANDMADE["handmade__stats_mean"], patch)
    assert not resolved
    assert detail == {"empty_patch": True}


async def test_patch_without_final_newline_is_normalised_and_applies():
    task = HANDMADE["handmade__stats_mean"]
    resolved, detail = await grade_patch(task, task.patch.rstrip("\n"))
    assert resolved, detail


async def test_patch_git_apply_takes_is_applied_by_git_apply_first():
    task = HANDMADE["handmade__stats_mean"]
    resolved, detail = await grade_patch(task, task.patch)
    assert resolved and detail["patch_applied_with"] == "git apply --verbose"


async def test_patch_with_context_off_is_applied_by_patch_fuzz_as_the_harness_does():
    # git apply refuses a context line that differs ("def mean(values):"); the SWE-bench
    # harness then tries git apply --reject, then patch --fuzz=5, which applies it.
    task = HANDMADE["handmade__stats_mean"]
    fuzzy = task.patch.replace(" def mean(xs):", " def mean(values):")
    assert fuzzy != task.patch
    resolved, detail = await grade_patch(task, fuzzy)
    assert resolved, detail
    assert detail["patch_applied_with"] == "patch --batch --fuzz=5 -p1"


async def test_patch_that_does_not_apply_is_not_resolved_and_says_why():
    task = HANDMADE["handmade__stats_mean"]
    bad = task.patch.replace("total(xs) / (len(xs) + 1)", "something else entirely")
    resolved, detail = await grade_patch(task, bad)
    assert not resolved and "does not apply" in detail["patch_error"]


def _row(iid: str, **changes) -> dict:
    row = HANDMADE["handmade__stats_mean"].to_dict()
    row.update(instance_id=iid, **changes)
    return row


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_bad_lines_become_errors_named_after_their_instance(tmp_path):
    rows = [_row("ok__1"), "{not json", _row("nosnap__2", snapshot=str(tmp_path / "missing")),
            {k: v for k, v in _row("nofield__3").items() if k != "FAIL_TO_PASS"}, _row("ok__1")]
    problems = load_task_problems(_write(tmp_path / "i.jsonl", rows))
    errors = {p.problem_id: p.error for p in problems}
    assert errors["ok__1"] == ""
    assert "not JSON" in errors["i.jsonl:2"]
    assert "nosnap__2" in errors["nosnap__2"] and "does not exist" in errors["nosnap__2"]
    assert "'FAIL_TO_PASS' is missing" in errors["nofield__3"]
    assert "repeated" in errors["ok__1@5"]


def test_swebench_rows_with_string_lists_and_snapshots_dir_are_accepted(tmp_path):
    snap = Path(HANDMADE["handmade__stats_mean"].snapshot)
    (tmp_path / "snaps").mkdir()
    (tmp_path / "snaps" / "repo__1").symlink_to(snap)
    row = {k: v for k, v in _row("repo__1").items() if k != "snapshot"}
    row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])
    row["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
    [p] = load_task_problems(_write(tmp_path / "i.jsonl", [row]), snapshots_dir=tmp_path / "snaps")
    assert p.error == ""
    assert task_of(p).FAIL_TO_PASS == ("test_stats.py::test_mean",)


def test_missing_instances_file_is_an_eval_error(tmp_path):
    with pytest.raises(EvalError, match="does not exist"):
        load_task_problems(tmp_path / "nope.jsonl")


async def test_instance_whose_tests_do_not_run_is_reported():
    task = task_of(load_task_problems(HANDMADE_TASKS)[0])
    broken = type(task)(**{**task.__dict__, "PASS_TO_PASS": ("test_stats.py::test_gone",)})
    msg = await task_problem(broken)
    assert task.instance_id in msg and "tests do not run" in msg and "test_gone" in msg
    assert await task_problem(task) == ""


async def test_instance_already_passing_is_reported():
    task = HANDMADE["handmade__stats_mean"]
    solved = type(task)(**{**task.__dict__, "FAIL_TO_PASS": task.PASS_TO_PASS})
    assert "already passes" in await task_problem(solved)


def test_swe_episodes_are_graded_and_written_as_swebench_predictions(fake_model, tmp_path):
    rows = [_row(t.instance_id, snapshot=t.snapshot, problem_statement=t.problem_statement,
                 FAIL_TO_PASS=list(t.FAIL_TO_PASS), PASS_TO_PASS=list(t.PASS_TO_PASS),
                 patch=t.patch) for t in HANDMADE.values()]
    rows.append(_row("broken__tests", PASS_TO_PASS=["test_stats.py::test_gone"]))
    # byte tokens: the prompt alone is ~3000 tokens, a str_replace call ~300
    episode = EpisodeConfig(limits=EpisodeLimits(max_context_tokens=65536, max_tokens_per_turn=2048))
    bench = SweBenchmark(str(_write(tmp_path / "i.jsonl", rows)), ByteTokenizer(), episode)
    report = evaluate([bench], fake_model.url, "scripted", EvalSettings(n=2, ks=(1, 2)),
                      tmp_path / "out", progress=False)["swe"]
    assert report["num_scored"] == 2 and report["num_errors"] == 1
    assert report["metrics"]["pass@1"]["mean"] == 1.0  # the scripted policy applies the gold fix
    [broken] = [p for p in report["problems"] if p["status"] == "error"]
    assert broken["problem_id"] == "broken__tests" and "tests do not run" in broken["errors"][0]
    for j in (0, 1):
        lines = [json.loads(x) for x in (tmp_path / "out" / f"swe_predictions.sample{j}.jsonl")
                 .read_text().splitlines()]
        assert sorted(x["instance_id"] for x in lines) == sorted(HANDMADE)
        assert all(set(x) == {"instance_id", "model_name_or_path", "model_patch"} for x in lines)
        assert all(x["model_name_or_path"] == "scripted" and "+++ b/" in x["model_patch"]
                   for x in lines)
    # the episodes' model calls went through the router with agent session headers
    heads = [h for h, _ in fake_model.scripted.requests]
    assert all(h["X-Workload-Class"] == "agent" for h in heads)
    assert len({h["X-Session-Id"] for h in heads}) == 4  # 2 tasks x 2 samples


def test_prompt_that_does_not_fit_the_context_is_an_error_not_a_fail(fake_model, tmp_path):
    bench = SweBenchmark(str(HANDMADE_TASKS), ByteTokenizer(), limit=1)  # 2048-token context
    report = evaluate([bench], fake_model.url, "scripted", EvalSettings(n=1), tmp_path,
                      progress=False)["swe"]
    assert report["num_errors"] == 1 and report["metrics"] == {}
    assert "max_context_tokens=2048" in report["problems"][0]["errors"][0]
