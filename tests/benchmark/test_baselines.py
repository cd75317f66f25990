"""Decisions of the re-implemented stock policies on hand-built states (``benchmark.des.baselines``)."""

from __future__ import annotations

from array import array

import pytest

from thunder_sgl.backends.parse import RankLoad
from thunder_sgl.benchmark.des.baselines import (
    ApproxTree,
    RoundRobin,
    RouteRequest,
    SglangCacheAware,
    SmgCacheAware,
    make_baseline,
    text_key,
)


def key(*runs: tuple[int, int]) -> bytes:
    """The routed text of packed tokens: each run is (first id, count) of consecutive ids."""
    out = array("I")
    for start, n in runs:
        out.extend(range(start, start + n))
    return text_key(out.tobytes())


def req(*runs: tuple[int, int]) -> RouteRequest:
    return RouteRequest(key(*runs))


def rank(waiting: int = 0, usage: float = 0.0) -> list[RankLoad]:
    return [RankLoad(0, 0, 1000, 0, waiting, usage, 0.0, 0)]


def test_round_robin_cycles_over_workers() -> None:
    rr = RoundRobin(3)
    assert [rr.select(req((1, 4))) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert rr.loads == [3, 2, 2]


def test_sglang_cache_aware_sequential_distinct_prompts_at_zero_load_all_go_to_worker_0() -> None:
    """sglang-surface.md §3.8 (issue #32983): a miss goes to the least loaded, ties to the first."""
    ca = SglangCacheAware(4)
    chosen = []
    for i in range(5):
        w = ca.select(req((1000 * (i + 1), 50)))
        chosen.append(w)
        ca.on_complete(w)
    assert chosen == [0, 0, 0, 0, 0]


def test_sglang_cache_aware_distinct_prompts_in_flight_spread_by_load() -> None:
    ca = SglangCacheAware(3)
    assert [ca.select(req((1000 * (i + 1), 50))) for i in range(4)] == [0, 1, 2, 0]


def test_sglang_cache_aware_follows_the_match_above_threshold() -> None:
    ca = SglangCacheAware(2)
    ca.loads = [0, 5]
    assert ca.select(req((1, 100))) == 0  # miss: least loaded
    ca.loads = [50, 0]
    # 100 of 150 tokens match (0.67 > 0.3): the matched worker despite its load
    assert ca.select(req((1, 100), (500, 50))) == 0
    # 30 of 100 match: exactly 0.3 is not above the threshold, so least loaded
    ca.loads = [50, 0]
    assert ca.select(req((1, 30), (900, 70))) == 1


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ([70, 0], 1),  # diff 70 > 64 and 70 > 0 × 1.5: imbalanced
        ([64, 0], 0),  # diff 64 is not above 64: the cache match wins
        ([200, 130], 1),  # diff 70 > 64 and 200 > 195
        ([200, 140], 0),  # diff 60
        ([300, 210], 0),  # diff 90 but 300 < 315: not imbalanced
    ],
)
def test_sglang_cache_aware_imbalance_rule(loads: list[int], expected: int) -> None:
    ca = SglangCacheAware(2)
    ca.tree.insert(key((1, 100)), 0)
    ca.loads = list(loads)
    assert ca.select(req((1, 100), (7, 10))) == expected


def test_sglang_cache_aware_inserts_under_the_chosen_worker_even_when_imbalanced() -> None:
    ca = SglangCacheAware(2)
    ca.loads = [100, 0]
    assert ca.select(req((5000, 80))) == 1
    ca.loads = [0, 0]
    assert ca.select(req((5000, 80), (1, 5))) == 1


def test_agent_program_sticks_to_its_worker_and_new_programs_follow_the_shared_prompt() -> None:
    """A new program's first request matches the shared system prompt (> 30% of it), so it
    goes where the first program went; later steps match their own history."""
    ca = SglangCacheAware(2)
    system = (10_000, 1500)
    assert ca.select(req(system, (1, 500))) == 0
    ca.loads = [3, 0]  # balanced by the rule; a second program still follows the prompt
    assert ca.select(req(system, (2, 500))) == 0
    ca.loads = [100, 0]  # imbalanced: the third program goes to worker 1 and sticks there
    assert ca.select(req(system, (3, 500))) == 1
    ca.loads = [10, 10]
    assert ca.select(req(system, (3, 500), (70_000, 300))) == 1


def test_text_key_spells_each_token_as_a_word_of_the_drivers_text() -> None:
    from thunder_sgl.textgen import WORDS

    k = key((1, 3), (10_000, 2))
    words = k.decode().split(" ")
    assert words[-1] == "" and len(words) == 6 and all(w in WORDS for w in words[:-1])
    assert k.startswith(key((1, 3))) and key((2, 1)) == key((1, 3))[len(key((1, 1))):][: len(key((2, 1)))]
    assert len({key((i, 1)) for i in range(3000)}) == len(WORDS)  # every word is used


def test_tree_match_counts_partial_edges_and_split_keeps_tenants() -> None:
    t = ApproxTree()
    t.insert(b"abcdefghij", 3)
    assert t.match(b"abcdefxyzw") == (6, 3)
    t.insert(b"abcdefxyzw", 5)  # splits the edge at 6: the prefix node carries 3 and 5
    assert t.match(b"abcdef") == (6, 3)
    assert t.match(b"abcdefxyzw") == (10, 5)
    assert t.sizes == {3: 10, 5: 10}


def test_a_match_that_parts_inside_a_branch_returns_that_branchs_tenant() -> None:
    """Upstream's tree is of characters: where a new prompt parts from the shared one, it
    follows the branch that starts with its next character as far as it matches and returns
    that branch's tenant, not the shared node's first one."""
    t = ApproxTree()
    t.insert(b"SYSTEM:kettle", 0)
    t.insert(b"SYSTEM:bottle", 1)
    assert t.match(b"SYSTEM:banana") == (8, 1)  # "b" follows worker 1's branch
    assert t.match(b"SYSTEM:kiwi") == (8, 0)
    assert t.match(b"SYSTEM:zebra") == (7, 0)  # no branch starts with "z": the shared node's first


def test_sglang_router_picks_a_shared_nodes_tenant_by_that_nodes_own_order() -> None:
    """0.3.2 returns the first tenant of the node's DashMap, whose hash state is the node's own:
    fixed for a node (and kept by a split), but unrelated between nodes. So programs that stop
    at different shared nodes do not all land on one worker; smg keeps the node's creator."""
    t = ApproxTree("dashmap")
    firsts = []
    for i in range(40):  # 40 shared nodes, each carrying both workers
        stem = bytes([65 + i % 26, 65 + i // 26]) * 3
        t.insert(stem + b"x", 0)
        t.insert(stem + b"y", 1)
        first = t.match(stem + b"z")[1]
        assert all(t.match(stem + b"z")[1] == first for _ in range(3))  # fixed for the node
        firsts.append(first)
    assert 10 < firsts.count(0) < 30  # both workers come first at some nodes
    smg = ApproxTree("earliest")
    smg.insert(b"AAx", 1)
    smg.insert(b"AAy", 0)
    assert smg.match(b"AAz") == (2, 1)
    with pytest.raises(ValueError):
        ApproxTree("random")


def test_per_worker_eviction_drops_least_recently_used_leaves_first() -> None:
    t = ApproxTree()
    t.insert(b"aaaaaaaaaa", 0)  # oldest
    t.insert(b"bbbbbbbbbb", 0)
    t.insert(b"cccccccccc", 1)
    t.insert(b"dddddddddd", 0)  # newest
    freed = t.evict(20, per_tenant=True)
    assert freed == 10 and t.sizes == {0: 20, 1: 10}
    assert t.match(b"aaaaaaaaaa")[0] == 0
    assert t.match(b"dddddddddd") == (10, 0)


def test_whole_tree_eviction_bounds_the_sum_over_workers() -> None:
    t = ApproxTree()
    for i, w in enumerate([0, 1, 0, 1]):
        t.insert(bytes([97 + i]) * 10, w)
    t.evict(25, per_tenant=False)
    assert t.total_size == 20
    assert t.match(b"aaaaaaaaaa")[0] == 0 and t.match(b"dddddddddd")[0] == 10


@pytest.mark.parametrize(
    ("reports", "loads", "expected", "decision"),
    [
        ([rank(8), rank(0)], [0, 0], 1, "overload_fallback"),  # waiting ≥ 8: left out
        ([rank(7), rank(0)], [0, 0], 0, "match"),
        ([rank(0, 0.8), rank(0)], [0, 0], 1, "overload_fallback"),  # usage ≥ 0.8, inclusive
        ([rank(9), rank(9, 0.9)], [3, 1], 1, "all_overloaded"),  # all over: least loaded
        ([rank(), rank()], [20, 0], 1, "spill"),  # mean 10, margin 6.3: 20 > 16.3 and > 15
        ([rank(), rank()], [12, 4], 0, "match"),  # mean 8: 12 < 13.7
    ],
)
def test_smg_overload_protection_and_spill_gate(
    reports: list[list[RankLoad]], loads: list[int], expected: int, decision: str
) -> None:
    smg = SmgCacheAware(2)
    smg.tree.insert(key((1, 100)), 0)
    smg.poll(0.0, reports)
    smg.loads = list(loads)
    assert smg.select(req((1, 100), (7, 10))) == expected
    assert smg.decisions[decision] == 1


def test_smg_miss_avoids_overloaded_workers_ties_to_first() -> None:
    smg = SmgCacheAware(3)
    smg.poll(0.0, [rank(10), rank(0), rank(0)])
    assert smg.select(req((5, 50))) == 1


def test_make_baseline_rejects_unknown_names_listing_valid_ones() -> None:
    with pytest.raises(ValueError, match="sglang-round_robin"):
        make_baseline("power_of_two", 2)
    assert isinstance(make_baseline("smg-cache_aware", 2), SmgCacheAware)


def test_direct_binds_each_program_to_one_worker_and_refills_the_freed_one() -> None:
    from thunder_sgl.benchmark.des.baselines import Direct

    d = Direct(2)
    first = [d.select(RouteRequest(b"x", f"p{i}")) for i in range(4)]
    assert first == [0, 1, 0, 1]
    assert [d.select(RouteRequest(b"y", f"p{i}")) for i in range(4)] == first  # sticky
    d.on_release("p1")
    assert d.select(RouteRequest(b"z", "p9")) == 1  # the freed slot's worker
