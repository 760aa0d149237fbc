"""Rendering an episode into exact token ids with the model's chat template (ChatML).

The agent loop never re-tokenizes what the model wrote: the trajectory is a list of token
ids that grows by (a) template and observation tokens we encode, and (b) the completion
token ids the engine returned. The next model call sends exactly these ids as the
``/v1/completions`` prompt, so what the trainer sees is what the engine saw.

ChatML (SmolLM2, Qwen, Hermes)::

    <|im_start|>system\n{tools prompt}<|im_end|>\n
    [<|im_start|>user\n{demonstrated problem}<|im_end|>\n<|im_start|>assistant\n{its call}<|im_end|>\n ...]
    <|im_start|>user\n{problem}<|im_end|>\n
    <|im_start|>assistant\n{model tokens ... <|im_end|>}\n<|im_start|>user\n
    <tool_response>\n{observation}\n</tool_response><|im_end|>\n<|im_start|>assistant\n ...

Special tokens split the text before byte-pair encoding (HF tokenizers do this), so
encoding the pieces separately gives the same ids as encoding the whole text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence


class Tokenizer(Protocol):
    """What the loop needs from a tokenizer (HF tokenizers are wrapped by ``HFTokenizer``)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens in it recognised, nothing added."""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens kept."""

    def token_id(self, token: str) -> int:
        """Id of one special token such as ``<|im_end|>``."""


class HFTokenizer:
    """A transformers ``AutoTokenizer`` (from a local model folder) as a ``Tokenizer``."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_id(self, token: str) -> int:
        tid = self.tok.convert_tokens_to_ids(token)
        if tid is None or tid == self.tok.unk_token_id:
            raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary")
        return tid


class ByteTokenizer:
    """Bytes as tokens (ids 0-255) plus ChatML special tokens (256 ...).

    For scripted policies and tests that run without a model; exact and reversible.
    """

    SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")

    def __init__(self) -> None:
        self._special_ids = {t: 256 + i for i, t in enumerate(self.SPECIALS)}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self.SPECIALS) + ")")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self._special_ids:
                ids.append(self._special_ids[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int]) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
            else:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(self.SPECIALS[i - 256])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_id(self, token: str) -> int:
        return self._special_ids[token]


@dataclass(frozen=True)
class ChatFormat:
    """The chat template's pieces (defaults: ChatML as SmolLM2-Instruct and Qwen use it).

    Attributes:
        message: a whole message; ``{role}`` and ``{content}`` are filled in.
        generation_prompt: opens the assistant's turn.
        end_token: the token that ends a model turn (also the stop token).
        after_end: text the template puts after ``end_token`` before the next message.
        observation_role: role of the message carrying a tool result.
        observation: wraps one tool result (``{content}``); several are joined by newline.
    """

    message: str = "<|im_start|>{role}\n{content}<|im_end|>\n"
    generation_prompt: str = "<|im_start|>assistant\n"
    end_token: str = "<|im_end|>"
    after_end: str = "\n"
    observation_role: str = "user"
    observation: str = "<tool_response>\n{content}\n</tool_response>"


@dataclass
class Trajectory:
    """Token-level record of one episode, built turn by turn.

    Attributes:
        token_ids: the whole sequence sent to and produced by the model.
        loss_mask: 1 where the model produced the token, 0 for prompt, template and
            tool-observation tokens; same length as ``token_ids``.
        logprobs: the engine's log-probability of each model token (None elsewhere or
            when the engine gave none).
        prompt_len: length of the first prompt (system, demonstrations, task), in tokens.
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    prompt_len: int = 0

    def add_context(self, ids: list[int]) -> None:
        """Append tokens the model did not produce."""
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [None] * len(ids)

    def add_model(self, ids: list[int], logprobs: list[float | None]) -> None:
        """Append tokens the model produced, with their log-probs (same length)."""
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} model tokens but {len(logprobs)} log-probs")
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs

    def __len__(self) -> int:
        return len(self.token_ids)


class ChatRenderer:
    """Encodes messages, observations and turn boundaries into token ids.

    Args:
        tokenizer: the model's tokenizer.
        fmt: the chat template's pieces.
    """

    def __init__(self, tokenizer: Tokenizer, fmt: ChatFormat = ChatFormat()) -> None:
        self.tok = tokenizer
        self.fmt = fmt
        self.end_token_id = tokenizer.token_id(fmt.end_token)

    def first_prompt(self, system: str, user: str,
                     demonstrations: Sequence[tuple[str, str]] = ()) -> list[int]:
        """System message, then each demonstration as a user message and the assistant's
        answer to it (in-context examples, earlier turns of the same conversation), then
        the user message and the assistant's generation prompt.

        Args:
            system: the system message's text.
            user: the task's text.
            demonstrations: (user text, assistant text) pairs, in order.
        """
        shown = "".join(self.fmt.message.format(role="user", content=asked)
                        + self.fmt.message.format(role="assistant", content=answered)
                        for asked, answered in demonstrations)
        text = (self.fmt.message.format(role="system", content=system) + shown
                + self.fmt.message.format(role="user", content=user)
                + self.fmt.generation_prompt)
        return self.tok.encode(text)

    def close_model_turn(self, completion_ids: list[int]) -> list[int]:
        """Template tokens that must follow a model turn: the end token when the model
        stopped without one (length limit), then ``after_end``."""
        tail = [] if completion_ids and completion_ids[-1] == self.end_token_id else [self.end_token_id]
        return tail + self.tok.encode(self.fmt.after_end)

    def observation_turn(self, observations: list[str]) -> list[int]:
        """A message carrying tool results, then the assistant's generation prompt."""
        content = "\n".join(self.fmt.observation.format(content=o) for o in observations)
        text = (self.fmt.message.format(role=self.fmt.observation_role, content=content)
                + self.fmt.generation_prompt)
        return self.tok.encode(text)

    def model_text(self, completion_ids: list[int]) -> str:
        """The model turn's text without the end token (for the tool-call parser)."""
        ids = completion_ids[:-1] if completion_ids and completion_ids[-1] == self.end_token_id else completion_ids
        return self.tok.decode(ids)
