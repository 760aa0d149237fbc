"""GSM8K grade-school math from a JSONL file (an rlvr domain).

Each line holds ``question`` and ``answer``; the answer's worked solution ends with
``#### N``, the gold final answer. The file is read once; draws pick a row uniformly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rl.data.arithmetic import ANSWER_FORMAT
from rl.data.base import DataError, Prompt, user_prompt


def gsm8k_final_answer(answer: str) -> str:
    """The gold number after ``####`` in a GSM8K answer, thousands separators removed.

    Raises:
        DataError: the answer has no ``####`` line.
    """
    head, sep, tail = answer.rpartition("####")
    if not sep or not tail.strip():
        raise DataError(f"GSM8K answer has no '#### N' final line: {answer[-80:]!r}")
    return tail.strip().replace(",", "")


def load_gsm8k(path: str | Path) -> list[tuple[str, str]]:
    """Read a GSM8K JSONL file into ``(question, final_answer)`` pairs, in file order.

    Raises:
        DataError: the file is missing or empty, a line is not JSON, or a line lacks
            ``question``/``answer`` or the ``#### N`` answer line (the message gives the
            line number).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"GSM8K file {p} does not exist; set its path (a JSONL file with "
                        "question/answer fields), e.g. /work/shared/data/gsm8k/train.jsonl")
    rows = []
    with p.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rows.append((str(rec["question"]), gsm8k_final_answer(str(rec["answer"]))))
            except (json.JSONDecodeError, KeyError, TypeError, DataError) as e:
                raise DataError(f"{p}:{i}: not a GSM8K record with question/answer "
                                f"and a '#### N' final line ({e})") from None
    if not rows:
        raise DataError(f"GSM8K file {p} holds no records")
    return rows


@dataclass
class GSM8KSource:
    """GSM8K questions drawn uniformly from ``path``.

    Args:
        path: JSONL file (``question``, ``answer`` ending in ``#### N``).
        split: label written into prompt ids (``train``/``test``).
        name: domain name.

    Raises:
        DataError: see ``load_gsm8k``.
    """

    path: str
    split: str = "train"
    name: str = "gsm8k"
    rows: list[tuple[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rows = load_gsm8k(self.path)

    def __len__(self) -> int:
        return len(self.rows)

    def prompt(self, index: int) -> Prompt:
        """Row ``index`` as a prompt (evaluation walks the rows in order)."""
        question, answer = self.rows[index]
        return Prompt(prompt_id=f"{self.name}/{self.split}/{index}", domain=self.name,
                      messages=user_prompt(f"{question}\n{ANSWER_FORMAT}"), reference=answer)

    def draw(self, rng: np.random.Generator) -> Prompt:
        """One row chosen uniformly."""
        return self.prompt(int(rng.integers(len(self.rows))))
