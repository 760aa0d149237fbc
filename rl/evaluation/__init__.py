"""Evaluation: pass@k of a served model on SWE-style, code and math benchmarks.

Public API: ``evaluate`` / ``evaluate_async`` and ``EvalSettings`` (``runner``); the
benchmarks ``SweBenchmark`` (``swe``), ``HumanEvalBenchmark`` (``humaneval``),
``gsm8k_benchmark`` and ``arithmetic_heldout_benchmark`` (``math_answers``); ``EvalError``.
SWE patches are graded in the sandbox (``swe``) or by the official SWE-bench harness
(``swebench_harness``). The estimators live in ``rl.passk``; the command line in ``rl.eval``.
"""

from rl.evaluation.base import EvalError, EvalProblem, SampleResult
from rl.evaluation.humaneval import HumanEvalBenchmark
from rl.evaluation.math_answers import arithmetic_heldout_benchmark, gsm8k_benchmark
from rl.evaluation.runner import EvalSettings, evaluate, evaluate_async
from rl.evaluation.swe import SweBenchmark

__all__ = ["EvalError", "EvalProblem", "EvalSettings", "HumanEvalBenchmark", "SampleResult",
           "SweBenchmark", "arithmetic_heldout_benchmark", "evaluate", "evaluate_async",
           "gsm8k_benchmark"]
