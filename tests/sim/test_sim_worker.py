"""A worker: DP ranks, output length modes, cache reporting switch, the in-process driving API."""

from __future__ import annotations

import pytest
from simkit import tokens, unit_config

from thunder_sgl.sim import SimRequest, SimRequestError, SimWorker
from thunder_sgl.sim.protocol import usage


def drain(w: SimWorker) -> list:
    out = []
    while (t := w.next_event_time()) is not None:
        out += w.advance(t)
    return out


def test_requests_without_a_rank_alternate_over_dp_ranks_and_explicit_ranks_are_kept() -> None:
    w = SimWorker(unit_config(server__dp_size=2))
    ranks = [w.submit(SimRequest(f"r{i}", tokens(10, start=(1 << 24) + 100 * i), 3), 0.0) for i in range(4)]
    assert ranks == [1, 0, 1, 0]
    assert w.submit(SimRequest("pinned", tokens(10), 3, dp_rank=1), 0.0) == 1
    with pytest.raises(SimRequestError, match="dp rank"):
        w.submit(SimRequest("bad", tokens(10), 3, dp_rank=2), 0.0)
    done = drain(w)
    assert sorted(c.rid for c in done) == ["pinned", "r0", "r1", "r2", "r3"]
    assert [c.time for c in done] == sorted(c.time for c in done)
    assert [len(e.reqs) for e in w.engines] == [0, 0]


def test_shortest_queue_balancing_picks_the_least_busy_rank() -> None:
    w = SimWorker(unit_config(server__dp_size=2, server__dp_load_balance="shortest_queue"))
    assert w.submit(SimRequest("a", tokens(10), 100, dp_rank=0), 0.0) == 0
    assert w.submit(SimRequest("b", tokens(10), 100), 0.0) == 1


def test_lognormal_mode_stops_early_unless_ignore_eos() -> None:
    w = SimWorker(unit_config(output__length_mode="lognormal", output__lognormal_median=5.0, output__lognormal_sigma=0.1))
    w.submit(SimRequest("eos", tokens(10), 100, ignore_eos=False), 0.0)
    w.submit(SimRequest("ign", tokens(10, start=1 << 25), 100, ignore_eos=True), 0.0)
    done = {c.rid: c for c in drain(w)}
    assert 3 <= done["eos"].completion_tokens <= 8 and done["eos"].finish_reason == "stop"
    assert done["ign"].completion_tokens == 100 and done["ign"].finish_reason == "length"


def test_forced_output_ids_are_returned_and_cached() -> None:
    w = SimWorker(unit_config())
    forced = tokens(5, start=1 << 27)
    w.submit(SimRequest("a", tokens(10), 5, output_ids=forced), 0.0)
    (a,) = drain(w)
    assert a.output_ids == forced
    w.submit(SimRequest("b", tokens(10) + forced + tokens(3, start=1 << 28), 5), 1.0)
    (b,) = drain(w)
    assert b.cached_tokens == 14  # prompt 10 + forced output minus its last token


@pytest.mark.parametrize(("report", "expected"), [(True, {"cached_tokens": 9}), (False, None)])
def test_cache_report_switch_controls_prompt_tokens_details(report: bool, expected: object) -> None:
    cfg = unit_config(server__enable_cache_report=report)
    w = SimWorker(cfg)
    for rid, t in (("a", 0.0), ("b", 1.0)):
        w.submit(SimRequest(rid, tokens(10), 2), t)
        (c,) = drain(w)
    assert usage(c, cfg)["prompt_tokens_details"] == expected


def test_counters_and_state_for_plots_sum_over_ranks() -> None:
    w = SimWorker(unit_config(server__dp_size=2, hicache__enabled=True))
    for i in range(4):
        w.submit(SimRequest(f"r{i}", tokens(100, start=(1 << 24) + 1000 * i), 10), 0.0)
    drain(w)
    c = w.counters
    assert (c.requests_finished, c.prompt_tokens, c.generation_tokens) == (4, 400, 40)
    assert w.device_used_tokens == 4 * 109 and w.host_used_tokens == 4 * 109
    assert (w.num_running, w.num_waiting) == (0, 0)
