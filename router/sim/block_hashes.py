"""KV block hashes of simulated sessions, in the prefix index's hash space.

A synthetic session has no token ids, only lengths. Its context is append-only and made
of three segments: the class prefix (system prompt shared by every session of the class),
the group prefix (the GRPO group's prompt) and the session's own tokens. Block i of the
session is given a one-id content descriptor: the id of the segment that holds its last
token, combined with i. The chain is then ``router.prefix_index.chain_hashes`` over those
descriptors (one descriptor per block), so a hash depends on every earlier block, exactly
like vLLM's chained block hashes, and equal prefixes (same class prefix, same group
prompt) get equal hashes across sessions.

A recorded trace's ``prompt_hashes`` are used as they are for the prompt's blocks.
"""

from __future__ import annotations

from router.prefix_index import chain_hashes

_SEGMENT_STRIDE = 1 << 24  # block index space per segment id (blocks of one session < 16M)


class SessionChain:
    """Lazily extended hash chain of one session's context.

    Args:
        class_key, group_key, session_key: distinct non-negative ints naming the segments.
        class_prefix_tokens, group_prefix_tokens: segment ends in tokens (class <= group).
        block_size: tokens per KV block.
        shared: a dict shared by all sessions, caching chains of shared prefixes.
    """

    __slots__ = ("_keys", "_ends", "block_size", "hashes", "_shared")

    def __init__(self, class_key: int, group_key: int, session_key: int, *, class_prefix_tokens: int,
                 group_prefix_tokens: int, block_size: int, shared: dict) -> None:
        self._keys = (class_key, group_key, session_key)
        self._ends = (class_prefix_tokens, max(group_prefix_tokens, class_prefix_tokens))
        self.block_size = block_size
        self.hashes: list[int] = []
        self._shared = shared
        # Blocks inside the group prefix are shared by every session of the group.
        n_group = self._ends[1] // block_size
        if n_group:
            key = ("g", group_key, class_key, self._ends, block_size)
            chain = shared.get(key)
            if chain is None:
                chain = shared[key] = self._extend_from([], n_group)
            self.hashes = list(chain)

    def _descriptor(self, i: int) -> int:
        last_token = (i + 1) * self.block_size  # one past the block's last token
        seg = 0 if last_token <= self._ends[0] else (1 if last_token <= self._ends[1] else 2)
        return (self._keys[seg] * 3 + seg) * _SEGMENT_STRIDE + i

    def _extend_from(self, chain: list[int], n_blocks: int) -> list[int]:
        if n_blocks <= len(chain):
            return chain
        desc = [self._descriptor(i) for i in range(len(chain), n_blocks)]
        return chain + chain_hashes(desc, 1, parent=chain[-1] if chain else None)

    def blocks(self, n_blocks: int) -> list[int]:
        """The first ``n_blocks`` hashes (extends the chain as needed; returns the live list)."""
        if n_blocks > len(self.hashes):
            self.hashes = self._extend_from(self.hashes, n_blocks)
        return self.hashes
