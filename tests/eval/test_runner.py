"""``evaluate`` end to end against a fake model: figures, resumability, errors, outputs;
and the math benchmarks' inputs."""

from __future__ import annotations

import json

import pytest

from rl.data.base import Prompt, user_prompt
from rl.evaluation import EvalError, EvalSettings, arithmetic_heldout_benchmark, evaluate, gsm8k_benchmark
from rl.evaluation.math_answers import MathBenchmark, is_heldout_arithmetic

SETTINGS = EvalSettings(n=4, ks=(1, 2), concurrency=4)


def _bench(extra: tuple[Prompt, ...] = ()) -> MathBenchmark:
    prompts = [Prompt("always", "math", user_prompt("ALWAYS: what is 2 + 2?"), "4"),
               Prompt("never", "math", user_prompt("NEVER: what is 3 + 3?"), "6"),
               Prompt("half", "math", user_prompt("HALF: what is 4 + 4?"), "8"), *extra]
    return MathBenchmark("toy", prompts)


def _policy(text: str, session: str) -> str:
    """Right always / never / on even sample indices (the session id ends with #<i>)."""
    right = {"ALWAYS": "4", "NEVER": None, "HALF": "8"}[text.split(":")[0].split()[-1]]
    if right is None or (text.startswith("HALF") and int(session.rsplit("#", 1)[1]) % 2):
        return "I think it is \\boxed{1}."
    return f"So the answer is \\boxed{{{right}}}."


def test_pass_at_k_from_graded_samples(fake_model, tmp_path):
    fake_model.answers = _policy
    report = evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path, progress=False)["toy"]
    m = report["metrics"]
    assert report["num_scored"] == 3 and report["num_errors"] == 0
    assert m["pass@1"]["mean"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert m["pass@2"]["mean"] == pytest.approx((1 + 0 + (1 - 1 / 6)) / 3)  # 1 - C(2,2)/C(4,2)
    assert m["pass^2"]["mean"] == pytest.approx((1 + 0 + 1 / 6) / 3)        # C(2,2)/C(4,2)
    assert {p["problem_id"]: p["c"] for p in report["problems"]} == {"always": 4, "never": 0, "half": 2}
    heads = [r["headers"] for r in fake_model.chat_requests]
    assert len(heads) == 12 and all(h["X-Workload-Class"] == "rlvr" for h in heads)
    assert all(h["X-Session-End"] == "1" for h in heads)
    assert len({h["X-Session-Id"] for h in heads}) == 12


def test_rerun_on_the_same_results_draws_nothing_and_counts_once(fake_model, tmp_path):
    fake_model.answers = _policy
    first = evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path, progress=False)
    second = evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path, progress=False)
    assert len(fake_model.chat_requests) == 12
    assert second["toy"]["metrics"] == first["toy"]["metrics"]
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 12


def test_killed_run_continues_with_the_missing_samples_only(fake_model, tmp_path):
    fake_model.answers = _policy
    full = evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path / "a", progress=False)
    # a run killed after 5 samples, in the middle of writing the 6th line
    lines = (tmp_path / "a" / "samples.jsonl").read_text().splitlines()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "settings.json").write_text((tmp_path / "a" / "settings.json").read_text())
    (tmp_path / "b" / "samples.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:40])
    fake_model.chat_requests.clear()
    resumed = evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path / "b", progress=False)
    assert len(fake_model.chat_requests) == 7
    assert resumed["toy"]["metrics"] == full["toy"]["metrics"]
    keys = [json.loads(x)["key"] for x in (tmp_path / "b" / "samples.jsonl").read_text().splitlines()
            if x.strip().endswith("}")]
    assert len(keys) == len(set(keys)) == 12


def test_failing_problem_is_an_error_not_a_fail_and_is_retried_later(fake_model, tmp_path):
    fake_model.answers = lambda text, s: "\\boxed{5}" if "FAIL_500" in text else _policy(text, s)
    broken = Prompt("crashes", "math", user_prompt("ALWAYS: FAIL_500 what is 1 + 4?"), "5")
    report = evaluate([_bench((broken,))], fake_model.url, "fake", SETTINGS, tmp_path,
                      progress=False)["toy"]
    assert report["num_scored"] == 3 and report["num_errors"] == 1
    assert report["metrics"]["pass@1"]["mean"] == pytest.approx(0.5)  # the 3 others only
    [err] = [p for p in report["problems"] if p["status"] == "error"]
    assert err["problem_id"] == "crashes" and "HTTP 500" in err["errors"][0]
    table = (tmp_path / "report.md").read_text()
    assert "| toy | 4 | 3 | 1 | 4 |" in table and "toy crashes: sample" in table
    fake_model.fail_500 = False
    again = evaluate([_bench((broken,))], fake_model.url, "fake", SETTINGS, tmp_path,
                     progress=False)["toy"]
    assert again["num_errors"] == 0 and again["metrics"]["pass@1"]["mean"] == pytest.approx(2.5 / 4)


def test_outputs_hold_every_problem_and_a_plot(fake_model, tmp_path):
    fake_model.answers = _policy
    evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path, progress=False)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model"] == "fake" and report["settings"]["n"] == 4
    assert [p["problem_id"] for p in report["benchmarks"]["toy"]["problems"]] == ["always", "never", "half"]
    assert (tmp_path / "passk.png").stat().st_size > 1000
    assert "pass@1" in (tmp_path / "report.md").read_text()


def test_results_folder_of_other_settings_is_refused(fake_model, tmp_path):
    evaluate([_bench()], fake_model.url, "fake", SETTINGS, tmp_path, progress=False)
    hotter = EvalSettings(n=4, ks=(1,), temperature=0.2)
    with pytest.raises(EvalError, match="temperature"):
        evaluate([_bench()], fake_model.url, "fake", hotter, tmp_path, progress=False)


@pytest.mark.parametrize("n,ks", [(2, (1, 3)), (1, ()), (0, (1,))])
def test_k_outside_1_to_n_is_refused(n, ks):
    with pytest.raises(EvalError, match="eval.n|eval.ks"):
        EvalSettings(n=n, ks=ks)


def test_gsm8k_reads_a_folder_and_a_bad_line_is_an_error_problem_not_a_stop(tmp_path):
    good = {"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = 5\n#### 5"}
    (tmp_path / "test.jsonl").write_text(json.dumps(good) + "\n")
    [p] = gsm8k_benchmark(tmp_path).prompts
    assert p.reference == "5" and "\\boxed" in p.messages[-1]["content"]
    (tmp_path / "test.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"question": "x"}) + "\n")
    bench = gsm8k_benchmark(tmp_path)
    assert [p.prompt_id for p in bench.prompts] == ["gsm8k/test/0"]
    [bad] = bench.broken
    assert bad.problem_id == "gsm8k/test/1" and ":2:" in bad.error
    with pytest.raises(EvalError, match="does not exist"):
        gsm8k_benchmark(tmp_path / "missing")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(EvalError, match="no records"):
        gsm8k_benchmark(tmp_path / "empty.jsonl")


def test_malformed_gsm8k_line_is_counted_as_an_error_while_the_rest_run(fake_model, tmp_path):
    good = {"question": "What is 2 + 3?", "answer": "#### 5"}
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n" + json.dumps(good) + "\n")
    fake_model.answers = lambda _text, _s: "\\boxed{5}"
    report = evaluate([gsm8k_benchmark(path)], fake_model.url, "fake", EvalSettings(n=1), tmp_path / "out",
                      progress=False)["gsm8k"]
    assert report["num_scored"] == 2 and report["num_errors"] == 1
    assert report["metrics"]["pass@1"]["mean"] == 1.0
    [err] = [p for p in report["problems"] if p["status"] == "error"]
    assert err["problem_id"] == "gsm8k/test/1" and "test.jsonl:2" in err["errors"][0]
    assert len(fake_model.chat_requests) == 2


def test_arithmetic_heldout_split_is_fixed_distinct_and_from_its_bucket():
    a = arithmetic_heldout_benchmark(30, seed=7).prompts
    b = arithmetic_heldout_benchmark(30, seed=7).prompts
    questions = [p.messages[-1]["content"] for p in a]
    assert questions == [p.messages[-1]["content"] for p in b]
    assert len(set(questions)) == 30
    assert all(is_heldout_arithmetic(q, 10) for q in questions)


def test_arithmetic_asking_more_than_the_heldout_split_holds_is_refused():
    with pytest.raises(EvalError, match="held-out problems"):
        arithmetic_heldout_benchmark(500, levels=(1,), max_draws=20_000)


def test_a_stopped_evaluation_cancels_and_waits_for_its_samples_in_flight(tmp_path):
    """SIGTERM or Ctrl-C cancels the run in its step-0 evaluation: the samples still in
    flight are cancelled and awaited before their client closes, so none ends later with an
    exception nobody retrieves (asyncio printed those as a traceback on the way out)."""
    import asyncio

    from rl.evaluation.runner import evaluate_async

    started, cancelled = [], []

    class Slow(MathBenchmark):
        async def sample(self, problem, i, ctx):
            started.append(i)
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(i)
                raise

    async def go():
        unretrieved = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        run = asyncio.ensure_future(evaluate_async([Slow("toy", _bench().prompts)], "http://127.0.0.1:9", "fake",
                                                   SETTINGS, tmp_path, progress=False))
        while len(started) < SETTINGS.concurrency:
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        return unretrieved

    assert asyncio.run(go()) == []
    assert sorted(cancelled) == sorted(started) and len(started) == SETTINGS.concurrency
