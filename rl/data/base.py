"""What a prompt domain hands the sampler: the ``Prompt`` record and the source protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class DataError(ValueError):
    """A data set or domain option is invalid; the message says which and what to do."""


@dataclass(frozen=True)
class Prompt:
    """One task drawn from a domain; a GRPO group of units shares it.

    Attributes:
        prompt_id: stable id within the domain (e.g. ``gsm8k/train/17``).
        domain: the domain's name (``arithmetic``, ``gsm8k``, ``code``, ``instructions``,
            or a domain another part registers, e.g. an agent task set).
        messages: the chat messages sent to the model (OpenAI format: role/content).
        reference: what the reward compares against: the gold answer for math, the test
            code for code problems, None for open-ended prompts.
        metadata: anything else the reward or the agent server needs (JSON-able),
            e.g. ``{"difficulty": 3}``.
    """

    prompt_id: str
    domain: str
    messages: tuple[dict[str, str], ...]
    reference: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (checkpoints, rollout logs)."""
        return {"prompt_id": self.prompt_id, "domain": self.domain,
                "messages": [dict(m) for m in self.messages], "reference": self.reference,
                "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Prompt":
        """Inverse of ``to_dict``."""
        return cls(d["prompt_id"], d["domain"], tuple(dict(m) for m in d["messages"]),
                   d.get("reference"), dict(d.get("metadata") or {}))


class PromptSource(Protocol):
    """A domain: draws prompts with the random generator it is given (no own state)."""

    name: str

    def draw(self, rng: np.random.Generator) -> Prompt:
        """One prompt; the same generator state gives the same prompt."""
        ...


def user_prompt(text: str, system: str | None = None) -> tuple[dict[str, str], ...]:
    """Chat messages for a single user turn (optionally after a system message)."""
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.append({"role": "user", "content": text})
    return tuple(msgs)
