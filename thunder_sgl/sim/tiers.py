"""The KV cache of one DP rank across tiers: HBM (device), HiCache host memory, HiCache storage.

One radix tree holds every cached prefix; each node carries a bit mask of the tiers that hold
its KV. The rules follow SGLang's HiRadixCache:

- **Device** content is prefix-closed. Running requests lock their path (lock counts on every
  ancestor); device eviction takes the least recently used unlocked leaf (a node with no child
  in HBM) and repeats until enough tokens are free — unreferenced leaves before leaves that
  sessions reference (``sessions``, SGLang's session radix cache), fewest references first. ``evictable`` / ``protected`` count unlocked
  and locked device tokens, as SGLang's ``evictable_size`` / ``protected_size``.
- **Host** (L2). ``write_through``: every node that enters HBM is copied to host at once, so the
  host tier is inclusive while it has room; ``write_back``: a node is copied when HBM evicts it
  (a node that cannot get host room then is dropped, with its host-only descendants).
  Host room is made by evicting host leaves (nodes no longer in HBM, with no child in host),
  unreferenced before referenced (``sessions``), then least recently used. Under
  ``write_back`` a host copy of KV that is also in HBM (a node loaded back keeps its host copy)
  is reclaimed first, in the order the copies became duplicates, sparing at first those whose
  HBM copy is itself next in line for eviction (SGLang's ``_reclaim_full_host_duplicates``);
  such a node is copied to host again when HBM evicts it.
- **Storage** (L3, optional) receives a copy of every node the host receives (once the host copy
  is made, as SGLang writes L3 from the host copy) and has its own LRU. It is not cleared by a
  flush (SGLang's file tier survives ``/flush_cache``).
- A node in no tier is removed (with any descendants that depend on it).
- A prefix match returns the device part, then the continuation held in host, then a
  continuation held only in storage. SGLang looks the storage continuation up only when the
  deepest node matched in HBM or host has a host copy (or is the root) and at least
  ``storage_prefetch_threshold`` tokens of the key remain past the host match; a hit is
  prefetched into host (not a backup) and loaded on. The engine loads the continuation into
  HBM (``promote``) after making room; a host + storage continuation below
  ``load_back_threshold`` is recomputed.

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
        self._dups: dict[Node, None] = {}
        """write_back: nodes whose KV was in HBM and host at once, in the order they became so
        (SGLang's ``full_host_duplicates``: an entry is dropped lazily, when host reclaim passes
        over it or the node changes again, so a node that becomes a duplicate again keeps its
        place)."""
        self._loading: list[Node] = []
        """write_back: nodes loaded back since the last ``settle`` (their host copies are pinned
        until the load completes, and become duplicates only then)."""
        if self.write_back and self.host is not None:
            self.tree.on_split = self._note_dup

    # ---- matching and loading back -------------------------------------------------------
    def match(self, key: bytes, now: float) -> PrefixHit:
        path, _ = self.tree.match(key, now)
        i, dev = 0, 0
        while i < len(path) and path[i].tiers & DEVICE:
            dev += path[i].ntokens
            i += 1
        host = storage = 0
        j = i
        while j < len(path) and path[j].tiers & HOST:
            host += path[j].ntokens
            j += 1
        keep = j
        if j < len(path):  # the rest is held in storage only
            # SGLang queries L3 only from a node backed up to host (or the root), and only when
            # the prompt has storage_prefetch_threshold tokens past the host match
            # (scheduler._prefetch_kvcache, UnifiedRadixCache.prefetch_from_storage)
            if (j == 0 or path[j - 1].tiers & HOST) and (len(key) >> 2) - dev - host >= self.storage_prefetch_threshold:
                storage = sum(nd.ntokens for nd in path[j:])
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
                self._prefetch(nd)
            self._gain_device(nd)
            if self.write_back:
                self._loading.append(nd)

    def _prefetch(self, nd: Node) -> None:
        """Storage → host: the prefetched copy lands in the host tier (room made by host
        eviction), as SGLang inserts an L3 hit into host before loading it on; not a backup."""
        host = self.host
        if host is not None and self._make_room(host, nd.ntokens):
            nd.tiers |= HOST
            host.used += nd.ntokens
            self._touch(nd)

    def settle(self) -> None:
        """The load-backs issued so far have completed (SGLang's ``loading_check`` at the next
        scheduler step): their host copies are duplicates from now on, deepest node first."""
        if self._loading:
            for nd in reversed(self._loading):
                if nd.parent is not None:
                    self._note_dup(nd)
            self._loading.clear()

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
                if self.write_back and nd.tiers & HOST:
                    self._note_dup(nd)  # recomputed KV of a node with a host copy
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
        """Copy a node to host if it is not there and room can be made; a new host copy is
        written on to storage (SGLang writes L3 from the host copy once its backup completes)."""
        host = self.host
        if host is None or nd.tiers & HOST or not self._make_room(host, nd.ntokens):
            return
        nd.tiers |= HOST
        host.used += nd.ntokens
        host.backed_up += nd.ntokens
        sto = self.storage
        if sto is not None:
            sto.backed_up += nd.ntokens  # written again if L3 holds it already (SGLang counts every write)
            if not nd.tiers & STORAGE and self._make_room(sto, nd.ntokens):
                nd.tiers |= STORAGE
                sto.used += nd.ntokens
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
                self._note_dup(nd)  # the backup's ack finds the node in HBM and host
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
        if tier.bit == HOST and self._dups:
            self._reclaim_duplicates(tier, tokens)
            if tier.free >= tokens:
                return True
        heap = self._heaps[tier.bit]
        while tier.free < tokens and heap:
            _, refs, _, seq, _, nd = heapq.heappop(heap)
            if not self._candidate(tier.bit, nd):
                continue
            if nd.seq != seq or nd.refs != refs and tier.bit == HOST:
                heapq.heappush(heap, _entry(tier.bit, nd))
                continue
            nd.tiers &= ~tier.bit
            tier.used -= nd.ntokens
            tier.evicted += nd.ntokens
            self._after_loss(nd)
        self._compact(tier.bit)
        return tier.free >= tokens

    def _note_dup(self, nd: Node) -> None:
        """SGLang's ``_update_duplicate_tracking``: a node in HBM and host joins the duplicates
        (keeping its place if it is there already); any other node leaves them."""
        if nd.tiers & DEVICE and nd.tiers & HOST:
            self._dups.setdefault(nd, None)
        else:
            self._dups.pop(nd, None)

    def _reclaim_duplicates(self, host: Tier, tokens: int) -> None:
        """write_back host pressure: free host copies of KV that is also in HBM, oldest
        duplicate first; a first pass spares nodes that are HBM's eviction candidates (their
        host copy saves a backup when they go), a second takes them too. Stale entries passed
        over are dropped (SGLang's ``_reclaim_full_host_duplicates``)."""
        swept: list[Node] = []
        pinned = set(self._loading)
        for spare in (True, False):
            if host.free >= tokens:
                break
            for nd in self._dups:
                if host.free >= tokens:
                    break
                if not (nd.tiers & DEVICE and nd.tiers & HOST) or nd.parent is None:
                    swept.append(nd)
                    continue
                if nd in pinned or (spare and self._candidate(DEVICE, nd)):
                    continue
                nd.tiers &= ~HOST
                host.used -= nd.ntokens
                host.evicted += nd.ntokens
                swept.append(nd)
            for nd in swept:
                self._dups.pop(nd, None)
            swept.clear()

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
            self._dups.pop(x, None)
            self.tree.remove(x)

    def _compact(self, bit: int) -> None:
        heap = self._heaps[bit]
        if len(heap) > 2 * self.tree.num_nodes + 4096:
            fresh = [_entry(bit, n) for n in self.tree.nodes() if self._candidate(bit, n)]
            heapq.heapify(fresh)
            self._heaps[bit] = fresh

    # ---- whole-cache operations -----------------------------------------------------------
    def flush(self) -> None:
        """Drop HBM and host (the engine has no running request: nothing is locked). The
        storage tier stays: SGLang's ``/flush_cache`` leaves the L3 backend alone."""
        assert self.protected == 0, "flush with locked nodes"
        self.refs = SessionRefs(self.tree.root, self._touch)  # SGLang resets session state on flush
        self.device_tokens = self.evictable = 0
        if self.host is not None:
            self.host.used = 0
        for heap in self._heaps.values():
            heap.clear()
        self._dups.clear()
        self._loading.clear()
        if self.storage is None or self.storage.used == 0:
            self.tree.reset()
            if self.storage is not None:
                self.storage.used = 0
            return
        stack = [self.tree.root]
        kept: list[Node] = []
        while stack:
            nd = stack.pop()
            for c in list(nd.children.values()):
                c.refs = 0
                c.sessions = None
                if c.tiers & STORAGE:
                    c.tiers = STORAGE
                    kept.append(c)
                    stack.append(c)
                else:  # with its descendants, unreachable without it
                    self._forget_subtree(c)
        for nd in kept:
            self._touch(nd)

    def _forget_subtree(self, nd: Node) -> None:
        """Remove ``nd`` and its descendants from the tree, giving back their storage."""
        stack, order = [nd], []
        while stack:
            x = stack.pop()
            order.append(x)
            stack.extend(x.children.values())
        for x in reversed(order):
            if x.tiers & STORAGE and self.storage is not None:
                self.storage.used -= x.ntokens
            self.tree.remove(x)

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
    """Eviction order in ``bit``'s heap: in HBM and host unreferenced before referenced, fewer
    references first (``sessions``; SGLang's device and host leaf heaps both order by
    ``_session_ref_eviction_strategy``), then least recently used; storage LRU only."""
    refs = nd.refs if bit != STORAGE else 0
    return (refs > 0, refs, nd.last_access, nd.seq, nd.nid, nd)


__all__ = ["KVCache", "PrefixHit", "Tier", "CacheCounters"]
