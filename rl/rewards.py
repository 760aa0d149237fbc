"""Rewards (DESIGN.md step 6): verifiable math answers, unit tests, reward models.

Every scorer answers ``score_batch(prompts, completions) -> list[float]``; ``DomainRewards``
sends each finished unit to the scorer of its domain.

- ``MathVerifyReward``: 1.0 when math-verify finds the completion's answer equivalent to
  the gold answer (``\\boxed{}`` preferred, else the last number/expression), else 0.0.
- ``CodeTestsReward`` (``rl.data.code``): unit tests run through a sandbox callable.
- ``RewardModelScorer``: any Hugging Face sequence-classification reward model by path;
  the reward is its scalar logit.
- ``ZeroShotJudgeScorer``: the CPU default for rlhf when no reward model is given: a
  small causal LM (the policy model itself works) asked to rate the answer 1-9; the
  reward is the expected rating under its next-token distribution over the digit tokens
  1..9, mapped to [0, 1]. This is a *weak* judge: a 135M model's ratings carry little
  information about quality (they lean on length and fluency). Use a real reward model
  for anything beyond plumbing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from rl.data.base import Prompt
from rl.data.code import CodeTestsReward

# math-verify 0.3 passes a normalisation option that latex2sympy2_extended 1.11 deprecates
# and warns about on every parse; the parse itself is unaffected.
logging.getLogger("latex2sympy2_extended.math_normalization").setLevel(logging.ERROR)

__all__ = ["RewardError", "BatchScorer", "MathVerifyReward", "CodeTestsReward",
           "RewardModelScorer", "ZeroShotJudgeScorer", "DomainRewards", "conversation_text",
           "rewards_from_config", "rlhf_scorer_from_config", "HttpRewardScorer"]


class RewardError(RuntimeError):
    """A reward could not be computed; the message says which domain/model and why."""


class BatchScorer(Protocol):
    """Scores completions of prompts, one float per pair."""

    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        ...


@dataclass
class MathVerifyReward:
    """Answer equivalence by math-verify (``parse`` then ``verify``).

    math-verify guards parsing with SIGALRM timeouts, which work only in the main thread;
    call it there (or in worker processes), not from a thread pool.

    Args:
        correct: reward for an equivalent answer.
        wrong: reward otherwise (no answer found counts as wrong).
    """

    correct: float = 1.0
    wrong: float = 0.0

    def __call__(self, prompt: Prompt, completion: str) -> float:
        """Reward of one completion against ``prompt.reference``.

        Raises:
            RewardError: the prompt has no gold answer, or the call is off the main thread.
        """
        from math_verify import parse, verify

        if prompt.reference is None:
            raise RewardError(f"prompt {prompt.prompt_id} ({prompt.domain}) has no gold answer")
        if threading.current_thread() is not threading.main_thread():
            raise RewardError("MathVerifyReward must run in the main thread (math-verify uses "
                              "SIGALRM timeouts); score in the main thread or a process pool")
        gold = parse(prompt.reference)
        pred = parse(completion)
        if not gold or not pred:
            return self.wrong
        return self.correct if verify(gold, pred) else self.wrong

    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """``self(p, c)`` for each pair."""
        return [self(p, c) for p, c in zip(prompts, completions)]


@dataclass
class _PerSample:
    """A per-sample reward ``fn(prompt, completion)`` as a ``BatchScorer``."""

    fn: Callable[[Prompt, str], float]

    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        return [float(self.fn(p, c)) for p, c in zip(prompts, completions)]


def conversation_text(tokenizer, prompt: Prompt, completion: str) -> str:
    """The prompt's messages plus the completion as the assistant turn, rendered with
    the tokenizer's chat template (plain ``role: content`` lines if it has none)."""
    msgs = [*prompt.messages, {"role": "assistant", "content": completion}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(msgs, tokenize=False)
    return "\n".join(f"{m['role']}: {m['content']}" for m in msgs)


def _load_scorer_model(auto_cls, path: str, what: str, device: str):
    """(tokenizer with a pad token, eval-mode float32 model) from a HF folder or hub id.

    Raises:
        RewardError: either cannot be loaded.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = auto_cls.from_pretrained(path, dtype=torch.float32).to(device).eval()
    except (OSError, ValueError) as e:
        raise RewardError(f"cannot load the {what} from {path}: {e}. Give a local Hugging "
                          "Face folder or hub id.") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


class RewardModelScorer:
    """A Hugging Face sequence-classification reward model (one output: the reward).

    Args:
        model_path: folder or hub id of an ``AutoModelForSequenceClassification``.
        device: torch device.
        max_length_tokens: conversations are truncated (from the left) to this.
        batch_size: pairs per forward pass.

    Raises:
        RewardError: the model cannot be loaded or has more than one output label.
    """

    def __init__(self, model_path: str, device: str = "cpu", *, max_length_tokens: int = 2048,
                 batch_size: int = 8):
        from transformers import AutoModelForSequenceClassification

        self.tokenizer, self.model = _load_scorer_model(
            AutoModelForSequenceClassification, model_path, "reward model", device)
        self.tokenizer.truncation_side = "left"
        if self.model.config.num_labels != 1:
            raise RewardError(f"reward model {model_path} has {self.model.config.num_labels} "
                              "output labels; a reward model has exactly 1")
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.max_length_tokens, self.batch_size = device, max_length_tokens, batch_size

    @torch.no_grad()
    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """The reward model's scalar output for each (prompt, completion)."""
        texts = [conversation_text(self.tokenizer, p, c) for p, c in zip(prompts, completions)]
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length_tokens).to(self.device)
            out.extend(self.model(**enc).logits[:, 0].float().tolist())
        return out


JUDGE_INSTRUCTION = (
    "Rate how helpful, correct and well written the answer is, from 1 (useless) to 9 "
    "(excellent). Reply with one digit.\n\nInstruction:\n{instruction}\n\nAnswer:\n{answer}")


class ZeroShotJudgeScorer:
    """A causal LM as a zero-shot judge: reward = E[rating] over digits 1..9, in [0, 1].

    reward = (sum_d d * p(d) - 1) / 8, with p the model's next-token distribution after
    the judge prompt renormalised over the tokens "1".."9". Weak with a small model (see
    the module docstring).

    Args:
        model_path: folder or hub id of a causal LM with a chat template.
        device: torch device.
        max_answer_chars: the answer is cut to this many characters in the judge prompt.

    Raises:
        RewardError: the model cannot be loaded, or a digit 1..9 is not one token.
    """

    def __init__(self, model_path: str, device: str = "cpu", *, max_answer_chars: int = 2000,
                 batch_size: int = 8):
        from transformers import AutoModelForCausalLM

        self.tokenizer, self.model = _load_scorer_model(AutoModelForCausalLM, model_path,
                                                        "judge model", device)
        self.tokenizer.padding_side = "left"  # the rating is read at the last position
        ids = [self.tokenizer.encode(str(d), add_special_tokens=False) for d in range(1, 10)]
        if any(len(t) != 1 for t in ids):
            raise RewardError(f"judge model {model_path}: digits are not single tokens ({ids})")
        self.digit_token_ids = torch.tensor([t[0] for t in ids])
        self.device, self.max_answer_chars, self.batch_size = device, max_answer_chars, batch_size

    def judge_prompt(self, prompt: Prompt, completion: str) -> str:
        """The text the judge reads; it ends where the rating digit is expected."""
        instruction = "\n".join(m["content"] for m in prompt.messages if m["role"] == "user")
        user = JUDGE_INSTRUCTION.format(instruction=instruction,
                                        answer=completion[:self.max_answer_chars])
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                                  tokenize=False, add_generation_prompt=True)
        return text + "Rating: "

    @torch.no_grad()
    def rating_probs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> torch.Tensor:
        """[N, 9] probabilities of ratings 1..9."""
        texts = [self.judge_prompt(p, c) for p, c in zip(prompts, completions)]
        rows = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[i:i + self.batch_size], return_tensors="pt",
                                 padding=True).to(self.device)
            last = self.model(**enc).logits[:, -1].float()
            rows.append(torch.softmax(last[:, self.digit_token_ids.to(last.device)], dim=-1).cpu())
        return torch.cat(rows) if rows else torch.zeros((0, 9))

    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """Expected rating mapped to [0, 1] for each pair."""
        probs = self.rating_probs(prompts, completions)
        expected = probs @ torch.arange(1, 10, dtype=torch.float32)
        return ((expected - 1.0) / 8.0).tolist()


class DomainRewards:
    """Routes each (prompt, completion) to the scorer of ``prompt.domain``.

    Args:
        scorers: domain -> a ``BatchScorer``, or a per-sample ``fn(prompt, completion)``.

    Raises:
        RewardError (from ``score``): a prompt's domain has no scorer.
    """

    def __init__(self, scorers: Mapping[str, BatchScorer | Callable[[Prompt, str], float]]):
        self.scorers: dict[str, BatchScorer] = {
            d: s if hasattr(s, "score_batch") else _PerSample(s) for d, s in scorers.items()}

    def score(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """One reward per pair, in input order; each domain's pairs go in one batch."""
        if len(prompts) != len(completions):
            raise RewardError(f"{len(prompts)} prompts but {len(completions)} completions")
        by_domain: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            by_domain.setdefault(p.domain, []).append(i)
        missing = sorted(set(by_domain) - set(self.scorers))
        if missing:
            raise RewardError(f"no reward for domains {missing}; configured domains: "
                              f"{sorted(self.scorers)}")
        out = [0.0] * len(prompts)
        for d, idx in by_domain.items():
            scores = self.scorers[d].score_batch([prompts[i] for i in idx],
                                                 [completions[i] for i in idx])
            for i, s in zip(idx, scores):
                out[i] = float(s)
        return out


class HttpRewardScorer:
    """Scores through a reward server (``python -m rl.reward_server``) over HTTP.

    Args:
        url: the server's base URL.
        timeout_s: per-request timeout.
    """

    def __init__(self, url: str, timeout_s: float = 600.0):
        import httpx

        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s)

    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """POST the pairs to ``/score``; one float per pair.

        Raises:
            RewardError: the server is unreachable or answers an error.
        """
        import httpx

        items = [{"messages": [dict(m) for m in p.messages], "completion": c}
                 for p, c in zip(prompts, completions)]
        try:
            r = self._http.post(f"{self.url}/score", json={"items": items})
        except httpx.HTTPError as e:
            raise RewardError(f"reward server {self.url} unreachable ({e}); is "
                              "python -m rl.reward_server running?") from None
        if r.status_code != 200:
            raise RewardError(f"reward server {self.url} answered HTTP {r.status_code}: "
                              f"{r.text[:300]}")
        scores = r.json()["scores"]
        if len(scores) != len(items):
            raise RewardError(f"reward server returned {len(scores)} scores for {len(items)} items")
        return [float(x) for x in scores]


def rlhf_scorer_from_config(rcfg: Mapping[str, Any], policy_model_path: str,
                            allow_http: bool = True) -> BatchScorer:
    """The rlhf scorer of ``trainer.rewards.rlhf_scorer``: ``judge`` (zero-shot judge on
    ``policy_model_path``), ``reward_model`` (at ``reward_model_path``), or ``http`` (a
    reward server at ``server.host:server.port``; not allowed inside the server itself).

    Raises:
        RewardError: unknown kind, or ``reward_model`` without a path.
    """
    kind = str(rcfg.get("rlhf_scorer", "judge"))
    device = str(rcfg.get("device", "cpu"))
    if kind == "judge":
        return ZeroShotJudgeScorer(policy_model_path, device=device)
    if kind == "reward_model":
        if not rcfg.get("reward_model_path"):
            raise RewardError("trainer.rewards.rlhf_scorer=reward_model needs "
                              "trainer.rewards.reward_model_path (a HF sequence-classification model)")
        return RewardModelScorer(str(rcfg["reward_model_path"]), device=device)
    if kind == "http" and allow_http:
        srv = rcfg["server"]
        return HttpRewardScorer(f"http://{srv['host']}:{srv['port']}")
    choices = "judge, reward_model or http" if allow_http else "judge or reward_model"
    raise RewardError(f"trainer.rewards.rlhf_scorer={kind!r}: choose {choices}")


def rewards_from_config(rcfg: Mapping[str, Any], policy_model_path: str,
                        run_tests: Callable[[str, str], bool] | None = None,
                        extra: Mapping[str, BatchScorer | Callable[[Prompt, str], float]] | None = None
                        ) -> DomainRewards:
    """The rewards of recipe section ``trainer.rewards`` for the built-in domains.

    math domains (arithmetic, gsm8k) -> ``MathVerifyReward``; code -> ``CodeTestsReward``
    when ``run_tests`` is given (the sandbox's); instructions -> ``rlhf_scorer_from_config``.
    ``extra`` adds domains scored elsewhere (agent task sets: the environment outcome).

    Raises:
        RewardError: see ``rlhf_scorer_from_config``.
    """
    math = MathVerifyReward()
    scorers: dict[str, Any] = {"arithmetic": math, "gsm8k": math,
                               "instructions": rlhf_scorer_from_config(rcfg, policy_model_path)}
    if run_tests is not None:
        scorers["code"] = CodeTestsReward(run_tests)
    scorers.update(extra or {})
    return DomainRewards(scorers)
