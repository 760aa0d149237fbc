"""GSM8K grade-school math from a JSONL file, or from the hub when online (an rlvr domain).

Each record holds ``question`` and ``answer``; the answer's worked solution ends with
``#### N``, the gold final answer. The source is read once; draws pick a row uniformly.

Where the records come from (``gsm8k_records``): an existing file is read as JSONL; a
value that is not an existing path and looks like a hub dataset id (``openai/gsm8k``,
``gsm8k``) is loaded with the Hugging Face ``datasets`` library (``pip install
'.[hub]'``; config ``main``, the split asked for), which needs a network or its cache.
Anything else (``../data/test.jsonl`` that does not exist) is a missing file. Offline, or
without ``datasets``, the error says to pass a JSONL path instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from common.config import HUB_ID
from rl.data.arithmetic import ANSWER_FORMAT
from rl.data.base import DataError, Prompt, user_prompt

DEFAULT_LOCATION = ("shared/data/gsm8k/ beside the repository (../shared/data/gsm8k/train.jsonl "
                    "for training, test.jsonl for evaluation)")
"""Where the recipes look by default (``trainer.domains.rlvr.gsm8k.path``, ``eval.benchmarks.gsm8k.path``)."""

JSONL_HINT = ("pass a JSONL path instead (one {\"question\", \"answer\"} object per line; "
              f"the recipes' default is {DEFAULT_LOCATION})")


def gsm8k_final_answer(answer: str) -> str:
    """The gold number after ``####`` in a GSM8K answer, thousands separators removed.

    Raises:
        DataError: the answer has no ``####`` line.
    """
    head, sep, tail = answer.rpartition("####")
    if not sep or not tail.strip():
        raise DataError(f"GSM8K answer has no '#### N' final line: {answer[-80:]!r}")
    return tail.strip().replace(",", "")


def looks_like_hub_id(spec: str) -> bool:
    """True when ``spec`` reads as a hub dataset id rather than a file path.

    ``openai/gsm8k`` and ``gsm8k`` do; ``/data/test.jsonl``, ``./x``, ``~/x``, ``a/b/c``
    and names ending in ``.json``/``.jsonl``/``.gz`` do not. Whether a path of that name
    exists is the caller's check (an existing path is always read as a file).
    """
    return (HUB_ID.fullmatch(spec) is not None and not spec.startswith(".")
            and not spec.endswith((".json", ".jsonl", ".gz")))


def gsm8k_record(rec: Any) -> tuple[str, str]:
    """``(question, final_answer)`` of one record.

    Raises:
        DataError: not an object with ``question``/``answer`` and a ``#### N`` final line.
    """
    try:
        return str(rec["question"]), gsm8k_final_answer(str(rec["answer"]))
    except (KeyError, TypeError) as e:
        raise DataError(f"not a GSM8K record with question/answer ({type(e).__name__}: {e})") from None


def iter_gsm8k_file(path: str | Path) -> Iterator[tuple[int, tuple[str, str] | DataError]]:
    """``(line number, (question, final_answer) or the line's DataError)`` per non-empty line.

    Raises:
        DataError: the path does not exist, is a folder or is not a regular file.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        what = ("is a folder, not a file" if p.is_dir() else "is not a regular file" if p.exists()
                else "does not exist")
        raise DataError(f"GSM8K file {p} {what}; give the path of a JSONL file with "
                        f"question/answer fields (the recipes' default is {DEFAULT_LOCATION})")
    with p.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield i, gsm8k_record(json.loads(line))
            except (json.JSONDecodeError, DataError) as e:
                yield i, DataError(f"{p}:{i}: not a GSM8K record with question/answer "
                                   f"and a '#### N' final line ({e})")


def load_gsm8k(path: str | Path) -> list[tuple[str, str]]:
    """Read a GSM8K JSONL file into ``(question, final_answer)`` pairs, in file order.

    Raises:
        DataError: the file is missing or empty, a line is not JSON, or a line lacks
            ``question``/``answer`` or the ``#### N`` answer line (the message gives the
            line number).
    """
    rows = []
    for _lineno, row in iter_gsm8k_file(path):
        if isinstance(row, DataError):
            raise row
        rows.append(row)
    if not rows:
        raise DataError(f"GSM8K file {Path(path).expanduser()} holds no records")
    return rows


def hub_dataset_rows(dataset_id: str, config: str | None, split: str) -> list[dict[str, Any]]:
    """The rows of split ``split`` of hub dataset ``dataset_id`` (``datasets.load_dataset``).

    Raises:
        ImportError: the ``datasets`` library is not installed.
        Exception: whatever ``datasets`` raises (offline, unknown id, config or split).
    """
    import datasets

    return [dict(row) for row in datasets.load_dataset(dataset_id, config, split=split)]


def load_gsm8k_hub(dataset_id: str, config: str | None = "main",
                   split: str = "test") -> list[tuple[str, str]]:
    """``(question, final_answer)`` pairs of a hub dataset in the GSM8K format.

    Args:
        dataset_id: e.g. ``openai/gsm8k``.
        config: its configuration (``main`` for openai/gsm8k; None = the default).
        split: ``train`` or ``test``.

    Raises:
        DataError: ``datasets`` is missing, the hub cannot be reached (offline) or does
            not have that dataset, config or split, or a row is malformed; the message
            says to pass a JSONL path instead.
    """
    where = f"hub dataset {dataset_id!r} (config {config!r}, split {split!r})"
    try:
        records = hub_dataset_rows(dataset_id, config, split)
    except ImportError:
        raise DataError(f"GSM8K: {dataset_id!r} is no existing file, and loading it as a "
                        f"{where} needs the `datasets` library (pip install '.[hub]'), which "
                        f"is not installed; {JSONL_HINT}.") from None
    except Exception as e:  # datasets raises many types: offline, not found, bad split
        msg = " ".join(str(e).split())[:300]
        raise DataError(f"GSM8K: {dataset_id!r} is no existing file, and loading it as a "
                        f"{where} failed ({type(e).__name__}: {msg}); offline, {JSONL_HINT}."
                        ) from None
    rows = []
    for i, rec in enumerate(records):
        try:
            rows.append(gsm8k_record(rec))
        except DataError as e:
            raise DataError(f"{where}, row {i}: {e}") from None
    if not rows:
        raise DataError(f"{where} holds no records")
    return rows


def load_gsm8k_any(spec: str | Path, split: str = "test", config: str | None = "main"
                   ) -> list[tuple[str, str]]:
    """GSM8K pairs from a JSONL path, or from the hub when ``spec`` is a dataset id.

    An existing path is read as JSONL (``load_gsm8k``); a missing one that looks like a
    hub id (``looks_like_hub_id``) is loaded from the hub (``load_gsm8k_hub``); any
    other missing path is a missing-file error.

    Raises:
        DataError: see ``load_gsm8k`` and ``load_gsm8k_hub``.
    """
    if isinstance(spec, str) and not Path(spec).expanduser().exists() and looks_like_hub_id(spec):
        return load_gsm8k_hub(spec, config, split)
    return load_gsm8k(spec)


@dataclass
class GSM8KSource:
    """GSM8K questions drawn uniformly from ``path``.

    Args:
        path: JSONL file (``question``, ``answer`` ending in ``#### N``), or a hub dataset
            id such as ``openai/gsm8k`` (see ``load_gsm8k_any``).
        split: label written into prompt ids (``train``/``test``); the split loaded from
            a hub dataset.
        name: domain name.
        hub_config: configuration of a hub dataset (``main`` for openai/gsm8k).

    Raises:
        DataError: see ``load_gsm8k_any``.
    """

    path: str
    split: str = "train"
    name: str = "gsm8k"
    hub_config: str | None = "main"
    rows: list[tuple[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rows = load_gsm8k_any(self.path, self.split, self.hub_config)

    def __len__(self) -> int:
        return len(self.rows)

    def prompt(self, index: int) -> Prompt:
        """Row ``index`` as a prompt (evaluation walks the rows in order)."""
        question, answer = self.rows[index]
        return gsm8k_prompt(question, answer, f"{self.name}/{self.split}/{index}", self.name)

    def draw(self, rng: np.random.Generator) -> Prompt:
        """One row chosen uniformly."""
        return self.prompt(int(rng.integers(len(self.rows))))


def gsm8k_prompt(question: str, answer: str, prompt_id: str, domain: str = "gsm8k") -> Prompt:
    """The chat prompt of one GSM8K question (the answer format asks for ``\\boxed{}``)."""
    return Prompt(prompt_id=prompt_id, domain=domain,
                  messages=user_prompt(f"{question}\n{ANSWER_FORMAT}"), reference=answer)
