"""What the evaluation parts hand each other: problems, sample results, the benchmark protocol.

A benchmark lists its problems (a malformed one is listed too, carrying its ``error``, so
it is counted and reported instead of stopping the run) and turns one (problem, sample
index) into one graded ``SampleResult``. Grading never raises for what the model wrote:
a wrong or unrunnable answer is a ``fail``; ``error`` is kept for what is not the model's
fault (the model endpoint or the sandbox failed, the instance is broken). A benchmark that
grades in one batch after sampling (SWE with the official harness) records its samples as
``ungraded`` first and grades them in ``grade_pending``; an ungraded sample is never
counted in a figure.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from rollout.client import RolloutClient

from router.headers import SessionHeaders

PASS, FAIL, ERROR = "pass", "fail", "error"
"""The three outcomes of one graded sample."""

UNGRADED = "ungraded"
"""A sample drawn but not yet graded (graded later in one batch; not final, never counted)."""


class EvalError(ValueError):
    """Bad evaluation input or settings; the message names the file, instance or option."""


@dataclass(frozen=True)
class EvalProblem:
    """One problem of a benchmark.

    Attributes:
        problem_id: unique within the benchmark (an instance_id, a HumanEval task_id, ...).
        payload: what the benchmark needs to sample and grade it (JSON-able).
        error: why the problem cannot be evaluated (malformed, its tests do not run);
            '' when it is fine. A problem with an error is never sampled.
    """

    problem_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class SampleResult:
    """One graded sample.

    Attributes:
        benchmark: the benchmark's name.
        problem_id: the problem.
        sample_index: 0..n-1.
        outcome: ``pass``, ``fail`` or ``error`` (``ungraded`` until a batch grader ran).
        answer: what the model produced that was graded (completion text or patch).
        detail: grading details (extracted answer, test outcomes, episode status, ...).
        error: message when ``outcome == "error"``.
    """

    benchmark: str
    problem_id: str
    sample_index: int
    outcome: str
    answer: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def key(self) -> str:
        """Id of the (problem, sample) pair in the results log."""
        return sample_key(self.benchmark, self.problem_id, self.sample_index)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (one line of the results log), ``key`` included."""
        return {"key": self.key, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SampleResult":
        """Inverse of ``to_dict``.

        Raises:
            KeyError, TypeError, ValueError: a field is missing or malformed.
        """
        outcome = str(d["outcome"])
        if outcome not in (PASS, FAIL, ERROR, UNGRADED):
            raise ValueError(f"unknown outcome {outcome!r}")
        return cls(str(d["benchmark"]), str(d["problem_id"]), int(d["sample_index"]), outcome,
                   str(d.get("answer", "")), dict(d.get("detail") or {}), str(d.get("error", "")))


def sample_key(benchmark: str, problem_id: str, sample_index: int) -> str:
    """``<benchmark>/<problem_id>#<sample_index>``: a sample's id in the results log."""
    return f"{benchmark}/{problem_id}#{sample_index}"


@dataclass(frozen=True)
class SampleContext:
    """What a benchmark needs to draw one sample.

    Attributes:
        client: OpenAI-compatible client bound to the router (session headers per call).
        base_url: the router's URL (agent episodes open their own token-level client).
        model: the served model name.
        temperature, top_p: sampling settings.
        max_tokens: completion budget of a single-turn sample.
        seed: base seed; sample ``i`` of a problem uses a seed derived from it, the
            problem and ``i`` (reproducible samples where the engine honours ``seed``);
            None = no per-request seed (see ``EvalSettings.request_seeds``).
        run_id: prefix of the session ids (X-Session-Id) of this evaluation.
    """

    client: RolloutClient
    base_url: str
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = 0
    run_id: str = "eval"


class Benchmark(Protocol):
    """A set of problems that can be sampled and graded.

    Attributes:
        name: the benchmark's name in results (``gsm8k``, ``humaneval``, ``swe``, ...).
    """

    name: str

    async def problems(self) -> list[EvalProblem]:
        """All problems, malformed ones included (with ``error`` set), in a fixed order.

        Raises:
            EvalError: the benchmark's input as a whole is unusable (file missing).
        """
        ...

    async def sample(self, problem: EvalProblem, sample_index: int,
                     ctx: SampleContext) -> SampleResult:
        """Draw sample ``sample_index`` of ``problem`` and grade it (never raises for
        what the model produced; infrastructure failures give outcome ``error``)."""
        ...

    async def aclose(self) -> None:
        """Release what the samples opened (HTTP clients, temporary folders)."""
        ...


def sample_seed(base_seed: int | None, key: str) -> int | None:
    """A 31-bit seed for the sample ``key``, stable across runs and processes (None for None)."""
    if base_seed is None:
        return None
    return (zlib.crc32(key.encode()) ^ (base_seed * 0x9E3779B1)) & 0x7FFFFFFF


async def draw_chat(ctx: SampleContext, key: str, messages: list[dict[str, str]],
                    workload_class: str) -> str:
    """One single-turn chat completion for sample ``key`` (its own one-call session).

    Returns:
        The completion text.

    Raises:
        rollout.client.ModelCallError: the call failed (the caller records an ``error``).
    """
    tag = SessionHeaders(session_id=f"{ctx.run_id}/{key}", workload_class=workload_class)
    completion = await ctx.client.chat(
        messages, tag, session_end=True, max_tokens=ctx.max_tokens,
        temperature=ctx.temperature, top_p=ctx.top_p, seed=sample_seed(ctx.seed, key))
    return completion.text
