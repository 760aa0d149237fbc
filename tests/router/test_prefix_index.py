"""The prefix index: hash chain, longest prefix match, removal and clearing."""

from __future__ import annotations

from router.prefix_index import PrefixIndex, chain_hashes


def test_chain_hashes_are_deterministic_and_cover_full_blocks_only() -> None:
    tokens = list(range(50))
    hashes = chain_hashes(tokens, block_size=16)
    assert len(hashes) == 3  # 50 tokens = 3 full blocks + 2 left over
    assert hashes == chain_hashes(tokens[:48], 16)
    assert all(0 <= h < 2**64 for h in hashes) and len(set(hashes)) == 3


def test_chain_hash_depends_on_the_whole_prefix() -> None:
    a = chain_hashes([1] * 16 + [2] * 16, 16)
    b = chain_hashes([9] * 16 + [2] * 16, 16)
    assert a[1] != b[1]  # same block tokens, different parent


def test_chain_continues_from_a_parent() -> None:
    tokens = list(range(64))
    whole = chain_hashes(tokens, 16)
    assert chain_hashes(tokens[32:], 16, parent=whole[1]) == whole[2:]


def test_longest_prefix_match_stops_at_first_missing_block() -> None:
    index = PrefixIndex()
    index.store("w0", [1, 2, 3, 4])
    index.store("w1", [1, 2])
    index.store("w1", [4])  # block 3 missing on w1: its chain breaks after 2
    assert index.longest_prefix_match([1, 2, 3, 4, 5]) == {"w0": 4, "w1": 2}
    assert index.longest_prefix_match([7, 1]) == {}
    assert index.longest_prefix_match([]) == {}


def test_removed_and_cleared_blocks_no_longer_match() -> None:
    index = PrefixIndex()
    index.store("w0", [1, 2, 3])
    index.store("w1", [1, 2, 3])
    index.remove("w0", [2, 99])
    assert index.longest_prefix_match([1, 2, 3]) == {"w0": 1, "w1": 3}
    index.clear("w1")
    assert index.longest_prefix_match([1, 2, 3]) == {"w0": 1}
    assert (len(index), index.blocks_of("w0"), index.blocks_of("w1")) == (2, 2, 0)
