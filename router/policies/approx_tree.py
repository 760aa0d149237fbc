"""An approximate radix tree over request text, per instance (the vLLM Router's cache_aware).

The router cannot see the engines' caches, so it *guesses* them: every text it routes to
instance w is inserted into one shared character radix tree, each node tagged with the
instances ("tenants") that were sent a text passing through it and when. A new request's
match length on w is the depth of the deepest node on its path tagged with w. Each
tenant's share of the tree is bounded (``max_size_chars``): :meth:`evict` removes that
tenant from its least-recently-used leaves until it fits; the policy calls it on a timer.

Written for this project after reading how vllm-project/router structures its tree
(text, not tokens; per-tenant LRU leaf eviction); no code is shared.
"""

from __future__ import annotations

import heapq


class _Node:
    __slots__ = ("children", "text", "parent", "tenants")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.children: dict[str, _Node] = {}  # first char of child's text -> child
        self.text = text  # edge label from parent
        self.parent = parent
        self.tenants: dict[str, float] = {}  # tenant -> last access time (s)


class ApproxPrefixTree:
    """Character radix tree tagged with tenants (instances) and last-access times."""

    def __init__(self) -> None:
        self._root = _Node("", None)
        self._chars: dict[str, int] = {}  # tenant -> chars of the tree it is tagged on

    def insert(self, text: str, tenant: str, now: float) -> None:
        """Record that ``text`` was sent to ``tenant`` at ``now`` (seconds)."""
        node = self._root
        node.tenants[tenant] = now
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                child = _Node(text[i:], node)
                node.children[text[i]] = child
            else:
                common = _common_prefix_len(child.text, text, i)
                if common < len(child.text):
                    child = self._split(child, common)
            if tenant not in child.tenants:
                self._chars[tenant] = self._chars.get(tenant, 0) + len(child.text)
            child.tenants[tenant] = now
            node = child
            i += len(child.text)

    def _split(self, child: _Node, at: int) -> _Node:
        """Split ``child``'s edge after ``at`` chars; return the new upper node."""
        parent = child.parent
        upper = _Node(child.text[:at], parent)
        upper.tenants = dict(child.tenants)
        parent.children[upper.text[0]] = upper
        child.text = child.text[at:]
        child.parent = upper
        upper.children[child.text[0]] = child
        return upper

    def match(self, text: str) -> dict[str, int]:
        """Matched characters of ``text`` per tenant: ``{tenant: chars}`` (tenants with >= 1).

        A partial match inside an edge counts the matched characters of that edge.
        """
        out: dict[str, int] = {}
        node, i = self._root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            common = _common_prefix_len(child.text, text, i)
            for tenant in child.tenants:
                out[tenant] = i + common
            if common < len(child.text):
                break
            node, i = child, i + common
        return out

    def tenant_sizes_chars(self) -> dict[str, int]:
        """``{tenant: characters tagged}`` for every tenant."""
        return dict(self._chars)

    def size_chars(self, tenant: str) -> int:
        """Characters of the tree tagged with ``tenant``."""
        return self._chars.get(tenant, 0)

    def evict(self, max_size_chars: int) -> int:
        """Untag each tenant from its least-recently-used leaves until it holds <= ``max_size_chars``.

        Returns the number of (node, tenant) tags removed; nodes left untagged are deleted.
        """
        removed = 0
        for tenant, size in list(self._chars.items()):
            if size <= max_size_chars:
                continue
            heap = [(n.tenants[tenant], id(n), n) for n in self._tenant_leaves(tenant)]
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
                    heapq.heappush(heap, (parent.tenants[tenant], id(parent), parent))
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
    n = min(len(edge), len(text) - offset)
    k = 0
    while k < n and edge[k] == text[offset + k]:
        k += 1
    return k
