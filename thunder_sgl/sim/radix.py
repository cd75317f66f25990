"""A token-level radix tree with compressed edges, as SGLang's RadixCache.

Keys are token sequences packed as native uint32 bytes (4 bytes per token): an edge is one
``bytes`` object, children are keyed by their first page, and prefix comparison is a C-speed
slice compare; the length of a partial match is found with one XOR of two big integers. Matches
and insertions are page-aligned (``page_size`` tokens).

This module is the structure only. Which memory tier holds a node's KV (``tiers`` bit mask:
DEVICE, HOST, STORAGE), lock counts and LRU eviction are driven by ``tiers.KVCache``. Nodes that
hold KV in no tier are removed; a node is split when a match or an insertion ends inside its
edge (the prefix part becomes a new parent that inherits the tiers, lock count and access time).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

DEVICE = 1
HOST = 2
STORAGE = 4
TIER_NAMES = {DEVICE: "device", HOST: "host", STORAGE: "storage"}


class Node:
    __slots__ = ("key", "ntokens", "children", "parent", "lock_ref", "last_access", "seq", "tiers", "nid",
                 "refs", "sessions")

    def __init__(self, key: bytes, parent: Node | None, tiers: int, now: float, nid: int) -> None:
        self.key = key
        self.ntokens = len(key) >> 2
        self.children: dict[bytes, Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = now
        self.seq = 0
        """Order of the operation that last touched the node: breaks ties of equal times, so the
        later of two operations at one simulated instant counts as more recent (LRU)."""
        self.tiers = tiers
        self.nid = nid
        self.refs = 0
        """Sessions whose KV covers this node (``sessions.SessionRefs``)."""
        self.sessions: set[str] | None = None
        """Sessions whose registered leaf is this node."""

    @property
    def alive(self) -> bool:
        return self.tiers != 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Node(#{self.nid}, {self.ntokens} tok, tiers={self.tiers}, lock={self.lock_ref})"


def common_prefix_bytes(a: bytes, b: bytes) -> int:
    """Length in bytes of the common prefix of two equal-length byte strings."""
    x = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
    if x == 0:
        return len(a)
    return len(a) - 1 - (x.bit_length() - 1) // 8


class RadixTree:
    """The structure: match, insert, split, remove. Tiers and locks are set by the caller."""

    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size
        self.page_bytes = 4 * page_size
        self._ids = itertools.count(1)
        self._ops = itertools.count(1)
        self.root = Node(b"", None, DEVICE | HOST | STORAGE, 0.0, 0)
        self.root.lock_ref = 1
        self.num_nodes = 0
        self.on_split: Callable[[Node], None] | None = None
        """Called with the new parent node after every split (``tiers.KVCache`` under
        write_back: the duplicates' bookkeeping)."""

    def align(self, nbytes: int) -> int:
        """Round a byte length down to whole pages."""
        return nbytes - nbytes % self.page_bytes

    def _descend(self, node: Node, pos: int, key: bytes, end: int, path: list[Node]) -> tuple[Node, int, Node | None]:
        """Follow whole edges of ``key`` from ``node`` (which ends at byte ``pos``) up to byte
        ``end``, appending each node passed to ``path``. Returns where the walk stopped: the
        last node, its end in ``key``, and the child that ``key``'s next page leads into without
        covering its whole edge (None: no child has that page, or ``end`` was reached)."""
        pb = self.page_bytes
        while pos < end:
            child = node.children.get(key[pos : pos + pb])
            if child is None:
                return node, pos, None
            ck = child.key
            n = len(ck)
            if pos + n <= end and key.startswith(ck, pos):
                path.append(child)
                pos += n
                node = child
                continue
            return node, pos, child
        return node, pos, None

    def _common(self, child: Node, key: bytes, pos: int, end: int) -> int:
        """Page-aligned length in bytes that ``child``'s edge shares with ``key[pos:end]``."""
        m = min(len(child.key), end - pos)
        return self.align(common_prefix_bytes(child.key[:m], key[pos : pos + m]))

    def match(self, key: bytes, now: float) -> tuple[list[Node], int]:
        """Walk the longest page-aligned prefix of ``key`` held in any tier.

        Returns the path (root excluded) and the matched length in bytes; splits the last node
        when the match ends inside it and stamps every node on the path with ``now``.
        """
        end = self.align(len(key))
        path: list[Node] = []
        _, pos, child = self._descend(self.root, 0, key, end, path)
        if child is not None:
            common = self._common(child, key, pos, end)
            if common != 0:
                path.append(self.split(child, common))
                pos += common
        self.stamp(path, now)
        return path, pos

    def insert(self, key: bytes, now: float, tiers: int, start: Node | None = None, start_bytes: int = 0) -> tuple[list[Node], list[Node]]:
        """Make ``key`` (page-aligned) a path of the tree.

        ``start``: a node known to end exactly at byte ``start_bytes`` of ``key`` (a request's
        locked prefix): the walk begins there. Returns the nodes on the path after ``start`` (or
        after the root) and the nodes created by this call; created nodes get ``tiers``, existing
        ones keep theirs. The whole path from the root is stamped with ``now``.
        """
        pb = self.page_bytes
        end = self.align(len(key))
        node = start if start is not None else self.root
        pos = start_bytes if start is not None else 0
        path: list[Node] = []
        created: list[Node] = []
        while True:
            node, pos, child = self._descend(node, pos, key, end, path)
            if child is None:
                if pos < end:
                    leaf = Node(key[pos:end], node, tiers, now, next(self._ids))
                    node.children[key[pos : pos + pb]] = leaf
                    self.num_nodes += 1
                    path.append(leaf)
                    created.append(leaf)
                break
            common = self._common(child, key, pos, end)
            node = self.split(child, common)
            path.append(node)
            pos += common
        seq = self.stamp(path, now)
        anc = start
        while anc is not None and anc is not self.root:
            anc.last_access = now
            anc.seq = seq
            anc = anc.parent
        return path, created

    def stamp(self, nodes: list[Node], now: float) -> int:
        """Mark ``nodes`` as used at ``now`` by one new operation; returns its sequence number."""
        seq = next(self._ops)
        for nd in nodes:
            nd.last_access = now
            nd.seq = seq
        return seq

    def split(self, child: Node, nbytes: int) -> Node:
        """Cut ``child``'s edge after ``nbytes``: the prefix becomes a new parent node."""
        parent = child.parent
        assert parent is not None and 0 < nbytes < len(child.key)
        pb = self.page_bytes
        head = Node(child.key[:nbytes], parent, child.tiers, child.last_access, next(self._ids))
        head.seq = child.seq
        head.lock_ref = child.lock_ref
        head.refs = child.refs  # a session covering the child covers its prefix
        parent.children[child.key[:pb]] = head
        child.key = child.key[nbytes:]
        child.ntokens = len(child.key) >> 2
        child.parent = head
        head.children[child.key[:pb]] = child
        self.num_nodes += 1
        if self.on_split is not None:
            self.on_split(head)
        return head

    def remove(self, node: Node) -> None:
        """Detach a childless node (it holds KV in no tier any more)."""
        assert not node.children and node.parent is not None
        del node.parent.children[node.key[: self.page_bytes]]
        node.parent = None
        node.tiers = 0
        self.num_nodes -= 1

    def nodes(self) -> list[Node]:
        """Every node but the root (for invariant checks and heap rebuilds)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def reset(self) -> None:
        self.root.children.clear()
        self.num_nodes = 0
