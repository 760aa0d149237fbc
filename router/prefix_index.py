"""The prefix index (paper section 4.4): KV block hash -> instances that cache it.

Block hashes are the project's own hash chain over *full* KV blocks
(:func:`chain_hashes`): block i's hash covers its tokens and block i-1's hash, so equal
hashes mean equal prefixes. The live router translates the engines' BlockStored token
ids into this space, the simulator hashes its own blocks the same way, and requests
carry their prompt's chain (``Request.block_hashes``).

Layout, chosen for memory (1,000,000 blocks in well under 300 MB, see
bench/router_decision.py): ``hash -> bitmask of instance slots`` (one int per block,
no per-block set objects) plus, per instance, the set of its hashes so that
``AllBlocksCleared`` and instance removal are O(blocks of that instance).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Sequence

_ROOT_PARENT = 0


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Hash chain over the full blocks of ``token_ids``.

    Args:
        token_ids: token ids, in order; a trailing partial block is ignored.
        block_size: tokens per KV block (the engine's block size).
        parent: hash of the block before ``token_ids[0]`` (to continue a chain), or None
            at the start of a prompt.

    Returns:
        one unsigned 64-bit int per full block: blake2b(parent || tokens, 8 bytes).

    Raises:
        ValueError: ``block_size`` < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 token, got {block_size}")
    out: list[int] = []
    prev = _ROOT_PARENT if parent is None else parent
    tokens = array("q", token_ids)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.blake2b(prev.to_bytes(8, "little"), digest_size=8)
        digest.update(tokens[start : start + block_size].tobytes())
        prev = int.from_bytes(digest.digest(), "little")
        out.append(prev)
    return out


class PrefixIndex:
    """Block hash -> instances holding it, fed by BlockStored/BlockRemoved/AllBlocksCleared."""

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}  # instance -> bit position
        self._by_hash: dict[int, int] = {}  # block hash -> bitmask of instance slots
        self._by_instance: dict[str, set[int]] = {}

    def _slot_of(self, instance: str) -> int:
        slot = self._slot.get(instance)
        if slot is None:
            slot = self._slot[instance] = len(self._slot)
            self._by_instance[instance] = set()
        return slot

    def store(self, instance: str, block_hashes: Iterable[int]) -> None:
        """Record that ``instance`` now caches ``block_hashes`` (KV event BlockStored)."""
        bit = 1 << self._slot_of(instance)
        mine = self._by_instance[instance]
        by_hash = self._by_hash
        for h in block_hashes:
            by_hash[h] = by_hash.get(h, 0) | bit
            mine.add(h)

    def remove(self, instance: str, block_hashes: Iterable[int]) -> None:
        """Forget ``block_hashes`` on ``instance`` (KV event BlockRemoved); unknown hashes are ignored."""
        if instance not in self._slot:
            return
        bit = 1 << self._slot[instance]
        mine = self._by_instance[instance]
        for h in block_hashes:
            mine.discard(h)
            self._drop_bit(h, bit)

    def clear(self, instance: str) -> None:
        """Forget every block of ``instance`` (KV event AllBlocksCleared, weight sync)."""
        if instance not in self._slot:
            return
        bit = 1 << self._slot[instance]
        mine = self._by_instance[instance]
        for h in mine:
            self._drop_bit(h, bit)
        mine.clear()

    def _drop_bit(self, h: int, bit: int) -> None:
        mask = self._by_hash.get(h)
        if mask is None:
            return
        mask &= ~bit
        if mask:
            self._by_hash[h] = mask
        else:
            del self._by_hash[h]

    def longest_prefix_match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Matched leading blocks per instance: ``{instance: blocks}`` for instances with >= 1.

        Block i counts for an instance only if blocks 0..i all do (a chain breaks at the
        first missing block). Cost: one dict lookup per matched block.
        """
        matched: dict[str, int] = {}
        alive = -1  # all slots
        by_hash = self._by_hash
        depth = 0
        for depth, h in enumerate(block_hashes):
            now_alive = alive & by_hash.get(h, 0)
            if now_alive != alive and depth:
                self._record(alive & ~now_alive, depth, matched)
            alive = now_alive
            if not alive:
                return matched
        else:
            if block_hashes and alive:
                self._record(alive, depth + 1, matched)
        return matched

    def _record(self, mask: int, blocks: int, out: dict[str, int]) -> None:
        for instance, slot in self._slot.items():
            if mask >> slot & 1:
                out[instance] = blocks

    def blocks_of(self, instance: str) -> int:
        """How many distinct blocks ``instance`` caches per the index."""
        return len(self._by_instance.get(instance, ()))

    def __len__(self) -> int:
        """Distinct block hashes cached anywhere."""
        return len(self._by_hash)

    def state(self) -> dict:
        """Sizes for /state: distinct blocks and blocks per instance."""
        return {"blocks": len(self._by_hash), "blocks_per_instance": {i: len(s) for i, s in self._by_instance.items()}}
