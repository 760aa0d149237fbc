"""rlvr training and the in-run evaluation (issue 16: "why is the rlvr reward 0.00 where
evaluation gets 0.19"): with the default config both send arithmetic questions in the same
template and grade them with the same reward; what differs by design is shown side by side
(rl.report.rlvr_settings), in the run's summary and in README."""

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from omegaconf import OmegaConf

from common.config import compose
from rl.data import make_source
from rl.data.arithmetic import ANSWER_FORMAT
from rl.evaluation import arithmetic_heldout_benchmark
from rl.evaluation.base import PASS, EvalProblem, SampleContext
from rl.report import rlvr_settings, rlvr_settings_markdown
from rl.rewards import rewards_from_config

README = Path(__file__).resolve().parents[2] / "README.md"


class RecordingChat:
    """A chat client that answers a fixed text and records the messages it was sent."""

    def __init__(self, answer: str) -> None:
        self.answer, self.sent = answer, []

    async def chat(self, messages, tag, session_end, **fields):
        self.sent.append(messages)
        return SimpleNamespace(text=self.answer)


def _default_trainer():
    return compose("train", ["run_dir=runs/test"]).trainer


def test_default_training_and_evaluation_share_the_arithmetic_template_and_grader():
    t = _default_trainer()
    train_opts = OmegaConf.to_container(t.domains.rlvr.arithmetic, resolve=True)
    rng = np.random.default_rng(0)
    train = [make_source("arithmetic", train_opts).draw(rng) for _ in range(60)]
    bench = arithmetic_heldout_benchmark(int(t.eval.problems), seed=0, levels=tuple(t.eval.levels))
    levels = {p.metadata["difficulty"] for p in train}
    assert levels == {p.metadata["difficulty"] for p in bench.prompts} == set(t.eval.levels)

    rcfg = {**OmegaConf.to_container(t.rewards, resolve=True), "rlhf_scorer": "http"}
    train_reward = rewards_from_config(rcfg, "unused")  # the rlvr units' reward (rl.reward_pool)
    for prompt in bench.prompts[:4]:
        gold = int(prompt.reference)
        for text in (f"\\boxed{{{gold}}}", f"\\boxed{{{gold + 1}}}", f"So it is {gold}.", ""):
            chat = RecordingChat(text)
            ctx = SampleContext(client=chat, base_url="", model="m")
            problem = EvalProblem(prompt.prompt_id, prompt.to_dict())
            result = asyncio.run(bench.sample(problem, 0, ctx))
            # the evaluation sends the question as training does: one user message, the
            # \boxed{} instruction, rendered by the model's chat template (engine or tokenizer)
            (sent,) = chat.sent
            assert [m["role"] for m in sent] == [m["role"] for m in train[0].messages] == ["user"]
            assert sent[0]["content"].endswith(ANSWER_FORMAT)
            assert all(p.messages[0]["content"].endswith(ANSWER_FORMAT) for p in train)
            # and the same grader: a training reward of 1 is an evaluation pass
            assert (result.outcome == PASS) == (train_reward.score([prompt], [text])[0] == 1.0), text


def test_side_by_side_settings_come_from_the_config():
    t = _default_trainer()
    rows = {name: (train, ev) for name, train, ev in rlvr_settings(t)}
    assert rows["temperature"] == ("0.8", "0.8")
    assert rows["top_p"] == ("1", "0.95")  # by design: training samples the whole distribution
    assert rows["max tokens"] == ("160", "256")  # the evaluation is not cut to the training limit
    assert rows["prompts"][0] == "arithmetic levels 1, 2, 3 (training split)"  # gsm8k, code: weight 0
    assert rows["prompts"][1].startswith("arithmetic levels 1, 2, 3 (held-out split), 48 problems")
    hot = compose("train", ["run_dir=runs/test", "trainer.sampling.temperature=1.0"]).trainer
    assert dict((n, tr) for n, tr, _ in rlvr_settings(hot))["temperature"] == "1"


def test_readme_shows_the_default_recipes_settings_table():
    table = rlvr_settings_markdown(_default_trainer())
    assert table in README.read_text(), ("README's rlvr settings table is stale; paste "
                                         "rl.report.rlvr_settings_markdown(<default trainer config>)")
