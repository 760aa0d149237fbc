"""Math benchmarks: GSM8K test and a held-out split of the generated arithmetic tasks.

Each sample is one chat completion; it passes when math-verify finds its answer
(``\\boxed{}`` preferred, else the last number/expression) equivalent to the gold answer
(``rl.rewards.MathVerifyReward``, the training reward, so evaluation and training agree).

Held-out arithmetic: the generator (``rl.data.arithmetic``) draws from a small space (162
distinct level-1 problems), so "a different seed" is not held out. Problems are instead
split by a hash of their question text: bucket ``crc32(text) % holdout_buckets == 0`` is
the evaluation split (``rl.data.arithmetic.is_heldout_arithmetic``), the same in every run;
the training source (``ArithmeticSource(split="train")``) never draws from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rl.data.arithmetic import HOLDOUT_BUCKETS, ArithmeticSource, is_heldout_arithmetic
from rl.data.base import DataError, Prompt
from rl.data.gsm8k import gsm8k_prompt, iter_gsm8k_file, load_gsm8k_hub, looks_like_hub_id
from rl.evaluation.base import (ERROR, FAIL, PASS, EvalError, EvalProblem, SampleContext,
                                SampleResult, draw_chat, sample_key)
from rollout.client import ModelCallError


@dataclass
class MathBenchmark:
    """Math word problems graded by answer equivalence.

    Args:
        name: benchmark name in results.
        prompts: the problems (``Prompt.reference`` holds the gold answer).
        workload_class: X-Workload-Class of the samples' requests.
        broken: problems that could not be read (``error`` set): counted and reported as
            errors, never sampled.
    """

    name: str
    prompts: list[Prompt]
    workload_class: str = "rlvr"
    broken: list[EvalProblem] = field(default_factory=list)

    async def problems(self) -> list[EvalProblem]:
        """One problem per prompt (``payload`` is the prompt's dict), then the broken ones."""
        return [EvalProblem(p.prompt_id, p.to_dict()) for p in self.prompts] + list(self.broken)

    async def aclose(self) -> None:
        """Nothing to release."""

    async def sample(self, problem: EvalProblem, sample_index: int,
                     ctx: SampleContext) -> SampleResult:
        """One completion, graded with math-verify against the gold answer."""
        from rl.rewards import MathVerifyReward, RewardError

        prompt = Prompt.from_dict(problem.payload)
        key = sample_key(self.name, problem.problem_id, sample_index)
        result = dict(benchmark=self.name, problem_id=problem.problem_id, sample_index=sample_index)
        try:
            text = await draw_chat(ctx, key, list(prompt.messages), self.workload_class)
        except ModelCallError as e:
            return SampleResult(**result, outcome=ERROR, error=str(e))
        try:
            reward = MathVerifyReward()(prompt, text)
        except RewardError as e:
            return SampleResult(**result, outcome=ERROR, answer=text, error=str(e))
        return SampleResult(**result, outcome=PASS if reward > 0 else FAIL, answer=text,
                            detail={"gold": prompt.reference})


def gsm8k_benchmark(path: str | Path, limit: int | None = None, workload_class: str = "rlvr",
                    split: str = "test", hub_config: str | None = "main") -> MathBenchmark:
    """GSM8K problems from a JSONL file, a folder holding ``<split>.jsonl``, or the hub.

    Args:
        path: file, folder, or a hub dataset id such as ``openai/gsm8k`` when no such
            path exists (``rl.data.gsm8k.looks_like_hub_id``; needs ``datasets`` and a
            network or its cache).
        limit: first ``limit`` problems only (None = all).
        workload_class: X-Workload-Class of the samples' requests.
        split: the split (``test``): the file name looked up in a folder, the hub split.
        hub_config: configuration of a hub dataset (``main`` for openai/gsm8k).

    Returns:
        The benchmark; a malformed line of a JSONL file is a problem with its error
        (named ``gsm8k/<split>/<i>`` like the others, the message giving the line), so
        it is counted and reported while the other problems run.

    Raises:
        EvalError: the file is missing or holds no records, or the hub dataset cannot be
            loaded (offline, ``datasets`` missing): the message says what to pass instead.
    """
    spec = str(path)
    p = Path(spec).expanduser()
    if p.is_dir():
        p = p / f"{split}.jsonl"
    try:
        if not p.exists() and looks_like_hub_id(spec):
            items = list(load_gsm8k_hub(spec, hub_config, split))
        else:
            items = [row for _lineno, row in iter_gsm8k_file(p)]
    except DataError as e:
        raise EvalError(f"gsm8k benchmark (eval.benchmarks.gsm8k.path): {e}; or leave the benchmark out "
                        "with eval.benchmarks.gsm8k.enabled=false") from None
    if not items:
        raise EvalError(f"gsm8k benchmark: {p} holds no records (eval.benchmarks.gsm8k.path).")
    prompts, broken = [], []
    for i, row in enumerate(items[:limit] if limit is not None else items):
        pid = f"gsm8k/{split}/{i}"
        if isinstance(row, DataError):
            broken.append(EvalProblem(pid, error=f"gsm8k problem {pid}: {row}"))
        else:
            prompts.append(gsm8k_prompt(*row, prompt_id=pid))
    return MathBenchmark("gsm8k", prompts, workload_class, broken)


def arithmetic_heldout_benchmark(num_problems: int, seed: int = 0, levels=(1, 2, 3, 4, 5),
                                 holdout_buckets: int = 10, max_draws: int = 100_000,
                                 workload_class: str = "rlvr") -> MathBenchmark:
    """``num_problems`` distinct generated problems from the held-out bucket.

    Args:
        num_problems: problems wanted.
        seed: generator seed (the same seed gives the same problems).
        levels: difficulty levels drawn from (``rl.data.arithmetic``).
        holdout_buckets: 1 in ``holdout_buckets`` of all problems is held out.
        max_draws: give up drawing after this many tries (the held-out part of small
            levels runs out).

    Raises:
        EvalError: bad levels, or fewer than ``num_problems`` held-out problems exist in
            the levels asked for.
    """
    try:
        source = ArithmeticSource(levels=levels, name="arithmetic",
                                  split="heldout" if holdout_buckets == HOLDOUT_BUCKETS else "all")
    except DataError as e:
        raise EvalError(f"arithmetic benchmark: {e}") from None
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    prompts: list[Prompt] = []
    for _ in range(max_draws):
        if len(prompts) >= num_problems:
            break
        p = source.draw(rng)
        question = p.messages[-1]["content"]
        if question in seen or not is_heldout_arithmetic(question, holdout_buckets):
            continue
        seen.add(question)
        prompts.append(Prompt(f"arithmetic/heldout/{len(prompts)}", p.domain, p.messages,
                              p.reference, p.metadata))
    if len(prompts) < num_problems:
        raise EvalError(f"arithmetic benchmark: only {len(prompts)} distinct held-out problems "
                        f"found for levels {list(levels)} after {max_draws} draws; ask for fewer "
                        "(eval.benchmarks.arithmetic.num_problems) or add harder levels.")
    return MathBenchmark("arithmetic", prompts, workload_class)
