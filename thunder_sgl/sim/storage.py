"""The HiCache storage tier (L3) of one DP rank, apart from the radix cache.

SGLang's storage backends (file, 3FS, Mooncake, ...) hold pages keyed by a hash of their whole
prefix; the radix tree forgets KV once it has left host memory. A lookup walks the request's
tokens page by page from where the host match ends and stops at the first page not stored
(``UnifiedRadixCache.query_storage_hit_length``); a hit is prefetched into host as one new tree
node (``insert_host``). Keeping L3 in the radix cache itself would keep the tree's old node
boundaries alive for KV the real tree no longer has, and those boundaries decide how much host
and device eviction take at a time (found against the real engine: write-back with the file tier
backed up more than the real one once a program's KV came back through storage).

Here L3 is a radix tree of its own whose nodes are *stored* (``tiers == STORAGE``) or
placeholders (``tiers == 0``, kept only as the path to stored descendants). A write marks the
nodes covering the written token range; capacity is kept by evicting stored leaves, least
recently written or read first (SGLang exposes no capacity: the simulator needs one; the file
backend has none but the disk's).
"""

from __future__ import annotations

import heapq

from thunder_sgl.sim.radix import STORAGE, Node, RadixTree


class StorageTier:
    def __init__(self, page_size: int, capacity: int) -> None:
        self.tree = RadixTree(page_size)
        self.capacity = capacity
        self.used = 0
        self.evicted = 0
        self.backed_up = 0
        """Tokens written (``sglang:backuped_tokens_total``): every write, stored before or not."""
        self._heap: list[tuple[float, int, int, Node]] = []

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def store(self, key: bytes, start: int, now: float) -> None:
        """Write tokens ``start`` … end of ``key`` (token ids packed as in ``radix``)."""
        n = (len(key) >> 2) - start
        if n <= 0:
            return
        self.backed_up += n
        tree = self.tree
        if start:
            tree.insert(key[: 4 * start], now, 0)  # a node boundary at start
        path, _ = tree.insert(key, now, 0)
        new: list[Node] = []
        pos = 0
        for nd in path:
            if pos >= start and not nd.tiers:
                new.append(nd)
            pos += nd.ntokens
        for nd in new:
            nd.tiers = STORAGE
            self.used += nd.ntokens
        if self.used > self.capacity:
            self._evict(self.used - self.capacity, set(path))
            if self.used > self.capacity:  # no room: the write is lost
                for nd in new:
                    nd.tiers = 0
                    self.used -= nd.ntokens
                self._prune(path[-1])
                return
        self._push(path[-1])

    def lookup(self, key: bytes, start: int, now: float) -> int:
        """Tokens of ``key`` stored contiguously from ``start`` (a read refreshes their LRU)."""
        tree = self.tree
        if start:
            tree.match(key[: 4 * start], now)
        path, _ = tree.match(key, now)
        pos = hit = 0
        for nd in path:
            if pos >= start:
                if not nd.tiers:
                    break
                hit += nd.ntokens
            pos += nd.ntokens
        return hit

    def _push(self, nd: Node) -> None:
        if nd.tiers and not nd.children and nd.parent is not None:
            heapq.heappush(self._heap, (nd.last_access, nd.seq, nd.nid, nd))

    def _evict(self, tokens: int, keep: set[Node]) -> None:
        """Evict stored leaves, least recently used first, until ``tokens`` are free or none is
        left but those in ``keep`` (the path being written)."""
        goal = self.free + tokens
        heap = self._heap
        skipped: list[tuple[float, int, int, Node]] = []
        while self.free < goal and heap:
            entry = heapq.heappop(heap)
            _, seq, _, nd = entry
            if not nd.tiers or nd.children or nd.parent is None:
                continue
            if nd.seq != seq:
                self._push(nd)
                continue
            if nd in keep:
                skipped.append(entry)
                continue
            nd.tiers = 0
            self.used -= nd.ntokens
            self.evicted += nd.ntokens
            self._push(self._prune(nd))
        for entry in skipped:
            heapq.heappush(heap, entry)
        if len(heap) > 2 * self.tree.num_nodes + 4096:
            fresh = [(n.last_access, n.seq, n.nid, n) for n in self.tree.nodes() if n.tiers and not n.children]
            heapq.heapify(fresh)
            self._heap = fresh

    def _prune(self, nd: Node) -> Node:
        """Remove placeholders that lead to nothing stored, from ``nd`` up; returns the node
        where that stopped."""
        root = self.tree.root
        while nd is not root and not nd.tiers and not nd.children:
            parent = nd.parent
            self.tree.remove(nd)
            assert parent is not None
            nd = parent
        return nd

    def check(self) -> None:
        stored = 0
        for nd in self.tree.nodes():
            if nd.tiers:
                assert nd.tiers == STORAGE
                stored += nd.ntokens
            else:
                assert nd.children, f"{nd} is a placeholder leading nowhere"
        assert stored == self.used and 0 <= self.used <= self.capacity, (stored, self.used, self.capacity)


__all__ = ["StorageTier"]
