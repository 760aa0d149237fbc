"""``python -m rl.eval eval.predictions=FILE``: a predictions file graded without a model;
bad lines are counted in the results, a bad file is one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agents.envs.task import load_tasks
from agents.server import HANDMADE_TASKS

REPO = Path(__file__).resolve().parents[2]
GOLD = {iid: t.patch for iid, t in load_tasks(HANDMADE_TASKS).items()}


def _grade(tmp_path: Path, predictions: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rl.eval", f"run_dir={tmp_path}", f"eval.out_dir={tmp_path}/out",
         f"eval.predictions={predictions}", "eval.benchmarks.swe.grader=local",
         "eval.benchmarks.swe.validate=false", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600)


def test_predictions_file_is_graded_without_a_model_and_bad_lines_are_counted(tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join([
        json.dumps({"instance_id": "handmade__stats_mean", "model_name_or_path": "m",
                    "model_patch": GOLD["handmade__stats_mean"]}),
        "{not json",
        json.dumps({"model_patch": "diff"}),
        json.dumps({"instance_id": "nope__unknown", "model_patch": "diff"}),
        json.dumps({"instance_id": "handmade__text_slug", "model_name_or_path": "m"}),
    ]) + "\n")
    r = _grade(tmp_path, preds)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    swe = report["benchmarks"]["swe"]
    assert report["model"] == "m"
    assert (swe["num_problems"], swe["num_scored"], swe["num_errors"]) == (2, 1, 1)
    assert swe["metrics"]["pass@1"]["mean"] == 1.0
    assert swe["graded_by"] == {"local": 1}
    errors = swe["prediction_errors"]
    assert [e.split(":")[1] for e in errors] == ["2", "3", "4"]
    assert "not JSON" in errors[0] and "no instance_id" in errors[1] and "nope__unknown" in errors[2]
    slug = next(p for p in swe["problems"] if p["problem_id"] == "handmade__text_slug")
    assert "model_patch is missing" in slug["errors"][0]
    assert "not graded: preds.jsonl:2: not JSON" in r.stdout
    for name in ("samples.jsonl", "report.md", "swe_predictions.sample0.jsonl"):
        assert (tmp_path / "out" / name).is_file(), name


def test_missing_predictions_file_is_one_error_line(tmp_path):
    r = _grade(tmp_path, tmp_path / "nope.jsonl")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: eval.predictions=") and "does not exist" in lines[0]


def test_predictions_file_without_a_gradable_line_fails_with_one_message(tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("[1, 2]\n" + json.dumps({"instance_id": "nope", "model_patch": ""}) + "\n")
    r = _grade(tmp_path, preds)
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: no prediction in ")
