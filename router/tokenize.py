"""Prompt -> token ids -> KV block hashes, as the router sees an OpenAI request body.

The policy needs, per request, the prompt length L_r in tokens (MISA-T Eq. 1, Eq. 7) and
the chained hashes of the prompt's full KV blocks (the prefix index's key, paper
section 4.4). The engine computes its own hashes over the token ids it prefills, so the
router must tokenize exactly as the engine does:

- ``/v1/chat/completions``: the model's chat template via
  ``AutoTokenizer.apply_chat_template(messages, add_generation_prompt=True)``;
- ``/v1/completions``: the ``prompt`` string (tokenized with special tokens, as vLLM
  does) or a list of token ids taken as is.

A null ``content`` (an assistant tool-call turn) is rendered as ``""`` and the body's
``tools`` are passed to the template, as the engine does. Where the template cannot render
the messages anyway, the prefix is unknown: the request is placed without one and forwarded
(the engine judges it). Without a tokenizer (``model.path`` unset) token lists are still
used as is; text prompts (and unrenderable messages) get ``block_hashes=()`` (no prefix
matching) and ``prompt_tokens`` estimated as
``ceil(chars / CHARS_PER_TOKEN)``, a rough English average that only feeds KV-demand
estimates.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

from common.config import missing_local_path
from router.policies.base import RouterConfigError
from router.prefix_index import chain_hashes

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4.0
"""Characters per token for the no-tokenizer estimate of ``prompt_tokens``."""

Endpoint = Literal["chat", "completions"]


class PromptError(ValueError):
    """The request body's prompt cannot be read (wrong shape); a 400 for the client."""


@dataclass(frozen=True)
class PromptInfo:
    """What the router derives from one prompt.

    Attributes:
        prompt_tokens: L_r, prompt length in tokens (exact with a tokenizer or token
            list, else estimated from characters).
        block_hashes: chained hashes of the full KV blocks of the prompt, in order, in
            the prefix index's hash space; () when the token ids or block size are unknown.
        prompt_text: the prompt as text (chat: the rendered template, or the messages'
            contents joined when there is no tokenizer).
    """

    prompt_tokens: int
    block_hashes: tuple[int, ...]
    prompt_text: str


@functools.lru_cache(maxsize=4)
def load_tokenizer(model_path: str):
    """Load (once per path) the Hugging Face tokenizer of ``model_path``.

    Args:
        model_path: a local model folder or a hub id.

    Raises:
        RouterConfigError: the path (or hub id) holds no loadable tokenizer.
    """
    missing = missing_local_path("model.path", model_path,
                                 " or model.path=null to route without a tokenizer")
    if missing:  # at once: transformers would take a minute to say so
        raise RouterConfigError(missing)
    from transformers import AutoTokenizer  # heavy import, only when a model is configured

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        raise RouterConfigError(
            f"model.path={model_path!r} holds no tokenizer ({exc}); give a model folder or hub id with a "
            "tokenizer, or model.path=null to route without one"
        ) from None


def _message_text(messages: list[Any]) -> str:
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # OpenAI content parts
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


def _for_template(messages: list[dict]) -> list[dict]:
    """``messages`` as chat templates can render them: a null ``content`` (an assistant
    turn that only calls tools) becomes ``""``, since templates join content with ``+``."""
    return [{**m, "content": ""} if m.get("content") is None else m for m in messages]


_UNRENDERED_LOGGED: set[str] = set()


def _log_unrendered(exc: Exception) -> None:
    """One warning per kind of template failure (the requests are still forwarded)."""
    kind = type(exc).__name__
    if kind not in _UNRENDERED_LOGGED:
        _UNRENDERED_LOGGED.add(kind)
        log.warning("the chat template cannot render a request's messages (%s: %s); such requests are placed "
                    "without a prefix (no cache affinity) and forwarded (further %s failures are not logged)",
                    kind, exc, kind)


def _is_token_list(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


MAX_TOKEN_ID = 2**63 - 1
"""Largest token id accepted without a tokenizer (block hashing packs ids as int64)."""


def _check_messages(messages: Any) -> list[dict]:
    """``messages`` as OpenAI chat messages: objects with a string ``role`` and a
    ``content`` that is a string, null, or a list of content-part objects.

    Raises:
        PromptError: the first message that is not, named by its index.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise PromptError("'messages' must be a list of message objects")
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise PromptError(f"'messages[{i}].role' must be a string such as \"user\"")
        content = m.get("content")
        if not (content is None or isinstance(content, str)
                or isinstance(content, list) and all(isinstance(p, dict) for p in content)):
            raise PromptError(f"'messages[{i}].content' must be a string, null or a list of content-part objects")
    return messages


def _check_token_ids(ids: list[int], vocab_size: int | None) -> None:
    """Raises PromptError for a token id outside [0, vocab_size) (or [0, 2^63) without a tokenizer)."""
    limit = vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1
    bad = next((t for t in ids if not 0 <= t < limit), None)
    if bad is not None:
        raise PromptError(f"'prompt' token id {bad} is out of range: ids must be in [0, {limit})")


class PromptTokenizer:
    """Turns request bodies into :class:`PromptInfo` for one model and block size.

    Args:
        model_path: tokenizer source (``model.path``), or None for the estimate.
        block_size: engine KV block size in tokens, or None while unknown (then
            ``block_hashes`` stay empty); may be set later via ``block_size``.

    ``prompt_info`` is CPU work (templating, tokenizing): the server calls it in a
    thread pool when ``needs_thread`` is True.
    """

    def __init__(self, model_path: str | None, block_size: int | None = None) -> None:
        self.model_path = model_path or None
        self.block_size = block_size
        self._tokenizer = load_tokenizer(self.model_path) if self.model_path else None

    @property
    def needs_thread(self) -> bool:
        """True when ``prompt_info`` runs a real tokenizer (worth moving off the event loop)."""
        return self._tokenizer is not None

    def token_ids(self, body: dict, endpoint: Endpoint) -> tuple[list[int] | None, str]:
        """The prompt's token ids (None without a tokenizer) and its text.

        Ids are None also when the chat template cannot render the messages (the
        prefix is then unknown; the engine, not the router, judges the request).

        Raises:
            PromptError: ``messages`` is not a list of messages (string ``role``; string,
                null or content-part list ``content``); ``prompt`` is neither a string nor a list of token ids (a list of
                prompts is read as its first), or holds an id outside the vocabulary.
        """
        if endpoint == "chat":
            messages = _check_messages(body.get("messages"))
            if self._tokenizer is None:
                return None, _message_text(messages)
            tools = body.get("tools")
            try:
                text = self._tokenizer.apply_chat_template(
                    _for_template(messages), tools=tools if isinstance(tools, list) else None,
                    add_generation_prompt=True, tokenize=False,
                )
            except Exception as exc:  # the template raises what it likes on content it cannot render
                # Not the router's call: the engine decides what is invalid. The request is
                # placed without a prefix (unknown) and forwarded unchanged.
                _log_unrendered(exc)
                return None, _message_text(messages)
            # The template already holds the special tokens (BOS); vLLM does not add more.
            return self._tokenizer.encode(text, add_special_tokens=False), text
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not _is_token_list(prompt):
            prompt = prompt[0]  # a batch of prompts: place the batch by its first
        if _is_token_list(prompt):
            ids = list(prompt)
            _check_token_ids(ids, len(self._tokenizer) if self._tokenizer is not None else None)
            text = self._tokenizer.decode(ids) if self._tokenizer is not None else ""
            return ids, text
        if not isinstance(prompt, str):
            raise PromptError("'prompt' must be a string, a list of token ids, or a list of those")
        if self._tokenizer is None:
            return None, prompt
        return self._tokenizer.encode(prompt, add_special_tokens=True), prompt

    def prompt_info(self, body: dict, endpoint: Endpoint) -> PromptInfo:
        """Prompt length and block hashes of one request body (see module docstring).

        Raises:
            PromptError: as :meth:`token_ids`.
        """
        ids, text = self.token_ids(body, endpoint)
        if ids is None:
            return PromptInfo(math.ceil(len(text) / CHARS_PER_TOKEN), (), text)
        hashes = tuple(chain_hashes(ids, self.block_size)) if self.block_size else ()
        return PromptInfo(len(ids), hashes, text)
