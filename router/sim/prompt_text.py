"""Synthetic prompt text for simulated requests, with the trace's shared-prefix structure.

A text-matching router (``vllm_router``) needs ``Request.prompt_text``; a generated trace
has only lengths. A session's prompt text is built from the same three segments as its
KV block hashes (``router/sim/block_hashes.py``), each a fixed pseudo-random string:

- the class prefix (the class's system prompt, ``class_prefix_tokens``), the same for
  every session of the class;
- the group prefix (the GRPO group's task prompt, up to ``group_prefix_tokens``), the same
  for every sibling of the group;
- the session's own text, which grows turn by turn: turn k's prompt is a prefix of turn
  k+1's (append-only context), so the text tree sees the real history structure.

A prompt of L tokens is ``round(L * chars_per_token)`` characters (a fixed ratio; 4 is
typical of English text under BPE tokenizers). Segment strings are drawn from a 64-letter
alphabet, so two unrelated segments share their first character with probability 1/64
(an extra matched character or two, as unrelated real texts also have).
"""

from __future__ import annotations

import random
import string

from router.sim.errors import SimError
from router.sim.trace import TraceRecord, TraceSession

_ALPHABET = (string.ascii_letters + string.digits + " .").encode()  # 64 letters
_BYTE_TO_LETTER = bytes(_ALPHABET[b % len(_ALPHABET)] for b in range(256))


class PromptTexts:
    """Prompt text of each simulated request (module docstring).

    Args:
        chars_per_token: characters per prompt token (> 0).
        seed: makes the segment strings (and so the run) reproducible.

    Raises:
        SimError: ``chars_per_token`` <= 0.
    """

    def __init__(self, chars_per_token: float = 4.0, seed: int = 0) -> None:
        if not chars_per_token > 0:
            raise SimError(f"chars_per_token must be > 0, got {chars_per_token}; 4 is typical")
        self.chars_per_token = float(chars_per_token)
        self._seed = seed
        self._shared: dict[str, str] = {}  # class / group segments
        self._own: dict[str, str] = {}  # session id -> its own text (dropped at session end)

    def chars(self, tokens: int) -> int:
        """Characters of ``tokens`` tokens."""
        return round(tokens * self.chars_per_token)

    def _draw(self, key: str, n_chars: int) -> str:
        rng = random.Random(f"{self._seed}:{key}")
        return rng.randbytes(n_chars).translate(_BYTE_TO_LETTER).decode("ascii")

    def prompt(self, session: TraceSession, rec: TraceRecord) -> str:
        """The prompt text of ``rec`` (a request of ``session``)."""
        first = session.requests[0]
        cls_chars = self.chars(first.class_prefix_tokens)
        grp_chars = self.chars(max(first.group_prefix_tokens, first.class_prefix_tokens)) - cls_chars
        cls_key = f"c:{session.workload_class}:{cls_chars}"
        cls_text = self._shared.get(cls_key)
        if cls_text is None:
            cls_text = self._shared[cls_key] = self._draw(cls_key, cls_chars)
        grp_key = f"g:{session.group_id or session.session_id}:{grp_chars}"
        grp_text = self._shared.get(grp_key)
        if grp_text is None:
            grp_text = self._shared[grp_key] = self._draw(grp_key, grp_chars)
        own = self._own.get(session.session_id)
        if own is None:
            longest = max(r.prompt_tokens for r in session.requests)
            own = self._own[session.session_id] = self._draw(
                f"s:{session.session_id}", max(0, self.chars(longest) - cls_chars - grp_chars))
        n = self.chars(rec.prompt_tokens)
        if rec.session_end:
            self._own.pop(session.session_id, None)
        return (cls_text + grp_text + own)[:n]
