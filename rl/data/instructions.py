"""Open-ended instruction prompts from templates (the rlhf domain).

A template with slots (``Write a {form} about {topic}.``) times slot values gives a few
thousand distinct prompts; a reward model scores the answers (``rl/rewards.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rl.data.base import Prompt, user_prompt

TEMPLATES: tuple[str, ...] = (
    "Write a short {form} about {topic}.",
    "Explain {topic} to a ten-year-old in a few sentences.",
    "Give three practical tips about {topic}.",
    "What are the pros and cons of {topic}? Answer briefly.",
    "Write a friendly email to a colleague about {topic}.",
    "Summarise the most important idea behind {topic} in two sentences.",
)
FORMS: tuple[str, ...] = ("poem", "story", "paragraph", "speech", "dialogue")
TOPICS: tuple[str, ...] = (
    "learning a new language", "saving money", "the water cycle", "working from home",
    "healthy sleep", "recycling plastic", "public libraries", "time management",
    "electric cars", "growing tomatoes", "the moon", "volunteering", "cooking rice",
    "remote teams", "museums", "bicycles", "rainy days", "first jobs", "chess", "friendship",
)


@dataclass
class InstructionSource:
    """Template x topic (x form) prompts drawn uniformly; no reference answer."""

    name: str = "instructions"

    def draw(self, rng: np.random.Generator) -> Prompt:
        """One instruction prompt."""
        t = int(rng.integers(len(TEMPLATES)))
        k = int(rng.integers(len(TOPICS)))
        f = int(rng.integers(len(FORMS)))
        text = TEMPLATES[t].format(form=FORMS[f], topic=TOPICS[k])
        fid = f if "{form}" in TEMPLATES[t] else 0
        return Prompt(prompt_id=f"{self.name}/{t}-{k}-{fid}", domain=self.name,
                      messages=user_prompt(text))
