"""``python -m rl.eval``: the whole command against a running (fake) model, wandb offline,
and a user mistake printed as one message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import compose
from rl.eval import run
from tests.conftest import GSM8K_TINY

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


def test_missing_benchmark_file_prints_one_message_and_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rl.eval", f"run_dir={tmp_path}",
         f"eval.benchmarks.gsm8k.path={tmp_path}/nope.jsonl", "eval.benchmarks.humaneval.enabled=false"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "gsm8k" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_non_integer_k_is_a_clear_error():
    from rl.eval import settings_of
    from rl.evaluation import EvalError

    cfg = compose("eval", ["run_dir=runs/test", "eval.ks=[1,x]"])
    with pytest.raises(EvalError, match="integers"):
        settings_of(cfg)


@pytest.mark.parametrize("overrides, expected", [
    ([], False),  # auto on CPU engines: no per-request seeds (vLLM CPU generator bug)
    (["engine=gpu"], True),
    (["eval.request_seeds=true"], True),
    (["engine=gpu", "eval.request_seeds=false"], False),
])
def test_request_seeds_are_off_on_cpu_engines_unless_asked(overrides, expected):
    from rl.eval import settings_of
    from rl.evaluation.base import sample_seed

    settings = settings_of(compose("eval", ["run_dir=runs/test", *overrides]))
    assert settings.request_seeds is expected
    assert settings.sampling()["seed"] == (0 if expected else None)
    assert sample_seed(None, "k") is None and isinstance(sample_seed(0, "k"), int)


def test_bad_request_seeds_value_is_a_clear_error():
    from rl.eval import settings_of
    from rl.evaluation import EvalError

    with pytest.raises(EvalError, match="eval.request_seeds"):
        settings_of(compose("eval", ["run_dir=runs/test", "eval.request_seeds=sometimes"]))


def _eval(*args: str, tmp_path) -> subprocess.CompletedProcess:
    if not any(a.startswith("eval.benchmarks.gsm8k.path=") for a in args):
        args = (*args, f"eval.benchmarks.gsm8k.path={GSM8K_TINY}")  # the real one is outside the repository
    return subprocess.run([sys.executable, "-m", "rl.eval", f"run_dir={tmp_path}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("override,expect", [
    ("eval.router_url=notaurl", "eval.router_url='notaurl' is not an http(s) URL"),
    ("eval.router_url=http://127.0.0.1:{closed}", "no router answers there"),
    ("eval.ks=[1,8]", "eval.ks=[1, 8]: every k must be in 1..n=4"),
    ("eval.n=-2", "eval.n=-2"),
    ("+eval.benchmarks.mmlu.enabled=true", "unknown benchmark(s) ['mmlu']"),
])
def test_bad_eval_values_exit_2_with_one_message_naming_the_key(tmp_path, override, expect):
    args = [override.format(closed=_closed_port())]
    if "router_url" not in override:  # a URL nothing answers at: no case can start engines
        args.append(f"eval.router_url=http://127.0.0.1:{_closed_port()}")
    r = _eval(*args, tmp_path=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expect in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


@pytest.mark.parametrize("override,expect", [
    ("eval.ks=3", "eval.ks=3: must be a list of integers"),
    ("eval.temperature=-1", "eval.temperature=-1.0: must be >= 0"),
    ("eval.top_p=1.5", "eval.top_p=1.5"),
    ("eval.max_tokens=0", "eval.max_tokens=0"),
    ("eval.concurrency=abc", "eval.concurrency='abc': must be an integer"),
    ("eval.request_timeout_s=0", "eval.request_timeout_s=0.0"),
    ("eval.progress=maybe", "eval.progress='maybe': must be true or false"),
    ("eval.benchmarks.gsm8k.limit=-1", "eval.benchmarks.gsm8k.limit=-1: must be >= 1"),
    ("eval.benchmarks.swe.limit=0", "eval.benchmarks.swe.limit=0"),
    ("eval.benchmarks.arithmetic.holdout_buckets=0", "eval.benchmarks.arithmetic.holdout_buckets=0"),
    ("eval.benchmarks.arithmetic.num_problems=-5", "eval.benchmarks.arithmetic.num_problems=-5"),
    ("eval.benchmarks.humaneval.timeout_s=0", "eval.benchmarks.humaneval.timeout_s=0.0: must be > 0"),
    ("eval.benchmarks.humaneval.path=/nope.jsonl", "eval.benchmarks.humaneval.path=/nope.jsonl"),
    ("eval.benchmarks.swe.path=/nope.jsonl", "eval.benchmarks.swe.path"),
    ("eval.benchmarks.swe.snapshots_dir=/nope", "eval.benchmarks.swe.snapshots_dir=/nope: folder"),
    ("eval.benchmarks.swe.grader=docker", "eval.benchmarks.swe.grader='docker'"),
    ("eval.benchmarks.swe.harness.max_workers=0", "eval.benchmarks.swe.harness.max_workers=0"),
    ("eval.tokenizer=/nope/tok", "eval.tokenizer=/nope/tok"),
    ("eval.workload_class.swe=''", "eval.workload_class.swe"),
    ("eval.router_url=ftp://host/x", "not an http(s) URL"),
    ("eval.router_url=http://127.0.0.1:80x", "not a valid URL"),
    ("eval.router_url='http://h:1/?q=1'", "no ?query"),
])
def test_every_eval_value_is_checked_before_anything_starts(override, expect):
    from rl.eval import check_config
    from rl.evaluation import EvalError

    cfg = compose("eval", ["run_dir=runs/test", override])
    with pytest.raises(EvalError) as e:
        check_config(cfg)
    assert expect in str(e.value)


def test_no_benchmark_enabled_is_refused():
    from rl.eval import check_config
    from rl.evaluation import EvalError

    cfg = compose("eval", ["run_dir=runs/test"] + [f"eval.benchmarks.{b}.enabled=false"
                                                  for b in ("swe", "humaneval", "gsm8k", "arithmetic")])
    with pytest.raises(EvalError, match="no benchmark enabled"):
        check_config(cfg)


def test_default_config_passes_the_checks():
    from rl.eval import check_config

    settings = check_config(compose("eval", ["run_dir=runs/test"]))
    assert settings.n == 4 and settings.ks == (1, 2, 4)


def test_router_url_is_normalised():
    from rl.eval import router_url_of

    for url in ("http://127.0.0.1:8100", "http://127.0.0.1:8100/", "http://127.0.0.1:8100/v1/"):
        assert router_url_of(compose("eval", ["run_dir=runs/t", f"eval.router_url={url}"])) == \
            "http://127.0.0.1:8100"


def test_router_check_wants_an_answer_and_the_served_model(fake_model, monkeypatch):
    import httpx

    from rl.eval import check_router
    from rl.evaluation import EvalError

    check_router(fake_model.url, "scripted")
    with pytest.raises(EvalError, match=r"serves \['scripted'\], not 'other'.*eval.served_model_name"):
        check_router(fake_model.url, "other")
    with pytest.raises(EvalError, match="no router answers there"):
        check_router(f"http://127.0.0.1:{_closed_port()}", "scripted")
    monkeypatch.setattr(httpx, "get", lambda *_a, **_k: httpx.Response(
        503, json={"error": {"message": "could not list models: no healthy engine"}}))
    with pytest.raises(EvalError, match="no engine behind it does"):
        check_router("http://router:8100", "scripted")


def test_evaluation_that_scores_nothing_exits_1_after_writing_its_report(fake_model, tmp_path):
    from common.config import RunFailedError, user_error_exit_code

    gsm = tmp_path / "test.jsonl"
    gsm.write_text(json.dumps({"question": "FAIL_500 2 + 3?", "answer": "#### 5"}) + "\n")
    out = tmp_path / "out"
    cfg = compose("eval", [
        f"run_dir={tmp_path}", f"eval.out_dir={out}", f"eval.router_url={fake_model.url}",
        "eval.served_model_name=scripted", "eval.n=1", "eval.ks=[1]", "eval.progress=false",
        f"eval.benchmarks.gsm8k.path={gsm}", "eval.benchmarks.humaneval.enabled=false",
        "eval.benchmarks.arithmetic.enabled=false", "eval.benchmarks.swe.enabled=false"])
    with pytest.raises(RunFailedError, match="no problem could be scored") as e:
        run(cfg)
    assert user_error_exit_code(e.value) == 1  # a failure at run time, not a mistake in the command
    assert json.loads((out / "report.json").read_text())["benchmarks"]["gsm8k"]["num_errors"] == 1


@pytest.mark.parametrize("override, expect", [
    ("seed=abc", "seed='abc' is invalid: give a whole number >= 0"),
    ("seed=-3", "seed=-3 is invalid: give a whole number >= 0"),
    ("eval.seed=-3", "eval.seed=-3: must be >= 0"),
])
def test_a_bad_seed_is_refused_before_anything_starts(override, expect):
    from rl.eval import check_config

    cfg = compose("eval", ["run_dir=runs/test", override])
    with pytest.raises(ValueError) as e:  # ConfigError or EvalError: both exit 2
        check_config(cfg)
    assert str(e.value).startswith(expect)
