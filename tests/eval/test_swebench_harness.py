"""The official SWE-bench harness as grader: which grader is chosen, the harness command,
its run report read back into per-sample results (hand-written reports in the harness's
format), and SWE episodes graded through it end to end with the harness replaced by a
fake that writes those reports. Docker itself is never run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import rl.evaluation.swebench_harness as harness
from agents.chat import ByteTokenizer
from agents.loop import EpisodeConfig, EpisodeLimits
from agents.server import HANDMADE_TASKS
from rl.evaluation import EvalError, EvalSettings, SweBenchmark, evaluate
from rl.evaluation.base import ERROR, FAIL, PASS, UNGRADED, SampleResult
from rl.evaluation.results import ResultsLog
from rl.evaluation.swebench_harness import (HarnessSettings, choose_grader, harness_command,
                                            harness_unavailable, read_harness_report)

# ----------------------------------------------------------------------------- choosing


def _never():
    raise AssertionError("availability must not be checked for grader=local")


def test_local_is_local_without_looking_for_the_harness():
    assert choose_grader("local", _never).grader == "local"


def test_auto_uses_the_harness_when_it_can_run_and_says_so():
    choice = choose_grader("auto", lambda: "")
    assert choice.grader == "swebench" and "auto" in choice.describe()
    assert "official swebench harness" in choice.describe()


def test_auto_falls_back_to_local_and_says_why():
    choice = choose_grader("auto", lambda: "no working Docker (`docker info` failed: no daemon)")
    assert choice.grader == "local"
    assert "local sandbox" in choice.describe() and "no working Docker" in choice.describe()


def test_swebench_asked_for_where_it_cannot_run_is_a_clear_error():
    with pytest.raises(EvalError, match=r"grader=swebench.*not installed.*grader=local"):
        choose_grader("swebench", lambda: "the swebench package is not installed")
    assert choose_grader("swebench", lambda: "").grader == "swebench"


def test_unknown_grader_is_refused_with_the_valid_ones():
    with pytest.raises(EvalError, match="auto, local, swebench"):
        choose_grader("docker", lambda: "")


def test_harness_unavailable_without_the_package(monkeypatch):
    monkeypatch.setattr(harness.importlib.util, "find_spec", lambda name: None)
    assert "swebench package is not installed" in harness_unavailable(HANDMADE_TASKS, HarnessSettings())


def test_harness_unavailable_without_a_working_docker(monkeypatch):
    monkeypatch.setattr(harness.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(harness, "docker_works", lambda: (False, "`docker info` failed: no daemon"))
    assert "no working Docker" in harness_unavailable(HANDMADE_TASKS, HarnessSettings())


def test_harness_unavailable_for_instances_it_does_not_know(monkeypatch):
    monkeypatch.setattr(harness.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(harness, "docker_works", lambda: (True, ""))
    monkeypatch.setattr(harness, "unknown_to_harness", lambda rows: [r["instance_id"] for r in rows])
    why = harness_unavailable(HANDMADE_TASKS, HarnessSettings())
    assert "not SWE-bench instances" in why and "handmade__" in why
    # with a dataset of its own the harness reads the instances itself
    assert harness_unavailable(HANDMADE_TASKS, HarnessSettings(dataset_name="SWE-bench/SWE-bench_Lite")) == ""


def test_docker_missing_or_failing_is_reported(monkeypatch):
    def missing(*_a, **_k):
        raise FileNotFoundError("docker")

    monkeypatch.setattr(harness.subprocess, "run", missing)
    assert harness.docker_works() == (False, "no docker command")
    monkeypatch.setattr(harness.subprocess, "run", lambda *_a, **_k: subprocess.CompletedProcess(
        ["docker", "info"], 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"))
    works, why = harness.docker_works()
    assert not works and "Cannot connect to the Docker daemon" in why


def test_harness_command_is_the_official_entry_point(tmp_path):
    cmd = harness_command(tmp_path / "p.jsonl", "SWE-bench/SWE-bench_Lite", "eval-x.sample0",
                          ["a__a-1", "b__b-2"], HarnessSettings(max_workers=2, timeout_s=900, python="py"))
    assert cmd[:3] == ["py", "-m", "swebench.harness.run_evaluation"]
    args = dict(zip(cmd[3:-3:2], cmd[4:-3:2]))
    assert args == {"--dataset_name": "SWE-bench/SWE-bench_Lite", "--split": "test",
                    "--predictions_path": str(tmp_path / "p.jsonl"), "--run_id": "eval-x.sample0",
                    "--max_workers": "2", "--timeout": "900"}
    assert cmd[-3:] == ["--instance_ids", "a__a-1", "b__b-2"]

# ------------------------------------------------------------------------ its reports


def write_harness_reports(workdir: Path, model: str, run_id: str, resolved=(), unresolved=(),
                          empty=(), errors=(), apply_failed=()) -> None:
    """What ``swebench.harness.run_evaluation`` leaves in its working folder: the run report
    ``<model>.<run_id>.json`` (schema_version 2) and per instance
    ``logs/run_evaluation/<run_id>/<model>/<id>/report.json`` or ``run_instance.log``."""
    errors = list(errors) + list(apply_failed)
    completed = list(resolved) + list(unresolved)
    submitted = completed + list(empty) + errors
    summary = {
        "total_instances": len(submitted), "submitted_instances": len(submitted),
        "completed_instances": len(completed), "resolved_instances": len(resolved),
        "unresolved_instances": len(unresolved), "empty_patch_instances": len(empty),
        "error_instances": len(errors), "completed_ids": sorted(completed), "incomplete_ids": [],
        "empty_patch_ids": sorted(empty), "submitted_ids": sorted(submitted),
        "resolved_ids": sorted(resolved), "unresolved_ids": sorted(unresolved),
        "error_ids": sorted(errors), "schema_version": 2}
    (workdir / f"{model.replace('/', '__')}.{run_id}.json").write_text(json.dumps(summary, indent=4))
    logs = workdir / "logs" / "run_evaluation" / run_id / model.replace("/", "__")
    for iid in completed:
        ok = iid in resolved
        (logs / iid).mkdir(parents=True, exist_ok=True)
        (logs / iid / "report.json").write_text(json.dumps({iid: {
            "patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True,
            "resolved": ok, "tests_status": {
                "FAIL_TO_PASS": {"success": ["t::f2p"] if ok else [], "failure": [] if ok else ["t::f2p"]},
                "PASS_TO_PASS": {"success": ["t::p2p"], "failure": []},
                "FAIL_TO_FAIL": {"success": [], "failure": []},
                "PASS_TO_FAIL": {"success": [], "failure": []}}}}, indent=4))
    for iid in errors:
        (logs / iid).mkdir(parents=True, exist_ok=True)
        text = (">>>>> Patch Apply Failed:\nerror: patch failed: a.py:3\n" if iid in apply_failed
                else "BuildImageError: Error building image sweb.eval.x86_64.x:latest\n")
        (logs / iid / "run_instance.log").write_text(text)


def _pending(*iids: str, j: int = 0) -> list[SampleResult]:
    return [SampleResult("swe", iid, j, UNGRADED, answer=f"diff for {iid}", detail={"turns": 3})
            for iid in iids]


def test_harness_report_is_read_into_per_sample_outcomes(tmp_path):
    write_harness_reports(tmp_path, "org/model", "r.sample0", resolved=["ok__1"], unresolved=["no__2"],
                          empty=["empty__3"], errors=["env__4"], apply_failed=["apply__5"])
    out = {r.problem_id: r for r in read_harness_report(
        tmp_path, "org/model", "r.sample0",
        _pending("ok__1", "no__2", "empty__3", "env__4", "apply__5", "lost__6"))}
    assert {k: r.outcome for k, r in out.items()} == {
        "ok__1": PASS, "no__2": FAIL, "empty__3": FAIL, "env__4": ERROR, "apply__5": FAIL,
        "lost__6": ERROR}
    assert out["ok__1"].detail["tests_status"]["FAIL_TO_PASS"]["success"] == ["t::f2p"]
    assert all(r.detail["grader"] == "swebench" and r.detail["turns"] == 3 for r in out.values())
    assert out["ok__1"].answer == "diff for ok__1"
    assert "env__4" in out["env__4"].error and "run_instance.log" in out["env__4"].error
    assert "could not apply" in out["apply__5"].detail["patch_error"]
    assert "no result" in out["lost__6"].error


def test_missing_harness_report_makes_every_sample_an_error(tmp_path):
    out = read_harness_report(tmp_path, "m", "r.sample0", _pending("a__1", "b__2"),
                              harness_log=tmp_path / "harness.log")
    assert [r.outcome for r in out] == [ERROR, ERROR]
    assert "wrote no report" in out[0].error and "harness.log" in out[0].error


def test_ungraded_samples_are_never_counted_and_are_replaced_by_their_grade(tmp_path):
    from rl.evaluation.base import EvalProblem
    from rl.evaluation.results import summarize_problems

    with ResultsLog(tmp_path / "s.jsonl", replace_errors=True) as log:
        log.append(_pending("a__1")[0])
        assert log.has("swe", "a__1", 0)  # drawn: not drawn again
        [s] = summarize_problems([EvalProblem("a__1")], log.results, "swe", 1)
        assert s.is_error and "not graded yet" in s.errors[0]
        log.append(SampleResult("swe", "a__1", 0, PASS, "diff"))
        log.append(SampleResult("swe", "a__1", 0, FAIL, "diff"))  # a final result stays
    with ResultsLog(tmp_path / "s.jsonl") as log:
        assert log.results["swe/a__1#0"].outcome == PASS

# ------------------------------------------------------------------ end to end (fake)


@pytest.fixture
def fake_harness(monkeypatch):
    """``run_harness`` replaced: resolves every prediction except those of ``unresolved``."""
    state = {"calls": [], "unresolved": set(), "rc": 0}

    async def run(preds, dataset_name, run_id, instance_ids, workdir, settings):
        state["calls"].append({"run_id": run_id, "dataset_name": dataset_name, "ids": instance_ids,
                               "preds": [json.loads(x) for x in preds.read_text().splitlines()]})
        if state["rc"] == 0:
            model = state["calls"][-1]["preds"][0]["model_name_or_path"]
            write_harness_reports(workdir, model, run_id,
                                  resolved=[i for i in instance_ids if i not in state["unresolved"]],
                                  unresolved=[i for i in instance_ids if i in state["unresolved"]])
        log_file = workdir / f"harness.{run_id}.log"
        log_file.write_text("fake harness\n")
        return state["rc"], log_file

    monkeypatch.setattr(harness, "run_harness", run)
    return state


def _swe_bench(grader: str) -> SweBenchmark:
    # byte tokens: the prompt alone is ~3000 tokens, a str_replace call ~300
    episode = EpisodeConfig(limits=EpisodeLimits(max_context_tokens=65536, max_tokens_per_turn=2048))
    return SweBenchmark(str(HANDMADE_TASKS), ByteTokenizer(), episode, grader=grader)


def test_swe_episodes_graded_by_the_official_harness(fake_model, fake_harness, tmp_path):
    fake_harness["unresolved"] = {"handmade__stats_mean"}
    settings = EvalSettings(n=2, ks=(1, 2), run_id="eval-t")
    report = evaluate([_swe_bench("swebench")], fake_model.url, "scripted", settings, tmp_path,
                      progress=False)["swe"]
    assert [c["run_id"] for c in fake_harness["calls"]] == ["eval-t.sample0", "eval-t.sample1"]
    call = fake_harness["calls"][0]
    assert call["dataset_name"] == str(HANDMADE_TASKS)
    assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in call["preds"])
    assert all("+++ b/" in p["model_patch"] for p in call["preds"])
    assert report["grader"] == "swebench" and report["graded_by"] == {"swebench": 4}
    assert report["num_scored"] == 2 and report["num_errors"] == 0
    scores = {p["problem_id"]: p["c"] for p in report["problems"]}
    assert scores["handmade__stats_mean"] == 0 and sum(scores.values()) == 2
    # the log holds each sample drawn (ungraded) then graded; a rerun neither draws nor grades
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [x["outcome"] for x in lines].count(UNGRADED) == 4 and len(lines) == 8
    requests = len(fake_model.scripted.requests)
    again = evaluate([_swe_bench("swebench")], fake_model.url, "scripted", settings, tmp_path,
                     progress=False)["swe"]
    assert len(fake_model.scripted.requests) == requests and len(fake_harness["calls"]) == 2
    assert again["metrics"] == report["metrics"]


def test_harness_failure_is_an_error_and_a_rerun_without_it_grades_locally(fake_model, fake_harness,
                                                                           tmp_path):
    fake_harness["rc"] = 1
    settings = EvalSettings(n=1, run_id="eval-t", retry_errors=False)
    report = evaluate([_swe_bench("swebench")], fake_model.url, "scripted", settings, tmp_path,
                      progress=False)["swe"]
    assert report["num_errors"] == 2 and report["metrics"] == {}
    assert "exited with code 1" in report["problems"][0]["errors"][0]
    # a run killed between drawing and grading: the drawn patches are graded by the grader
    # of the next run (here the local sandbox), not drawn again
    samples = tmp_path / "samples.jsonl"
    drawn = [x for x in samples.read_text().splitlines() if json.loads(x)["outcome"] == UNGRADED]
    samples.write_text("\n".join(drawn) + "\n")
    requests = len(fake_model.scripted.requests)
    local = evaluate([_swe_bench("local")], fake_model.url, "scripted", settings, tmp_path,
                     progress=False)["swe"]
    assert len(fake_model.scripted.requests) == requests
    assert local["num_scored"] == 2 and local["metrics"]["pass@1"]["mean"] == 1.0
    assert local["graded_by"] == {"local": 2}


def test_a_grader_that_crashes_makes_its_samples_errors_not_the_run_stop(fake_model, monkeypatch,
                                                                         tmp_path):
    async def crash(*_a, **_k):
        raise OSError("cannot start the harness")

    monkeypatch.setattr(harness, "run_harness", crash)
    report = evaluate([_swe_bench("swebench")], fake_model.url, "scripted", EvalSettings(n=1),
                      tmp_path, progress=False)["swe"]
    assert report["num_errors"] == 2
    assert "grading failed: OSError: cannot start the harness" in report["problems"][0]["errors"][0]
