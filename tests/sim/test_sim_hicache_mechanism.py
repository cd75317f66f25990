"""The HiCache mechanisms the simulator takes from SGLang 0.5.23's real tiers, each found by
``bench/real/hicache_calibrate.py`` (same request sequences on a real CPU server with HiCache
and on the simulator) or read in SGLang's ``unified_radix_cache.py`` / ``unified_tree_core.py``:
where L3 is looked up, what counts as a backup, write_back's reclaim of duplicate host copies,
host eviction by session references, the storage tier surviving a flush."""

from __future__ import annotations

from array import array

from simkit import drain, tokens, unit_config

from thunder_sgl.sim import SimRequest
from thunder_sgl.sim.engine import Engine
from thunder_sgl.sim.exposition import metrics_text
from thunder_sgl.sim.radix import DEVICE, HOST
from thunder_sgl.sim.tiers import KVCache


def pk(ids: list[int]) -> bytes:
    return array("I", ids).tobytes()


def load(c: KVCache, key: list[int], now: float, settle: bool = True):  # noqa: ANN201
    """Match ``key``, lock it and load its host/storage continuation back (what the engine's
    admission does); returns the hit and the locked node."""
    hit = c.match(pk(key), now)
    last = hit.path[-1] if hit.path else c.tree.root
    c.lock(last)
    if hit.storage_tokens:
        hit, last = c.prefetch_locked(hit, last, now)
    if hit.load_tokens:
        c.promote(hit)
    if settle:
        c.settle()
    return hit, last


def in_tree(c: KVCache, ids: list[int]) -> int:
    """Tokens of ``ids`` the radix tree holds (HBM or host)."""
    return sum(nd.ntokens for nd in c.tree.match(pk(ids), 0.0)[0])


def stored(c: KVCache, ids: list[int], start: int = 0) -> int:
    """Tokens of ``ids`` the storage tier holds from ``start`` on."""
    assert c.storage is not None
    return c.storage.lookup(pk(ids), start, 0.0)


def storage_only_continuation(policy: str) -> tuple[KVCache, list[int]]:
    """S (10 tokens, kept in HBM) → X (10 tokens, in storage only); returns the cache and S + X."""
    c = KVCache(host_tokens=20, storage_tokens=1000, write_policy=policy, load_back_threshold=0,
                storage_prefetch_threshold=0)
    s, x = [1] * 10, [2] * 10
    c.insert(pk(s + x), 1.0)
    c.lock(c.match(pk(s), 2.0).path[-1])  # S stays in HBM
    c.evict_device(10)  # X leaves HBM (write_back: backed up now)
    c.settle()  # X's storage write completes: its host copy may go
    c.insert(pk([3] * 20), 3.0)
    c.evict_device(20)  # Y leaves HBM: X's host copy makes room, X lives on in storage only
    assert in_tree(c, s + x) == 10 and stored(c, s + x, 10) == 10
    (node_s,) = c.match(pk(s), 4.0).path
    assert node_s.tiers == (DEVICE | HOST if policy == "write_through" else DEVICE)
    c.check()
    return c, s + x


def test_storage_is_looked_up_only_from_a_node_with_a_host_copy() -> None:
    """SGLang queries L3 from the deepest node matched in HBM or host only when that node is
    backed up (``scheduler._prefetch_kvcache``: ``is_backuped(last_host_node)`` or root): under
    write_through HBM is inclusive in host and the lookup runs; under write_back the matched
    HBM node has no host copy and the stored continuation is recomputed."""
    c, key = storage_only_continuation("write_through")
    hit = c.match(pk(key), 5.0)
    assert (hit.device_tokens, hit.host_tokens, hit.storage_tokens) == (10, 0, 10)
    c, key = storage_only_continuation("write_back")
    hit = c.match(pk(key), 5.0)
    assert (hit.device_tokens, hit.host_tokens, hit.storage_tokens) == (10, 0, 0)
    assert len(hit.path) == 1


def test_storage_threshold_counts_the_prompt_past_the_host_match_not_the_hit() -> None:
    """``prefetch_from_storage`` declines a lookup when fewer than the threshold of tokens remain
    past the host match; the hit it then returns is used whatever its length."""
    c = KVCache(host_tokens=6, storage_tokens=100, storage_prefetch_threshold=8, load_back_threshold=0)
    c.insert(pk([5] * 6), 1.0)
    c.evict_device(6)
    c.settle()
    c.insert(pk([6] * 6), 2.0)
    c.evict_device(6)  # [5]*6 left host for [6]*6: storage only
    hit = c.match(pk([5] * 6 + [7] * 6), 3.0)  # 12 tokens to look up, 6 found
    assert hit.storage_tokens == 6
    hit = c.match(pk([5] * 6), 4.0)  # 6 tokens to look up: below the threshold, no lookup
    assert hit.storage_tokens == 0 and hit.path == []


def test_a_storage_hit_is_prefetched_into_host_as_one_node_and_is_not_a_backup() -> None:
    """An L3 hit is inserted into host as one new tree node (``insert_host``) and loaded on; it
    does not count in ``hicache_backup_tokens_total`` (real: with the file tier the backup
    volume is what HBM wrote, not what came back from L3)."""
    c, key = storage_only_continuation("write_through")
    backed, written = c.host.backed_up, c.storage.backed_up
    hit, _ = load(c, key, 5.0)
    assert hit.storage_tokens == 10 and hit.storage_nodes == 1
    assert hit.path[-1].tiers == DEVICE | HOST and hit.path[-1].ntokens == 10
    assert (c.host.backed_up, c.storage.backed_up) == (backed, written)
    assert c.counters.loaded_from_storage == 10
    c.check()


def test_kv_that_left_hbm_and_host_leaves_the_tree_and_comes_back_as_one_node() -> None:
    """SGLang's tree forgets KV that is in neither HBM nor host (L3 is a store apart), so KV
    computed again, or fetched again, forms one new node whatever the old node boundaries: they
    decide how much later evictions take at a time (real engine: write-back with the file tier
    backed up as much as without it once programs' KV had come back through storage)."""
    c = KVCache(host_tokens=12, storage_tokens=1000, load_back_threshold=0, storage_prefetch_threshold=0)
    c.insert(pk([1] * 4), 1.0)
    c.insert(pk([1] * 8), 1.1)
    c.insert(pk([1] * 12), 1.2)  # three nodes of 4
    c.evict_device(12)
    c.settle()
    c.insert(pk([2] * 12), 2.0)  # host room: [1]*12 leaves the tree, stays stored
    assert in_tree(c, [1] * 12) == 0 and stored(c, [1] * 12) == 12
    last, new = c.insert(pk([1] * 12), 3.0)  # computed again
    assert new == 12 and last.ntokens == 12
    c.check()


def test_storage_is_written_from_new_host_copies_only_and_every_write_counts() -> None:
    c = KVCache(host_tokens=10, storage_tokens=100)
    a, _ = c.insert(pk([1] * 10), 1.0)
    c.lock(a)  # A fills host and stays in HBM: nothing on host can be evicted
    b, _ = c.insert(pk([2] * 10), 2.0)
    assert b.tiers == DEVICE and stored(c, [2] * 10) == 0  # no host copy, so no storage copy either
    assert (c.host.backed_up, c.storage.backed_up, c.storage_used) == (10, 10, 10)
    # write_back: A backed up, loaded back, its host copy reclaimed, backed up again: L3 is
    # written twice (SGLang counts every write in backuped_tokens_total) and holds it once
    c = KVCache(host_tokens=10, storage_tokens=100, write_policy="write_back", load_back_threshold=0)
    a, _ = c.insert(pk([1] * 10), 1.0)
    c.evict_device(10)
    _, last = load(c, [1] * 10 + [9], 2.0)  # A in HBM (locked) and host
    b, _ = c.insert(pk([2] * 10), 3.0)
    c.evict_device(10)  # B to host: A's duplicate host copy makes room
    assert a.tiers == DEVICE and b.tiers == HOST
    c.settle()  # B's storage write completes
    c.unlock(last)
    c.evict_device(10)  # A to host again (B, host only, makes room)
    assert a.tiers == HOST and in_tree(c, [2] * 10) == 0 and stored(c, [2] * 10) == 10
    assert c.host.backed_up == c.storage.backed_up == 30 and c.storage_used == 20
    c.check()


def test_a_storage_hit_evicts_host_to_its_full_size_or_takes_the_part_that_fits() -> None:
    """SGLang's ``allocate_storage_hit``: without room for the whole hit, ``evict_host(hit)``
    (the hit's size, not the shortfall), then the whole hit, or what fits if at least the
    prefetch threshold (real engine: a storage hit after host pressure freed more host than
    the shortfall, and a referenced program's newest node went with it)."""
    c = KVCache(host_tokens=25, storage_tokens=1000, load_back_threshold=0, storage_prefetch_threshold=0)
    c.insert(pk([9] * 10), 1.0)
    c.evict_device(10)
    for i in range(1, 5):
        c.insert(pk([i] * 3), 2.0 + i)
    c.evict_device(12)
    c.settle()
    c.insert(pk([8] * 10), 7.0)  # host room for Y: X (oldest) leaves host
    c.evict_device(10)
    c.settle()
    assert in_tree(c, [9] * 10) == 0 and c.host.free == 3
    hit, last = load(c, [9] * 10 + [0], 8.0)
    assert hit.storage_tokens == 10
    # 10 evicted for a 7-token shortfall: all four 3-token leaves go, Y stays
    assert all(in_tree(c, [i] * 3) == 0 for i in range(1, 5)) and in_tree(c, [8] * 10) == 10
    assert c.host.free == 5
    c.unlock(last)
    c.check()
    # partial: host holds 10 tokens still in HBM; 6 free of the 10 the hit needs
    c = KVCache(host_tokens=16, storage_tokens=1000, load_back_threshold=0, storage_prefetch_threshold=4)
    c.insert(pk([9] * 10), 1.0)
    c.evict_device(10)
    c.settle()
    c.insert(pk([8] * 10), 2.0)  # X leaves host for Z; Z stays in HBM
    assert in_tree(c, [9] * 10) == 0
    hit, last = load(c, [9] * 10 + [0], 3.0)
    assert (hit.storage_tokens, hit.path[-1].ntokens, hit.path[-1].tiers) == (6, 6, DEVICE | HOST)
    c.unlock(last)
    c.check()
    c = KVCache(host_tokens=16, storage_tokens=1000, load_back_threshold=0, storage_prefetch_threshold=8)
    c.insert(pk([9] * 10), 1.0)
    c.evict_device(10)
    c.settle()
    c.insert(pk([8] * 10), 2.0)
    hit, last = load(c, [9] * 10 + [0], 3.0)  # 6 fit, below the threshold of 8: nothing fetched
    assert hit.total == 0 and hit.path == []
    c.check()


def write_back_with_duplicate() -> tuple[KVCache, object, object]:
    """write_back, host 20: A loaded back (in HBM and host: a duplicate), B in host only."""
    c = KVCache(host_tokens=20, write_policy="write_back", load_back_threshold=0)
    a, _ = c.insert(pk([1] * 10), 1.0)
    c.evict_device(10)
    b, _ = c.insert(pk([2] * 10), 2.0)
    c.evict_device(10)
    assert a.tiers == b.tiers == HOST and c.host_used == 20
    return c, a, b


def test_write_back_reclaims_host_copies_of_hbm_kv_before_host_only_kv() -> None:
    """Host pressure under write_back frees duplicate host copies first
    (``_reclaim_full_host_duplicates``), then host-only leaves by LRU: B, older than nothing
    else on host, stays; A keeps its HBM copy and loses its host one."""
    c, a, b = write_back_with_duplicate()
    load(c, [1] * 10 + [9], 3.0)  # A in HBM and host, locked by its request
    d, _ = c.insert(pk([3] * 10), 4.0)
    c.evict_device(10)  # D to host: needs 10 tokens of host
    assert d.tiers == HOST and b.tiers == HOST and a.tiers == DEVICE
    c.check()


def test_the_first_reclaim_pass_spares_duplicates_that_hbm_evicts_next() -> None:
    """A duplicate that is an HBM eviction candidate (an unlocked leaf) keeps its host copy
    while another duplicate can give one: its host copy saves the backup when it goes."""
    c = KVCache(host_tokens=30, write_policy="write_back", load_back_threshold=0)
    a, _ = c.insert(pk([1] * 10), 1.0)
    e, _ = c.insert(pk([2] * 10), 1.5)
    c.evict_device(20)
    _, la = load(c, [1] * 10 + [9], 2.0)  # A: duplicate first
    _, le = load(c, [2] * 10 + [9], 2.5)  # E: duplicate second
    g, _ = c.insert(pk([4] * 10), 3.0)
    c.evict_device(10)  # G to host: it fits
    assert g.tiers == HOST and a.tiers == e.tiers == DEVICE | HOST and c.host_used == 30
    c.unlock(la)  # A: an unlocked HBM leaf
    h, _ = c.insert(pk([5] * 10), 4.0)
    c.match(pk([1] * 10), 5.0)  # A used after H: H goes first
    c.evict_device(10)  # H to host, which is full: E's host copy goes, not A's (listed first)
    assert h.tiers == HOST and e.tiers == DEVICE and a.tiers == DEVICE | HOST and g.tiers == HOST
    c.unlock(le)
    c.check()


def test_host_copies_of_kv_being_loaded_back_are_pinned_until_the_load_completes() -> None:
    c, a, b = write_back_with_duplicate()
    _, last = load(c, [1] * 10 + [9], 3.0, settle=False)  # A's load-back has not completed
    d, _ = c.insert(pk([3] * 10), 4.0)
    c.evict_device(10)  # no duplicate to reclaim yet: B, the LRU host leaf, goes
    assert d.tiers == HOST and not b.tiers and a.tiers == DEVICE | HOST
    c.settle()
    e, _ = c.insert(pk([4] * 10), 5.0)
    c.evict_device(10)  # now A's host copy is a duplicate and goes first
    assert e.tiers == HOST and d.tiers == HOST and a.tiers == DEVICE
    c.unlock(last)
    c.check()


def test_a_node_that_becomes_a_duplicate_again_keeps_its_place() -> None:
    """SGLang's duplicate list drops entries lazily (``setdefault`` on registration): a node
    backed up at eviction is listed then; loaded back later it is reclaimed before nodes that
    became duplicates in between (the real engine's write_back backup volume needs this)."""
    c = KVCache(host_tokens=20, write_policy="write_back", load_back_threshold=0)
    a, _ = c.insert(pk([1] * 5), 1.0)
    c.evict_device(5)  # A listed (backed up while in HBM), then stale
    b, _ = c.insert(pk([2] * 5), 2.0)
    c.evict_device(5)  # B listed after A
    _, lb = load(c, [2] * 5 + [9], 3.0)  # B: a duplicate again (its entry was never dropped)
    _, la = load(c, [1] * 5 + [9], 4.0)  # A: a duplicate again, listed before B
    x, _ = c.insert(pk([3] * 10), 5.0)
    c.evict_device(10)  # host 10 used of 20: X fits
    y, _ = c.insert(pk([4] * 5), 6.0)
    c.evict_device(5)  # host full: A, first listed, loses its host copy, not B
    assert a.tiers == DEVICE and b.tiers == DEVICE | HOST and y.tiers == HOST
    c.unlock(la)
    c.unlock(lb)
    c.check()


def test_host_eviction_takes_unreferenced_kv_before_session_kv() -> None:
    """SGLang orders host leaves as device leaves: ``(ref > 0, ref, last access)``."""
    c = KVCache(host_tokens=20)
    a, _ = c.insert(pk([1] * 10), 1.0)
    b, _ = c.insert(pk([2] * 10), 2.0)
    c.refs.register("s", c.refs.open("s"), a)
    c.evict_device(20)
    assert a.tiers == b.tiers == HOST
    d, _ = c.insert(pk([3] * 10), 3.0)  # host room for D: B goes though A is older
    assert not b.tiers and a.tiers == HOST and d.tiers == DEVICE | HOST
    c.check()


def test_flush_drops_hbm_and_host_and_keeps_the_storage_tier() -> None:
    c = KVCache(host_tokens=100, storage_tokens=100, load_back_threshold=0, storage_prefetch_threshold=0)
    c.insert(pk([1] * 10 + [2] * 10), 1.0)
    c.insert(pk([1] * 10 + [3] * 5), 2.0)
    c.flush()
    assert c.device_tokens == c.host_used == 0 and c.storage_used == 25
    c.check()
    hit = c.match(pk([1] * 10 + [2] * 10 + [4]), 3.0)
    assert (hit.device_tokens, hit.host_tokens, hit.storage_tokens) == (0, 0, 20)
    c = KVCache(host_tokens=100)
    c.insert(pk([1] * 10), 1.0)
    c.flush()
    assert c.tree.num_nodes == 0 and c.host_used == 0


def test_metrics_report_the_storage_tier_under_sglang_names() -> None:
    """``sglang:backuped_tokens_total`` (host → L3 writes) and ``sglang:prefetched_tokens_total``
    (L3 → host), labelled with the storage backend, as SGLang's storage metrics collector."""
    cfg = unit_config(hicache__enabled=True, hicache__host_tokens=12_000, hicache__storage_backend="file",
                      hicache__storage_capacity_tokens=50_000)
    e = Engine(cfg)
    a_ids, b_ids, c_ids = tokens(6000), tokens(6000, start=1 << 25), tokens(6000, start=2 << 25)
    for rid, ids, t in (("a", a_ids, 0.0), ("b", b_ids, 1.0), ("c", c_ids, 1.5), ("a2", a_ids, 2.0)):
        e.submit(SimRequest(rid, ids, 1), t)
        drain(e)
    text = metrics_text([e.stats()], cfg)

    def value(name: str) -> float:
        (line,) = [x for x in text.splitlines() if x.startswith(name + "{")]
        assert 'storage_backend="file"' in line
        return float(line.rsplit(" ", 1)[1])

    # A, B and C, written from host once each, and a2's last prompt token (computed again)
    assert value("sglang:backuped_tokens_total") == 18_001
    assert value("sglang:prefetched_tokens_total") == 5999  # A again, from L3
    assert e.cache.host.backed_up == 18_001  # the prefetch is no backup


def test_a_host_copy_being_written_to_storage_stays_until_the_write_completes() -> None:
    """``write_backup_storage`` host-locks a node until its storage write is acknowledged (at
    the next scheduler step): meanwhile its host copy can be neither evicted nor reclaimed."""
    c = KVCache(host_tokens=10, storage_tokens=100)
    x, _ = c.insert(pk([1] * 10), 1.0)  # written to host, then to storage
    c.evict_device(10)
    y, _ = c.insert(pk([2] * 10), 2.0)  # host full of X, still being stored: Y gets no host copy
    assert x.tiers == HOST and y.tiers == DEVICE
    c.settle()
    z, _ = c.insert(pk([3] * 10), 3.0)  # now X's host copy makes room
    assert in_tree(c, [1] * 10) == 0 and z.tiers == DEVICE | HOST
    c.check()
