"""Paged KV cache with a hash-chained prefix cache (vLLM v1 ``KVCacheManager`` semantics).

The pool has ``num_blocks`` blocks of ``block_size`` tokens. A block is in one of three
states, and only counts are kept for the first (no per-block scan ever happens):

- *private*: held by a request, no hash (the partial tail block, or a full block whose
  hash another block already caches);
- *cached, referenced*: a full block with a chained hash, ``ref[hash]`` requests hold it;
- *cached, free*: a full block nobody holds; it stays reusable until evicted, oldest first
  (``lru``: an OrderedDict, so acquire / release / evict are O(1) per block).

A request's blocks are freed tail first, so that the tail of a prefix is evicted before
its head (vLLM: "free blocks in reverse order so that the tail blocks are evicted first").
Every change a router would learn about is recorded as a KV event (BlockStored /
BlockRemoved / AllBlocksCleared) for the engine to publish.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class KVHolding:
    """The blocks one request holds: hashes it references (in chain order) and private blocks."""

    ref_hashes: list[int] = field(default_factory=list)
    n_private: int = 0

    @property
    def num_blocks(self) -> int:
        """Blocks held in total."""
        return len(self.ref_hashes) + self.n_private


class KVCache:
    """One engine's KV block pool and prefix cache.

    Args:
        num_blocks: blocks in the pool (> 0).
        block_size: tokens per block (> 0).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.n_private = 0
        # KV events since the last drain: ("stored" | "removed", hashes) or ("cleared", ()).
        self.events: list[tuple[str, list[int]]] = []

    # ------------------------------------------------------------------ accounting
    @property
    def num_free_blocks(self) -> int:
        """Blocks neither held nor cached."""
        return self.num_blocks - len(self.ref) - len(self.lru) - self.n_private

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests (what ``vllm:kv_cache_usage_perc`` counts)."""
        return len(self.ref) + self.n_private

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests, 0-1."""
        return self.num_used_blocks / self.num_blocks

    def can_allocate(self, n_blocks: int) -> bool:
        """True if ``n_blocks`` new blocks fit after evicting free cached blocks."""
        return n_blocks <= self.num_free_blocks + len(self.lru)

    # ------------------------------------------------------------------ prefix cache
    def match_prefix(self, hashes: list[int], max_blocks: int) -> int:
        """Leading blocks of ``hashes`` (at most ``max_blocks``) found in the cache."""
        n = 0
        ref, lru = self.ref, self.lru
        for h in hashes[:max_blocks]:
            if h in ref or h in lru:
                n += 1
            else:
                break
        return n

    def acquire(self, holding: KVHolding, hashes: list[int]) -> None:
        """Reference cached blocks ``hashes`` (a prefix hit) for ``holding``; they must be cached."""
        ref, lru = self.ref, self.lru
        for h in hashes:
            if h in lru:
                del lru[h]
                ref[h] = 1
            else:
                ref[h] += 1
        holding.ref_hashes.extend(hashes)

    # ------------------------------------------------------------------ allocation
    def allocate(self, holding: KVHolding, n_blocks: int) -> bool:
        """Give ``holding`` ``n_blocks`` new private blocks, evicting LRU cached blocks if needed.

        Returns False (and changes nothing) when they do not fit.
        """
        if n_blocks <= 0:
            return True
        if not self.can_allocate(n_blocks):
            return False
        short = n_blocks - self.num_free_blocks
        if short > 0:
            removed = []
            lru = self.lru
            for _ in range(short):
                removed.append(lru.popitem(last=False)[0])
            self.events.append(("removed", removed))
        self.n_private += n_blocks
        holding.n_private += n_blocks
        return True

    def cache_full_blocks(self, holding: KVHolding, hashes: list[int]) -> None:
        """Turn private blocks of ``holding`` that just became full into cached blocks.

        ``hashes`` are their chained hashes in order. A hash already cached (a sibling
        computed the same block concurrently) stays a private duplicate, as in vLLM.
        """
        stored = []
        ref, lru = self.ref, self.lru
        for h in hashes:
            if h in ref or h in lru:
                continue
            ref[h] = 1
            holding.ref_hashes.append(h)
            stored.append(h)
        if stored:
            self.n_private -= len(stored)
            holding.n_private -= len(stored)
            self.events.append(("stored", stored))

    def free(self, holding: KVHolding) -> None:
        """Release every block of ``holding``: cached ones become evictable, tail first."""
        ref, lru = self.ref, self.lru
        for h in reversed(holding.ref_hashes):
            c = ref[h] - 1
            if c:
                ref[h] = c
            else:
                del ref[h]
                lru[h] = None
        self.n_private -= holding.n_private
        holding.ref_hashes = []
        holding.n_private = 0

    def reset(self, holdings: list[KVHolding]) -> None:
        """Drop every cached hash (weight sync, vLLM ``reset_prefix_cache``).

        Free cached blocks become free; blocks ``holdings`` (every live request) hold
        stay allocated but lose their hash, so nothing computed before the reset is reused.
        """
        self.lru.clear()
        self.n_private += len(self.ref)
        self.ref.clear()
        for holding in holdings:
            holding.n_private += len(holding.ref_hashes)
            holding.ref_hashes = []
        self.events.append(("cleared", []))

    def drain_events(self) -> list[tuple[str, list[int]]]:
        """Return and forget the KV events recorded since the last call."""
        out, self.events = self.events, []
        return out
