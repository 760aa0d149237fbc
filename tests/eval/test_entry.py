"""``python -m rl.eval``: the whole command against a running (fake) model, wandb offline,
and a user mistake printed as one message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl.config import compose
from rl.eval import run

REPO = Path(__file__).resolve().parents[2]


def test_eval_command_runs_all_benchmarks_against_a_running_router(fake_model, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    fake_model.answers = lambda text, _s: "\\boxed{5}"
    gsm = tmp_path / "gsm8k"
    gsm.mkdir()
    (gsm / "test.jsonl").write_text(json.dumps({"question": "2 + 3?", "answer": "#### 5"}) + "\n")
    out = tmp_path / "out"
    cfg = compose("eval", [
        f"run_dir={tmp_path}", f"eval.out_dir={out}", f"eval.router_url={fake_model.url}",
        "eval.served_model_name=scripted", "eval.tokenizer=byte", "eval.n=2", "eval.ks=[1,2]",
        "eval.progress=false", "eval.wandb.run=eval-test",
        f"eval.benchmarks.gsm8k.path={gsm}", "eval.benchmarks.humaneval.limit=1",
        "eval.benchmarks.arithmetic.num_problems=2", "eval.benchmarks.swe.limit=1",
        "eval.agent.episode.limits.max_context_tokens=65536",
        "eval.agent.episode.limits.max_tokens_per_turn=2048"])
    report = run(cfg)
    assert set(report) == {"humaneval", "gsm8k", "arithmetic", "swe"}
    assert report["gsm8k"]["metrics"]["pass@1"]["mean"] == 1.0
    assert report["swe"]["metrics"]["pass@2"]["mean"] == 1.0
    assert report["humaneval"]["metrics"]["pass@1"]["mean"] == 0.0  # "\boxed{5}" is no program
    assert all(r["num_errors"] == 0 for r in report.values())
    for name in ("report.json", "report.md", "passk.png", "samples.jsonl", "config.yaml",
                 "swe_predictions.sample0.jsonl", "swe_predictions.sample1.jsonl"):
        assert (out / name).is_file(), name
    printed = capsys.readouterr().out
    assert "| gsm8k | 1 | 1 | 0 | 2 |" in printed
    assert f"--predictions_path {out}/swe_predictions.sample0.jsonl" in printed
    assert os.environ["WANDB_MODE"] == "offline"
    assert list(out.glob("wandb/offline-run-*"))


def test_missing_benchmark_file_prints_one_message_and_exits_1(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rl.eval", f"run_dir={tmp_path}",
         f"eval.benchmarks.gsm8k.path={tmp_path}/nope.jsonl", "eval.benchmarks.humaneval.enabled=false"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "gsm8k" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_non_integer_k_is_a_clear_error():
    from rl.eval import settings_of
    from rl.evaluation import EvalError

    cfg = compose("eval", ["run_dir=runs/test", "eval.ks=[1,x]"])
    with pytest.raises(EvalError, match="integers"):
        settings_of(cfg)
