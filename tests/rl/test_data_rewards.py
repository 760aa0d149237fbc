"""Prompt domains and rewards: math-verify on right/wrong/formatted answers, the GSM8K
loader, generator difficulty levels, the code domain's test callable, reward models."""

import json
import os

import numpy as np
import pytest

from rl.data import (ArithmeticSource, CodeSource, CodeTestsReward, DataError, GSM8KSource,
                     InstructionSource, extract_program, gsm8k_final_answer, load_gsm8k)
from rl.data.base import Prompt, user_prompt
from rl.rewards import (DomainRewards, MathVerifyReward, RewardError, RewardModelScorer,
                        ZeroShotJudgeScorer)
from tests.conftest import GSM8K_TINY



def _math(ref):
    return Prompt("m/1", "arithmetic", user_prompt("q"), reference=ref)


@pytest.mark.parametrize("completion, reward", [
    ("So the total is \\boxed{72}.", 1.0),
    ("48 + 24 = 72. The answer is 72", 1.0),
    ("The answer is $72.0$", 1.0),
    ("\\boxed{71}", 0.0),
    ("I am not sure.", 0.0),
])
def test_math_verify_reward_on_right_wrong_and_formatted_answers(completion, reward):
    assert MathVerifyReward()(_math("72"), completion) == reward


def test_math_verify_accepts_equivalent_forms():
    assert MathVerifyReward()(_math("0.5"), "\\boxed{\\frac{1}{2}}") == 1.0
    assert MathVerifyReward()(_math("1000"), "\\boxed{1,000}") == 1.0


def test_math_reward_without_gold_answer_is_an_error():
    with pytest.raises(RewardError, match="gold"):
        MathVerifyReward()(Prompt("x", "arithmetic", user_prompt("q")), "1")


def test_gsm8k_final_answer_strips_separators_and_needs_marker():
    assert gsm8k_final_answer("blah\n#### 1,234") == "1234"
    with pytest.raises(DataError, match="####"):
        gsm8k_final_answer("no marker")


def test_gsm8k_loader_reads_questions_and_final_answers_in_file_order():
    rows = load_gsm8k(GSM8K_TINY)
    assert [a for _q, a in rows] == ["7", "1350", "16"]
    assert rows[0][0].startswith("A baker makes 12 rolls")
    src = GSM8KSource(str(GSM8K_TINY), split="test")
    p = src.prompt(1)
    assert p.prompt_id == "gsm8k/test/1" and p.reference == "1350"
    assert "\\boxed{}" in p.messages[-1]["content"]
    # the gold answer of the file scores 1 with the math reward
    assert MathVerifyReward()(p, f"\\boxed{{{p.reference}}}") == 1.0


def test_gsm8k_loader_reads_the_real_test_split(real_gsm8k_dir):
    rows = load_gsm8k(real_gsm8k_dir / "test.jsonl")
    assert len(rows) == 1319
    assert all(q and a for q, a in rows[:50])


def test_gsm8k_loader_reports_bad_line_number(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"question": "q", "answer": "a\n#### 3"}) + "\n{broken\n")
    with pytest.raises(DataError, match=":2:"):
        load_gsm8k(f)


def test_missing_gsm8k_file_names_the_default_place_beside_the_repository(tmp_path):
    """The caller names its own key (rl.train: trainer.domains.rlvr.gsm8k, rl.eval:
    eval.benchmarks.gsm8k.path): the loader names neither, so rl.train never points at the
    key of rl.eval, which it refuses."""
    with pytest.raises(DataError, match="does not exist") as e:
        load_gsm8k(tmp_path / "missing.jsonl")
    message = str(e.value)
    assert "trainer." not in message and "eval.benchmarks" not in message
    assert "../shared/data/gsm8k/train.jsonl" in message
    assert "/work/" not in message


def test_arithmetic_levels_are_graded_and_answers_correct():
    rng = np.random.default_rng(0)
    for level in range(1, 6):
        src = ArithmeticSource(levels=(level,))
        for _ in range(30):
            p = src.draw(rng)
            assert p.metadata["difficulty"] == level
            text = p.messages[-1]["content"]
            if level <= 3 or "(" in text:  # pure expressions: check the answer by eval
                expr = text.split("What is ")[1].split("?")[0]
                assert str(eval(expr)) == p.reference
            assert int(p.reference) >= 0 or level == 5
    # harder levels have bigger answers on average
    means = [np.mean([abs(int(ArithmeticSource(levels=(lv,)).draw(rng).reference))
                      for _ in range(200)]) for lv in (1, 2, 3)]
    assert means[0] < means[1] < means[2]


def test_arithmetic_rejects_unknown_level():
    with pytest.raises(DataError, match="levels"):
        ArithmeticSource(levels=(0, 6))


def test_code_reward_runs_extracted_program_through_callable():
    calls = []

    def run_tests(program, tests):  # a trivial stand-in for the sandbox: exec in a dict
        calls.append(program)
        env = {}
        try:
            exec(program + "\n" + tests, env)
            return True
        except Exception:
            return False

    p = CodeSource().draw(np.random.default_rng(0))
    name = p.metadata["entry_point"]
    reward = CodeTestsReward(run_tests)
    good = {"add": "def add(a, b):\n    return a + b"}.get(name)
    assert reward(p, "```python\ndef nope(): pass\n```") == 0.0
    if good:
        assert reward(p, f"Here:\n```python\n{good}\n```") == 1.0
    assert calls[0] == "def nope(): pass"


def test_extract_program_takes_last_fenced_block():
    assert extract_program("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2"
    assert extract_program("def f(): return 1") == "def f(): return 1"


def test_domain_rewards_route_by_domain_and_reject_unknown():
    rewards = DomainRewards({"arithmetic": MathVerifyReward(),
                             "instructions": lambda p, c: float(len(c))})
    inst = InstructionSource().draw(np.random.default_rng(0))
    assert rewards.score([_math("3"), inst, _math("4")], ["\\boxed{3}", "abcd", "5"]) == [1.0, 4.0, 0.0]
    with pytest.raises(RewardError, match="gsm8k"):
        rewards.score([Prompt("g", "gsm8k", user_prompt("q"), "1")], ["1"])


@pytest.mark.slow  # loads a model: 5-30 s on the shared CPU
def test_zero_shot_judge_gives_a_distribution_over_ratings(model_path):
    judge = ZeroShotJudgeScorer(model_path)
    p = InstructionSource().draw(np.random.default_rng(1))
    probs = judge.rating_probs([p, p], ["A clear, correct answer.", "zzzz"])
    assert probs.shape == (2, 9)
    assert probs.sum(1).tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    scores = judge.score_batch([p, p], ["A clear, correct answer.", "zzzz"])
    assert all(0.0 <= s <= 1.0 for s in scores) and scores[0] != scores[1]


@pytest.mark.slow  # loads a model: 5-30 s on the shared CPU
def test_reward_model_scorer_reads_one_logit_per_pair(tmp_path, model_path):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(model_path)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      num_labels=1, pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    rm = RewardModelScorer(str(tmp_path / "rm"), batch_size=2)
    p = InstructionSource().draw(np.random.default_rng(0))
    s = rm.score_batch([p, p, p], ["short", "a much longer answer here", "short"])
    assert len(s) == 3 and s[0] == pytest.approx(s[2], abs=1e-5) and s[0] != s[1]
    cfg.num_labels = 2
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path / "two")
    tok.save_pretrained(tmp_path / "two")
    with pytest.raises(RewardError, match="labels"):
        RewardModelScorer(str(tmp_path / "two"))


def test_rlhf_scorer_choice_from_recipe_options():
    from rl.rewards import HttpRewardScorer, rlhf_scorer_from_config, rewards_from_config

    srv = {"host": "127.0.0.1", "port": 8601}
    s = rlhf_scorer_from_config({"rlhf_scorer": "http", "server": srv}, "unused")
    assert isinstance(s, HttpRewardScorer) and s.url == "http://127.0.0.1:8601"
    with pytest.raises(RewardError, match="reward_model_path"):
        rlhf_scorer_from_config({"rlhf_scorer": "reward_model"}, "unused")
    with pytest.raises(RewardError, match="choose judge or reward_model$"):
        rlhf_scorer_from_config({"rlhf_scorer": "http", "server": srv}, "unused", allow_http=False)
    r = rewards_from_config({"rlhf_scorer": "http", "server": srv}, "unused",
                            run_tests=lambda prog, tests: True)
    assert set(r.scorers) == {"arithmetic", "gsm8k", "instructions", "code"}


def test_training_arithmetic_never_draws_a_held_out_problem():
    import numpy as np

    from rl.data.arithmetic import ArithmeticSource, is_heldout_arithmetic

    rng = np.random.default_rng(0)
    train = [ArithmeticSource().draw(rng).messages[-1]["content"] for _ in range(400)]
    held = [ArithmeticSource(split="heldout").draw(rng).messages[-1]["content"] for _ in range(40)]
    assert not any(is_heldout_arithmetic(q) for q in train)
    assert all(is_heldout_arithmetic(q) for q in held)


def test_a_gsm8k_path_that_is_a_folder_or_a_special_file_is_named_as_such(tmp_path):
    """A folder given where the JSONL file goes is not 'missing' (the user sees it there), and a
    named pipe is refused before anything opens it (opening one would block)."""
    with pytest.raises(DataError, match="is a folder, not a file"):
        load_gsm8k(tmp_path)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is not a regular file"):
        load_gsm8k(fifo)
