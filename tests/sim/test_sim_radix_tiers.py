"""Radix tree and tier bookkeeping: structure against a naive model, LRU order, invariants."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_sgl.sim.radix import DEVICE, HOST, RadixTree
from thunder_sgl.sim.tiers import KVCache


def pk(ids: list[int]) -> bytes:
    return array("I", ids).tobytes()


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


keys = st.lists(st.lists(st.integers(1, 3), min_size=0, max_size=12), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(inserted=keys, queries=keys, page=st.sampled_from([1, 2, 3]))
def test_match_finds_the_longest_page_aligned_cached_prefix(inserted: list[list[int]], queries: list[list[int]], page: int) -> None:
    tree = RadixTree(page)
    stored = []
    for k in inserted:
        k = k[: len(k) - len(k) % page]
        tree.insert(pk(k), 0.0, DEVICE)
        stored.append(k)
    for q in queries:
        path, nbytes = tree.match(pk(q), 1.0)
        best = max((lcp(q, s) for s in stored), default=0)
        assert nbytes // 4 == best - best % page
        assert sum(n.ntokens for n in path) == nbytes // 4
    # every stored key is still a full path
    for s in stored:
        assert tree.match(pk(s), 2.0)[1] // 4 == len(s)


def test_device_eviction_takes_lru_unlocked_leaves_first() -> None:
    c = KVCache()
    a, _ = c.insert(pk([1] * 10), now=1.0)
    b, _ = c.insert(pk([2] * 10), now=2.0)
    d, _ = c.insert(pk([3] * 10), now=3.0)
    c.lock(a)
    c.match(pk([2] * 10), now=4.0)  # touching B makes D the least recently used
    assert c.evict_device(5) == 10
    assert not d.tiers and b.tiers & DEVICE and a.tiers & DEVICE
    assert c.evict_device(100) == 10  # only B is left to evict: A is locked
    assert c.device_tokens == 10 and c.protected == 10 and c.evictable == 0
    c.unlock(a)
    assert c.evictable == 10
    c.check()


def test_write_through_keeps_host_inclusive_and_host_lru_evicts_only_non_device_nodes() -> None:
    c = KVCache(host_tokens=20)
    a, _ = c.insert(pk([1] * 10), now=1.0)
    b, _ = c.insert(pk([2] * 10), now=2.0)
    assert a.tiers == b.tiers == DEVICE | HOST and c.host_used == 20
    c.evict_device(10)  # A leaves HBM, keeps its host copy
    assert a.tiers == HOST
    d, _ = c.insert(pk([3] * 10), now=3.0)  # host full: A (host-only) makes room, B (in HBM) stays
    assert not a.tiers and d.tiers == DEVICE | HOST and b.tiers == DEVICE | HOST
    c.check()


@pytest.mark.parametrize("seed", range(30))
def test_random_operations_keep_every_tier_count_consistent(seed: int) -> None:
    rng = random.Random(seed)
    page = rng.choice([1, 2, 4])
    c = KVCache(page_size=page, host_tokens=rng.choice([0, 60, 200]), storage_tokens=rng.choice([0, 150]),
                write_policy=rng.choice(["write_through", "write_back"]), load_back_threshold=rng.choice([0, 3]),
                storage_prefetch_threshold=rng.choice([0, 5]))
    held = []
    for step in range(300):
        op = rng.random()
        key = pk([rng.randint(1, 3) for _ in range(rng.randint(0, 24))])
        if op < 0.4:
            last, _ = c.insert(key, float(step))
            if rng.random() < 0.3:
                c.lock(last)
                held.append(last)
        elif op < 0.6:
            hit = c.match(key, float(step))
            last = hit.path[-1] if hit.path else c.tree.root
            c.lock(last)
            if hit.storage_tokens:
                hit, last = c.prefetch_locked(hit, last, float(step))
            if hit.load_tokens:
                c.promote(hit)
            held.append(last)
        elif op < 0.8 and held:
            c.unlock(held.pop(rng.randrange(len(held))))
        elif op < 0.83 and not held:
            c.flush()  # HBM and host dropped, storage kept
            assert c.device_tokens == c.host_used == 0
        else:
            c.evict_device(rng.randint(1, 30))
        if rng.random() < 0.5:
            c.settle()
        c.check()
    for n in held:
        c.unlock(n)
    c.evict_device(10**9)
    c.check()
    assert c.device_tokens == 0
