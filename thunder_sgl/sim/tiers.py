"""The KV cache of one DP rank across tiers: HBM (device), HiCache host memory, HiCache storage.

One radix tree holds every cached prefix; each node carries a bit mask of the tiers that hold
its KV. The rules follow SGLang's HiRadixCache:

- **Device** content is prefix-closed. Running requests lock their path (lock counts on every
  ancestor); device eviction takes the least recently used unlocked leaf (a node with no child
  in HBM) and repeats until enough tokens are free — unreferenced leaves before leaves that
  sessions reference (``sessions``, SGLang's session radix cache), fewest references first. ``evictable`` / ``protected`` count unlocked
  and locked device tokens, as SGLang's ``evictable_size`` / ``protected_size``.
- **Host** (L2). ``write_through``: every node that enters HBM is copied to host at once, so the
  host tier is inclusive while it has room; ``write_back``: a node is copied when HBM evicts it.
  The host tier has its own LRU over nodes that are no longer in HBM.
- **Storage** (L3, optional) receives a copy of every node the host receives and has its own LRU.
- A node in no tier is removed (with any descendants that depend on it).
- A prefix match returns the device part, then the continuation held in host or storage. The
  engine loads that continuation back into HBM (``promote``) after making room; continuations
  below ``load_back_threshold`` (host) or ``storage_prefetch_threshold`` (storage) are recomputed.

LRU uses one lazy heap per tier: entries are pushed whenever a node may have become a candidate
and validated when popped (a node touched since its entry was pushed is re-queued with its new
time), so no operation scans the tree.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from thunder_sgl.sim.radix import DEVICE, HOST, STORAGE, Node, RadixTree
from thunder_sgl.sim.sessions import SessionRefs

_ALL_TIERS = (DEVICE, HOST, STORAGE)


@dataclass(slots=True)
class PrefixHit:
    """A prefix match split by tier; ``path`` covers exactly the tokens that will be reused."""

    path: list[Node]
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    device_nodes: int
    """How many leading nodes of ``path`` are already in HBM."""

    @property
    def total(self) -> int:
        return self.device_tokens + self.host_tokens + self.storage_tokens

    @property
    def load_tokens(self) -> int:
        return self.host_tokens + self.storage_tokens


@dataclass(slots=True)
class Tier:
    """Capacity and usage of one lower tier, in tokens."""

    bit: int
    capacity: int
    used: int = 0
    evicted: int = 0
    backed_up: int = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used


@dataclass(slots=True)
class CacheCounters:
    """Cumulative token counts (monotonic)."""

    evicted_device: int = 0
    """Tokens evicted from HBM (``sglang:evicted_tokens_total``)."""
    loaded_from_host: int = 0
    loaded_from_storage: int = 0
    dropped: int = 0
    """Tokens that left the cache entirely."""


class KVCache:
    """Radix tree + tier accounting + LRU eviction for one DP rank."""

    def __init__(
        self,
        page_size: int = 1,
        host_tokens: int = 0,
        storage_tokens: int = 0,
        write_policy: str = "write_through",
        load_back_threshold: int = 10,
        storage_prefetch_threshold: int = 256,
    ) -> None:
        self.tree = RadixTree(page_size)
        self.device_tokens = 0
        self.evictable = 0
        self.protected = 0
        self.host = Tier(HOST, host_tokens) if host_tokens > 0 else None
        self.storage = Tier(STORAGE, storage_tokens) if storage_tokens > 0 else None
        self.write_back = write_policy == "write_back"
        self.load_back_threshold = load_back_threshold
        self.storage_prefetch_threshold = storage_prefetch_threshold
        self.counters = CacheCounters()
        self._heaps: dict[int, list[tuple[bool, int, float, int, int, Node]]] = {t: [] for t in _ALL_TIERS}
        self.refs = SessionRefs(self.tree.root, self._touch)
        """Session references (SGLang's session radix cache): device eviction takes
        unreferenced KV first. No request carries a session id unless the server enables it."""
        self._bits = tuple(b for b, on in ((DEVICE, True), (HOST, self.host), (STORAGE, self.storage)) if on)

    # ---- matching and loading back -------------------------------------------------------
    def match(self, key: bytes, now: float) -> PrefixHit:
        path, _ = self.tree.match(key, now)
        i, dev = 0, 0
        while i < len(path) and path[i].tiers & DEVICE:
            dev += path[i].ntokens
            i += 1
        host = storage = 0
        keep = i
        for j in range(i, len(path)):
            nd = path[j]
            if nd.tiers & HOST and storage == 0:
                host += nd.ntokens
                keep = j + 1
            else:
                storage += nd.ntokens
        if storage and storage < self.storage_prefetch_threshold:
            storage = 0
        else:
            keep = len(path)
        if host + storage < self.load_back_threshold:
            host = storage = 0
            keep = i
        return PrefixHit(path[:keep], dev, host, storage, i)

    def promote(self, hit: PrefixHit) -> None:
        """Load ``hit``'s host/storage continuation into HBM (the caller made room and locked it)."""
        for nd in hit.path[hit.device_nodes :]:
            n = nd.ntokens
            if nd.tiers & HOST:
                self.counters.loaded_from_host += n
            else:
                self.counters.loaded_from_storage += n
            self._gain_device(nd)

    # ---- insertion ----------------------------------------------------------------------
    def insert(self, key: bytes, now: float, start: Node | None = None, start_bytes: int = 0) -> tuple[Node, int]:
        """Cache ``key`` (page-aligned) in HBM, walking from ``start`` if given (a node ending at
        byte ``start_bytes`` of key). Returns the last node and the tokens that newly entered HBM
        (the rest were there already: the caller's copies of them are duplicates)."""
        path, _ = self.tree.insert(key, now, 0, start, start_bytes)
        new = 0
        for nd in path:
            if not nd.tiers & DEVICE:
                new += nd.ntokens
                self._gain_device(nd)
        last = path[-1] if path else (start if start is not None else self.tree.root)
        return last, new

    def _gain_device(self, nd: Node) -> None:
        n = nd.ntokens
        nd.tiers |= DEVICE
        self.device_tokens += n
        if nd.lock_ref:
            self.protected += n
        else:
            self.evictable += n
        if not self.write_back:
            self._backup(nd)
        self._touch(nd)

    def _backup(self, nd: Node) -> None:
        """Copy a node to host (and storage) if it is not there and room can be made."""
        for tier in (self.host, self.storage):
            if tier is not None and not nd.tiers & tier.bit and self._make_room(tier, nd.ntokens):
                nd.tiers |= tier.bit
                tier.used += nd.ntokens
                tier.backed_up += nd.ntokens
                self._touch(nd)

    # ---- locks --------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        root = self.tree.root
        while node is not root:
            if node.lock_ref == 0 and node.tiers & DEVICE:
                self.evictable -= node.ntokens
                self.protected += node.ntokens
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def extend_lock(self, old: Node, new: Node) -> None:
        """Move one lock from ``old`` to its descendant ``new`` (only the nodes between change)."""
        node = new
        while node is not old:
            if node.lock_ref == 0 and node.tiers & DEVICE:
                self.evictable -= node.ntokens
                self.protected += node.ntokens
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        root = self.tree.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if node.tiers & DEVICE:
                    self.evictable += node.ntokens
                    self.protected -= node.ntokens
                self._touch(node)
            node = node.parent  # type: ignore[assignment]

    # ---- eviction -----------------------------------------------------------------------
    def evict_device(self, tokens: int) -> int:
        """Evict unlocked HBM leaves, LRU first, until ``tokens`` are freed; returns tokens freed."""
        freed = 0
        heap = self._heaps[DEVICE]
        while freed < tokens and heap:
            _, refs, _, seq, _, nd = heapq.heappop(heap)
            if not self._candidate(DEVICE, nd):
                continue
            if nd.seq != seq or nd.refs != refs:  # touched or referenced since queued: re-queue
                heapq.heappush(heap, _entry(DEVICE, nd))
                continue
            n = nd.ntokens
            if self.write_back:
                self._backup(nd)
            nd.tiers &= ~DEVICE
            self.device_tokens -= n
            self.evictable -= n
            self.counters.evicted_device += n
            freed += n
            self._after_loss(nd)
        self._compact(DEVICE)
        return freed

    def _make_room(self, tier: Tier, tokens: int) -> bool:
        if tier.free >= tokens:
            return True
        if tokens > tier.capacity:
            return False
        heap = self._heaps[tier.bit]
        while tier.free < tokens and heap:
            _, _, _, seq, _, nd = heapq.heappop(heap)
            if not self._candidate(tier.bit, nd):
                continue
            if nd.seq != seq:
                heapq.heappush(heap, _entry(tier.bit, nd))
                continue
            nd.tiers &= ~tier.bit
            tier.used -= nd.ntokens
            tier.evicted += nd.ntokens
            self._after_loss(nd)
        self._compact(tier.bit)
        return tier.free >= tokens

    def _candidate(self, bit: int, nd: Node) -> bool:
        if not nd.tiers & bit or nd.lock_ref or nd.parent is None:
            return False
        if bit == HOST and nd.tiers & DEVICE:
            return False  # SGLang evicts host copies only of nodes already gone from HBM
        for c in nd.children.values():
            if c.tiers & bit:
                return False
        return True

    def _touch(self, nd: Node) -> None:
        """Queue ``nd`` in the heap of every tier where it may now be evicted."""
        if nd.lock_ref:
            return  # a locked node is evictable from no tier; it is queued again when unlocked
        for bit in self._bits:
            if self._candidate(bit, nd):
                heapq.heappush(self._heaps[bit], _entry(bit, nd))

    def _after_loss(self, nd: Node) -> None:
        parent = nd.parent
        if nd.tiers == 0:
            self._drop_subtree(nd)
        else:
            self._touch(nd)
        if parent is not None and parent is not self.tree.root:
            self._touch(parent)

    def _drop_subtree(self, nd: Node) -> None:
        """Remove a node that holds KV nowhere, with any descendants (unreachable without it)."""
        heir = nd.parent or self.tree.root
        stack, order = [nd], []
        while stack:
            x = stack.pop()
            order.append(x)
            stack.extend(x.children.values())
        for x in reversed(order):
            n = x.ntokens
            for tier in (self.host, self.storage):
                if tier is not None and x.tiers & tier.bit:
                    tier.used -= n
                    tier.evicted += n
            self.counters.dropped += n
            self.refs.removed(x, heir)
            self.tree.remove(x)

    def _compact(self, bit: int) -> None:
        heap = self._heaps[bit]
        if len(heap) > 2 * self.tree.num_nodes + 4096:
            fresh = [_entry(bit, n) for n in self.tree.nodes() if self._candidate(bit, n)]
            heapq.heapify(fresh)
            self._heaps[bit] = fresh

    # ---- whole-cache operations -----------------------------------------------------------
    def flush(self) -> None:
        """Drop everything (the engine has no running request: nothing is locked)."""
        assert self.protected == 0, "flush with locked nodes"
        self.tree.reset()
        self.refs = SessionRefs(self.tree.root, self._touch)  # SGLang resets session state on flush
        self.device_tokens = self.evictable = 0
        for tier in (self.host, self.storage):
            if tier is not None:
                tier.used = 0
        for heap in self._heaps.values():
            heap.clear()

    @property
    def host_used(self) -> int:
        return self.host.used if self.host else 0

    @property
    def storage_used(self) -> int:
        return self.storage.used if self.storage else 0

    def check(self) -> None:
        """Recount every total from the tree and assert the invariants (tests only: O(n))."""
        dev = ev = prot = host = sto = 0
        for nd in self.tree.nodes():
            n = nd.ntokens
            assert nd.tiers, f"{nd} holds nothing but is in the tree"
            if nd.tiers & DEVICE:
                dev += n
                ev += n if nd.lock_ref == 0 else 0
                prot += n if nd.lock_ref else 0
                parent = nd.parent
                assert parent is self.tree.root or (parent is not None and parent.tiers & DEVICE), "device not prefix-closed"
            else:
                assert nd.lock_ref == 0, f"{nd} locked but not in HBM"
            host += n if nd.tiers & HOST else 0
            sto += n if nd.tiers & STORAGE else 0
        assert (dev, ev, prot) == (self.device_tokens, self.evictable, self.protected), (dev, ev, prot, self.device_tokens, self.evictable, self.protected)
        assert host == self.host_used and sto == self.storage_used, (host, self.host_used, sto, self.storage_used)
        for tier in (self.host, self.storage):
            assert tier is None or 0 <= tier.used <= tier.capacity


def _entry(bit: int, nd: Node) -> tuple[bool, int, float, int, int, Node]:
    """Eviction order in ``bit``'s heap: in HBM unreferenced before referenced, fewer references
    first (``sessions``), then least recently used; other tiers LRU only."""
    refs = nd.refs if bit == DEVICE else 0
    return (refs > 0, refs, nd.last_access, nd.seq, nd.nid, nd)


__all__ = ["KVCache", "PrefixHit", "Tier", "CacheCounters"]
