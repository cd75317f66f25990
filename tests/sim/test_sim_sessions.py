"""Session-referenced KV (SGLang's --enable-session-radix-cache), as measured on the real CPU
engine (../shared/docs/real-sglang-cpu.md): pool 24,576 tokens, a 6,016-token prompt sent with a
session_id, four unrelated 5,016-token prompts, then the first prompt again."""

from __future__ import annotations

import pytest
from simkit import drain, tokens, unit_config

from thunder_sgl.sim import SimRequest
from thunder_sgl.sim.engine import Engine


def engine(sessions: bool = True) -> Engine:
    return Engine(unit_config(server__max_total_num_tokens=24_576, server__chunked_prefill_size=4096,
                              server__enable_session_radix_cache=sessions))


def run(e: Engine, rid: str, prompt, session: str | None = None, t: float = 0.0) -> int:  # noqa: ANN001
    e.submit(SimRequest(rid, prompt, 1, session_id=session), t)
    (c,) = drain(e)
    return c.cached_tokens


@pytest.mark.parametrize(("session", "cached"), [("prog-1", 6015), (None, 4096)])
def test_a_session_keeps_its_kv_through_other_traffic_and_lru_does_not(session: str | None, cached: int) -> None:
    e = engine()
    first = tokens(6016)
    run(e, "a", first, session)
    for i in range(4):
        run(e, f"other-{i}", tokens(5016, start=(i + 2) << 24))
    # The real engine: 6,015 cached with the session (all but the last token, always computed),
    # 4,096 without (LRU evicted the second chunk of the prompt; the first, 4,096 tokens, stayed).
    assert run(e, "again", first) == cached
    e.cache.check()


def test_closing_the_session_makes_its_kv_evictable_again() -> None:
    e = engine()
    first = tokens(6016)
    run(e, "a", first, "prog-1")
    assert e.close_session("prog-1")
    for i in range(4):
        run(e, f"other-{i}", tokens(5016, start=(i + 2) << 24))
    assert run(e, "again", first) == 4096
    assert not e.close_session("prog-1")  # nothing left to dereference


def test_without_the_server_flag_session_ids_change_nothing() -> None:
    e = engine(sessions=False)
    first = tokens(6016)
    run(e, "a", first, "prog-1")
    for i in range(4):
        run(e, f"other-{i}", tokens(5016, start=(i + 2) << 24))
    assert run(e, "again", first) == 4096


def test_referenced_kv_is_still_evicted_when_nothing_else_is_left_and_refs_stay_consistent() -> None:
    e = engine()
    # Five sessions of 6,016 tokens each do not fit 24,576: the oldest referenced KV goes.
    for i in range(5):
        run(e, f"s{i}", tokens(6016, start=(i + 2) << 24), f"prog-{i}")
    nodes = e.cache.tree.nodes()
    assert all(n.refs >= 0 for n in nodes)
    assert sum(1 for n in nodes if n.refs) >= 3
    for i in range(5):
        e.close_session(f"prog-{i}")
    assert all(n.refs == 0 for n in e.cache.tree.nodes())
    e.cache.check()


def test_a_request_finishing_after_its_session_closed_does_not_reference_again() -> None:
    e = engine()
    e.submit(SimRequest("late", tokens(6016), 50, session_id="prog-1"), 0.0)
    drain(e, until=0.001)  # in flight
    e.close_session("prog-1")
    drain(e)
    assert all(n.refs == 0 for n in e.cache.tree.nodes())
    # a newer request of the same session reopens it
    run(e, "new", tokens(100, start=9 << 24), "prog-1", t=10.0)
    assert any(n.refs for n in e.cache.tree.nodes())
