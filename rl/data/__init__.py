"""Prompt domains the sampler draws from, one module per domain.

Every domain is a ``PromptSource``: ``draw(rng) -> Prompt``, deterministic given the
numpy ``Generator`` it is handed, so the sampler alone owns the random state (and its
``state_dict`` makes a run resumable).

- ``arithmetic``: generated arithmetic and word problems with graded difficulty (rlvr).
- ``gsm8k``: GSM8K from a JSONL file (rlvr).
- ``code``: small Python function problems with unit tests (rlvr, second domain).
- ``instructions``: open-ended instruction prompts from templates (rlhf).
"""

from rl.data.base import DataError, Prompt, PromptSource
from rl.data.arithmetic import ArithmeticSource
from rl.data.gsm8k import GSM8KSource, load_gsm8k, gsm8k_final_answer
from rl.data.code import CODE_PROBLEMS, CodeProblem, CodeSource, CodeTestsReward, RunTests, extract_program
from rl.data.instructions import InstructionSource

__all__ = [
    "DataError", "Prompt", "PromptSource", "ArithmeticSource", "GSM8KSource", "load_gsm8k",
    "gsm8k_final_answer", "CodeProblem", "CodeSource", "CODE_PROBLEMS", "CodeTestsReward",
    "RunTests", "extract_program", "InstructionSource",
]
