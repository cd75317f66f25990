"""The KV cache of one DP rank across tiers: HBM (device), HiCache host memory, HiCache storage.

One radix tree holds every prefix cached in HBM or host; each node carries a bit mask of the two
tiers that hold its KV; the storage tier is a store apart (``storage``). The rules follow
SGLang 0.5.23's HiCache (``UnifiedRadixCache``, checked request by request against the real
engine: ``bench/real/hicache_calibrate.py``):

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
- **Storage** (L3, optional; ``storage.StorageTier``, a radix tree of its own, as SGLang's
  backends hold pages apart from the radix cache) receives a copy of every node the host receives
  (once the host copy is made, as SGLang writes L3 from the host copy); until the write is
  acknowledged (the next scheduler step, ``settle``) that host copy can be neither evicted nor
  reclaimed. It is not cleared by a flush (SGLang's file tier survives ``/flush_cache``).
- A node in neither HBM nor host is removed from the tree (with any descendants that depend on
  it), as SGLang's tree forgets it: what L3 holds of it is found by a storage lookup.
- A prefix match returns the device part, then the continuation held in host, then the
  continuation held in storage (``StorageTier.lookup``). SGLang looks the storage continuation up only when the
  deepest node matched in HBM or host has a host copy (or is the root) and at least
  ``storage_prefetch_threshold`` tokens of the key remain past the host match; a hit is
  prefetched into host (``prefetch``: not a backup; when host lacks room for the whole hit,
  host KV is evicted to the hit's full size, as SGLang's ``allocate_storage_hit`` does) and
  loaded on. The engine loads the continuation into HBM (``promote``) after making room; a
  host + storage continuation below ``load_back_threshold`` is recomputed.

LRU uses one lazy heap per tier: entries are pushed whenever a node may have become a candidate
and validated when popped (a node touched since its entry was pushed is re-queued with its new
time), so no operation scans the tree.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from thunder_sgl.sim.radix import DEVICE, HOST, STORAGE, Node, RadixTree
from thunder_sgl.sim.sessions import SessionRefs
from thunder_sgl.sim.storage import StorageTier

_ALL_TIERS = (DEVICE, HOST)


@dataclass(slots=True)
class PrefixHit:
    """A prefix match split by tier; ``path`` covers exactly the tokens that will be reused."""

    path: list[Node]
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    device_nodes: int
    """How many leading nodes of ``path`` are already in HBM."""
    storage_nodes: int = 0
    """How many trailing nodes of ``path`` hold the storage part (0 until ``prefetch`` brought
    it into the tree)."""
    storage_key: bytes = b""
    """The key up to the end of the storage part (what ``prefetch`` inserts into the tree)."""

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
        self.storage = StorageTier(page_size, storage_tokens) if storage_tokens > 0 else None
        self.write_back = write_policy == "write_back"
        self.load_back_threshold = load_back_threshold
        self.storage_prefetch_threshold = storage_prefetch_threshold
        self.counters = CacheCounters()
        self._heaps: dict[int, list[tuple[bool, int, float, int, int, Node]]] = {t: [] for t in _ALL_TIERS}
        self.refs = SessionRefs(self.tree.root, self._touch)
        """Session references (SGLang's session radix cache): device eviction takes
        unreferenced KV first. No request carries a session id unless the server enables it."""
        self._bits = tuple(b for b, on in ((DEVICE, True), (HOST, self.host)) if on)
        self._dups: dict[Node, None] = {}
        """write_back: nodes whose KV was in HBM and host at once, in the order they became so
        (SGLang's ``full_host_duplicates``: an entry is dropped lazily, when host reclaim passes
        over it or the node changes again, so a node that becomes a duplicate again keeps its
        place)."""
        self._loading: list[Node] = []
        """write_back: nodes loaded back since the last ``settle`` (their host copies are pinned
        until the load completes, and become duplicates only then)."""
        self._storing: set[Node] = set()
        """Nodes whose host copy is being written to storage since the last ``settle``: SGLang
        host-locks the node until the write's ack (``write_backup_storage``), so that copy can be
        neither evicted nor reclaimed meanwhile."""
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
        for nd in path[i:]:
            host += nd.ntokens  # past HBM every node of the tree is in host
        # SGLang queries L3 only from a node backed up to host (or the root), and only when the
        # prompt has storage_prefetch_threshold tokens past the host match
        # (scheduler._prefetch_kvcache, UnifiedRadixCache.prefetch_from_storage)
        sto = self.storage
        rest = (len(key) >> 2) - dev - host
        if sto is not None and rest > 0 and rest >= self.storage_prefetch_threshold and (
                not path or path[-1].tiers & HOST):
            storage = sto.lookup(key, dev + host, now)
        if host + storage < self.load_back_threshold:
            return PrefixHit(path[:i], dev, 0, 0, i)
        return PrefixHit(path, dev, host, storage, i, 0, key[: 4 * (dev + host + storage)] if storage else b"")

    def prefetch(self, hit: PrefixHit, now: float) -> PrefixHit:
        """Storage → host for ``hit``'s storage part (its path locked by the caller), as SGLang's
        prefetch allocates host room for an L3 hit (``allocate_storage_hit``): when the host
        lacks room for the whole hit it evicts host KV to the hit's full size (not only the
        shortfall), then takes the whole hit, or as much as fits (whole pages) if that is at
        least ``storage_prefetch_threshold``, or nothing. The prefetched copies land in host (not
        a backup). Returns the hit cut to what was fetched."""
        host = self.host
        if not hit.storage_tokens or hit.storage_nodes or host is None:
            return hit
        if host.free < hit.storage_tokens:
            self._evict_tier(host, hit.storage_tokens)
        room = min(host.free, hit.storage_tokens)
        room -= room % self.tree.page_size
        if room < hit.storage_tokens and room < self.storage_prefetch_threshold:
            room = 0
        if hit.host_tokens + room < self.load_back_threshold:
            return PrefixHit(hit.path[: hit.device_nodes], hit.device_tokens, 0, 0, hit.device_nodes)
        if room == 0:
            return PrefixHit(hit.path, hit.device_tokens, hit.host_tokens, 0, hit.device_nodes)
        start = hit.device_tokens + hit.host_tokens
        last = hit.path[-1] if hit.path else None
        _, created = self.tree.insert(hit.storage_key[: 4 * (start + room)], now, HOST, last, 4 * start)
        for nd in created:
            host.used += nd.ntokens
            self._touch(nd)
        return PrefixHit(hit.path + created, hit.device_tokens, hit.host_tokens, room, hit.device_nodes, len(created))

    def prefetch_locked(self, hit: PrefixHit, locked: Node, now: float) -> tuple[PrefixHit, Node]:
        """``prefetch`` for a caller holding ``hit``'s last node (``locked``) locked: when the
        hit changes, the lock moves to its new last node. Returns the hit and the locked node."""
        fetched = self.prefetch(hit, now)
        if fetched is hit:
            return hit, locked
        self.unlock(locked)
        last = fetched.path[-1] if fetched.path else self.tree.root
        self.lock(last)
        return fetched, last

    def promote(self, hit: PrefixHit) -> None:
        """Load ``hit``'s host/storage continuation into HBM (the caller made room and locked it)."""
        assert not hit.storage_tokens or hit.storage_nodes, "prefetch the storage part first"
        self.counters.loaded_from_host += hit.host_tokens
        self.counters.loaded_from_storage += hit.storage_tokens
        for nd in hit.path[hit.device_nodes :]:
            self._gain_device(nd)
            if self.write_back:
                self._loading.append(nd)

    def settle(self) -> None:
        """The load-backs issued so far have completed (SGLang's ``loading_check`` at the next
        scheduler step): their host copies are duplicates from now on, deepest node first."""
        if self._loading:
            for nd in reversed(self._loading):
                if nd.parent is not None:
                    self._note_dup(nd)
            self._loading.clear()
        if self._storing:  # their storage writes have completed: host copies evictable again
            done, self._storing = self._storing, set()
            for nd in done:
                if nd.parent is not None:
                    self._touch(nd)

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
        if sto is not None:  # every write counts, whether L3 held the pages already or not
            self._storing.add(nd)
            keys, x = [], nd
            while x is not None and x.parent is not None:
                keys.append(x.key)
                x = x.parent
            full = b"".join(reversed(keys))
            sto.store(full, (len(full) >> 2) - nd.ntokens, nd.last_access)
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
        """Evict from ``tier`` what it lacks for ``tokens`` more (SGLang's backup path:
        ``evict_host(needed)``); True if they fit then."""
        if tier.free >= tokens:
            return True
        if tokens > tier.capacity:
            return False
        self._evict_tier(tier, tokens - tier.free)
        return tier.free >= tokens

    def _evict_tier(self, tier: Tier, tokens: int) -> int:
        """Evict at least ``tokens`` from ``tier`` if it can (write_back host: duplicate host
        copies first, then leaves by references and LRU); returns the tokens freed."""
        goal = tier.free + tokens
        if tier.bit == HOST and self._dups:
            self._reclaim_duplicates(tier, goal)
            if tier.free >= goal:
                return tier.free + tokens - goal
        heap = self._heaps[tier.bit]
        while tier.free < goal and heap:
            _, refs, _, seq, _, nd = heapq.heappop(heap)
            if not self._candidate(tier.bit, nd):
                continue
            if nd.seq != seq or nd.refs != refs:
                heapq.heappush(heap, _entry(tier.bit, nd))
                continue
            nd.tiers &= ~tier.bit
            tier.used -= nd.ntokens
            tier.evicted += nd.ntokens
            self._after_loss(nd)
        self._compact(tier.bit)
        return tier.free + tokens - goal

    def _note_dup(self, nd: Node) -> None:
        """SGLang's ``_update_duplicate_tracking``: a node in HBM and host joins the duplicates
        (keeping its place if it is there already); any other node leaves them."""
        if nd.tiers & DEVICE and nd.tiers & HOST:
            self._dups.setdefault(nd, None)
        else:
            self._dups.pop(nd, None)

    def _reclaim_duplicates(self, host: Tier, goal: int) -> None:
        """write_back host pressure, until ``goal`` tokens of host are free: free host copies of
        KV that is also in HBM, oldest
        duplicate first; a first pass spares nodes that are HBM's eviction candidates (their
        host copy saves a backup when they go), a second takes them too. Stale entries passed
        over are dropped (SGLang's ``_reclaim_full_host_duplicates``)."""
        swept: list[Node] = []
        pinned = set(self._loading)
        for spare in (True, False):
            if host.free >= goal:
                break
            for nd in self._dups:
                if host.free >= goal:
                    break
                if not (nd.tiers & DEVICE and nd.tiers & HOST) or nd.parent is None:
                    swept.append(nd)
                    continue
                if nd in pinned or nd in self._storing or (spare and self._candidate(DEVICE, nd)):
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
        if bit == HOST and (nd.tiers & DEVICE or self._storing and nd in self._storing):
            return False  # SGLang evicts host copies only of nodes gone from HBM, not being stored
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
            if self.host is not None and x.tiers & HOST:
                self.host.used -= n
                self.host.evicted += n
            self.counters.dropped += n
            self.refs.removed(x, heir)
            self._dups.pop(x, None)
            self._storing.discard(x)
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
        self.tree.reset()
        self.refs = SessionRefs(self.tree.root, self._touch)  # SGLang resets session state on flush
        self.device_tokens = self.evictable = 0
        if self.host is not None:
            self.host.used = 0
        for heap in self._heaps.values():
            heap.clear()
        self._dups.clear()
        self._loading.clear()
        self._storing.clear()

    @property
    def host_used(self) -> int:
        return self.host.used if self.host else 0

    @property
    def storage_used(self) -> int:
        return self.storage.used if self.storage else 0

    def check(self) -> None:
        """Recount every total from the tree and assert the invariants (tests only: O(n))."""
        dev = ev = prot = host = 0
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
            assert not nd.tiers & STORAGE, f"{nd}: storage is a tier apart"
            host += n if nd.tiers & HOST else 0
        assert (dev, ev, prot) == (self.device_tokens, self.evictable, self.protected), (dev, ev, prot, self.device_tokens, self.evictable, self.protected)
        assert host == self.host_used, (host, self.host_used)
        assert self.host is None or 0 <= self.host.used <= self.host.capacity
        if self.storage is not None:
            self.storage.check()


def _entry(bit: int, nd: Node) -> tuple[bool, int, float, int, int, Node]:
    """Eviction order in ``bit``'s heap: unreferenced before referenced, fewer references first
    (``sessions``; SGLang's device and host leaf heaps both order by
    ``_session_ref_eviction_strategy``), then least recently used."""
    refs = nd.refs
    return (refs > 0, refs, nd.last_access, nd.seq, nd.nid, nd)


__all__ = ["KVCache", "PrefixHit", "Tier", "CacheCounters"]
