"""An approximate radix tree over request text, per instance (the vLLM Router's cache_aware).

The router cannot see the engines' caches, so it *guesses* them: every text it routes to
instance w is inserted into one shared character radix tree, each node tagged with the
instances ("tenants") that were sent a text passing through it and a last-access stamp.
Tenant sets are closed upwards (a node's tenants include its children's), so the deepest
node a text reaches names every tenant that matched it longest. Each tenant's share of the
tree is bounded (``max_size_chars``): :meth:`evict` removes that tenant from its
least-recently-stamped leaves until it fits; the policy calls it on a timer.

Two stamp rules (``lru``):

- ``"wall_clock"``: every node on an inserted path is stamped with the caller's ``now``.
- ``"vllm_router"``: vllm-router 0.1.17 (``src/tree.rs``): stamps are ticks of one
  counter that advances once per insert and once per match; an insert stamps only the
  node its text ends on, a node the tenant newly passes through gets stamp 0, and a match
  re-stamps the node it stopped on every 8th tick. ``now`` is not used in this mode.

:meth:`prefix_match` is the real router's match: the matched depth in the union tree and
*one* tenant of the node it stopped on, the one whose insert created that node (cached per
node, as ``last_tenant`` in ``tree.rs``); when that tenant was evicted from the node, the
first remaining tenant in tagging order (``tree.rs`` takes a DashMap's first entry, which
is arbitrary), which becomes the node's cached tenant.

Written for this project after reading vllm-project/router's ``src/tree.rs``; no code is
shared.
"""

from __future__ import annotations

import heapq
from itertools import count
from typing import Literal

_MATCH_RESTAMP_EVERY = 8
"""tree.rs re-stamps a matched node when ``tick & 0x7 == 0`` (to cut lock contention)."""


class _Node:
    __slots__ = ("children", "text", "parent", "tenants", "creator", "serial")

    def __init__(self, text: str, parent: _Node | None, creator: str | None, serial: int) -> None:
        self.children: dict[str, _Node] = {}  # first char of child's text -> child
        self.text = text  # edge label from parent
        self.parent = parent
        self.tenants: dict[str, float] = {}  # tenant -> last-access stamp
        self.creator = creator  # tenant whose insert created the node (tree.rs last_tenant)
        self.serial = serial  # creation order: a deterministic tie-break among equal stamps


class ApproxPrefixTree:
    """Character radix tree tagged with tenants (instances) and last-access stamps.

    Args:
        lru: the stamp rule, ``"wall_clock"`` or ``"vllm_router"`` (module docstring).
    """

    def __init__(self, lru: Literal["wall_clock", "vllm_router"] = "wall_clock") -> None:
        if lru not in ("wall_clock", "vllm_router"):
            raise ValueError(f"lru must be 'wall_clock' or 'vllm_router', got {lru!r}")
        self.lru = lru
        self._serials = count()
        self._root = _Node("", None, None, next(self._serials))
        self._chars: dict[str, int] = {}  # tenant -> chars of the tree it is tagged on
        self._tick = 0  # vllm_router stamps: one tick per insert and per match

    def _next_tick(self) -> int:
        t = self._tick
        self._tick += 1
        return t

    def insert(self, text: str, tenant: str, now: float = 0.0) -> None:
        """Record that ``text`` was sent to ``tenant`` (``now``: seconds, wall_clock stamps only)."""
        faithful = self.lru == "vllm_router"
        node = self._root
        if faithful:
            node.tenants.setdefault(tenant, 0)  # the root is never evicted; tree.rs stamps it 0
        else:
            node.tenants[tenant] = now
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                child = _Node(text[i:], node, tenant, next(self._serials))
                node.children[text[i]] = child
            else:
                common = _common_prefix_len(child.text, text, i)
                if common < len(child.text):
                    child = self._split(child, common)
            if tenant not in child.tenants:
                self._chars[tenant] = self._chars.get(tenant, 0) + len(child.text)
                child.tenants[tenant] = 0 if faithful else now
            elif not faithful:
                child.tenants[tenant] = now
            node = child
            i += len(child.text)
        if faithful:
            node.tenants[tenant] = self._next_tick()  # only the node the text ends on
        self._chars.setdefault(tenant, 0)

    def _split(self, child: _Node, at: int) -> _Node:
        """Split ``child``'s edge after ``at`` chars; return the new upper node."""
        parent = child.parent
        upper = _Node(child.text[:at], parent, child.creator, next(self._serials))
        upper.tenants = dict(child.tenants)
        parent.children[upper.text[0]] = upper
        child.text = child.text[at:]
        child.parent = upper
        upper.children[child.text[0]] = child
        return upper

    def _path(self, text: str):
        """Yield ``(node, matched chars up to and in it)`` along ``text``'s path from the root;
        a partial edge match yields that edge's node last."""
        node, i = self._root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                return
            common = _common_prefix_len(child.text, text, i)
            yield child, i + common
            if common < len(child.text):
                return
            node, i = child, i + common

    def match(self, text: str) -> dict[str, int]:
        """Matched characters of ``text`` per tenant: ``{tenant: chars}`` (tenants with >= 1).

        A partial match inside an edge counts the matched characters of that edge.
        """
        out: dict[str, int] = {}
        for node, depth in self._path(text):
            for tenant in node.tenants:
                out[tenant] = depth
        return out

    def prefix_match(self, text: str) -> tuple[str | None, int]:
        """vllm-router's match: ``(tenant, matched_chars)``; ``(None, 0)`` when nothing matched.

        ``matched_chars`` is how deep ``text`` goes into the tree (any tenant); ``tenant``
        is the creator of the node it stopped on, else that node's first remaining tenant
        (module docstring). In ``vllm_router`` mode the call advances the stamp counter and
        re-stamps that node's tenant every 8th tick, as ``tree.rs`` does.
        """
        node, matched = self._root, 0
        for node, matched in self._path(text):
            pass
        tenant = node.creator if node.creator in node.tenants else next(iter(node.tenants), None)
        node.creator = tenant
        if self.lru == "vllm_router":
            tick = self._next_tick()
            if tenant is not None and tick % _MATCH_RESTAMP_EVERY == 0:
                node.tenants[tenant] = tick
        if matched == 0:
            return None, 0
        return tenant, matched

    def tenant_sizes_chars(self) -> dict[str, int]:
        """``{tenant: characters tagged}`` for every tenant."""
        return dict(self._chars)

    def size_chars(self, tenant: str) -> int:
        """Characters of the tree tagged with ``tenant``."""
        return self._chars.get(tenant, 0)

    def evict(self, max_size_chars: int) -> int:
        """Untag each tenant from its least-recently-stamped leaves until it holds <= ``max_size_chars``.

        Equal stamps go oldest node first. Returns the number of (node, tenant) tags
        removed; nodes left untagged are deleted.
        """
        removed = 0
        for tenant, size in list(self._chars.items()):
            if size <= max_size_chars:
                continue
            heap = [(n.tenants[tenant], n.serial, n) for n in self._tenant_leaves(tenant)]
            heapq.heapify(heap)
            while heap and self._chars[tenant] > max_size_chars:
                _, _, node = heapq.heappop(heap)
                del node.tenants[tenant]
                self._chars[tenant] -= len(node.text)
                removed += 1
                parent = node.parent
                if not node.tenants:
                    del parent.children[node.text[0]]
                if parent is not self._root and not any(tenant in c.tenants for c in parent.children.values()):
                    heapq.heappush(heap, (parent.tenants[tenant], parent.serial, parent))
        return removed

    def remove_tenant(self, tenant: str) -> None:
        """Forget ``tenant`` everywhere (instance removed or its cache reset)."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            node.tenants.pop(tenant, None)
            for key, child in list(node.children.items()):
                if tenant in child.tenants:
                    stack.append(child)
                    if len(child.tenants) == 1:
                        del node.children[key]
        self._chars.pop(tenant, None)

    def _tenant_leaves(self, tenant: str) -> list[_Node]:
        leaves, stack = [], [self._root]
        while stack:
            node = stack.pop()
            tagged = [c for c in node.children.values() if tenant in c.tenants]
            if not tagged and node is not self._root:
                leaves.append(node)
            stack.extend(tagged)
        return leaves


def _common_prefix_len(edge: str, text: str, offset: int) -> int:
    """Characters ``edge`` and ``text[offset:]`` share at the start (C-speed compares:
    simulated agent prompts are ~10^5 characters)."""
    if text.startswith(edge, offset):
        return len(edge)
    lo, hi = 0, min(len(edge), len(text) - offset)  # edge[:lo] matches, edge[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(edge[:mid], offset):
            lo = mid
        else:
            hi = mid - 1
    return lo
