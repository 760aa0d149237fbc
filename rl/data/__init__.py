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

DOMAINS = {
    "arithmetic": lambda opts: ArithmeticSource(levels=tuple(opts.get("levels", (1, 2, 3, 4, 5)))),
    "gsm8k": lambda opts: GSM8KSource(str(opts["path"]), split=str(opts.get("split", "train"))),
    "code": lambda opts: CodeSource(),
    "instructions": lambda opts: InstructionSource(),
}
"""Domain name -> factory from its recipe options (``trainer.domains.<class>.<name>``)."""


def make_source(name: str, opts: dict) -> PromptSource:
    """The prompt source of domain ``name`` built from its recipe options.

    Raises:
        DataError: unknown domain, or a required option (e.g. gsm8k ``path``) missing.
    """
    if name not in DOMAINS:
        raise DataError(f"unknown prompt domain {name!r}; known: {sorted(DOMAINS)}")
    try:
        return DOMAINS[name](opts)
    except KeyError as e:
        raise DataError(f"domain {name} needs option {e.args[0]!r}") from None


__all__ = [
    "DOMAINS", "make_source",
    "DataError", "Prompt", "PromptSource", "ArithmeticSource", "GSM8KSource", "load_gsm8k",
    "gsm8k_final_answer", "CodeProblem", "CodeSource", "CODE_PROBLEMS", "CodeTestsReward",
    "RunTests", "extract_program", "InstructionSource",
]
