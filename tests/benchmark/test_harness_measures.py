"""Pure measures of the HTTP harness: recompute, imbalance, Prometheus histograms."""

from __future__ import annotations

import math

import pytest

from thunder_sgl.benchmark.measures.derived import (
    Histogram,
    imbalance,
    overhead_per_request,
    parse_counter,
    parse_histogram,
    recompute_tokens,
    window_check,
)
from thunder_sgl.benchmark.measures.stats import StepRecord


def call(pid: str, step: int, end: float, prompt: int, completion: int, cached: int, ok: bool = True) -> StepRecord:
    return StepRecord(pid, step, 0, end - 1.0, end, 200 if ok else 503, None if ok else "http_503",
                      prompt, completion, cached)


@pytest.mark.parametrize(("steps", "t_from", "expected"), [
    # a perfect prefix cache: nothing recomputed
    ([call("a", 0, 1, 1000, 100, 0), call("a", 1, 2, 1600, 100, 1100)], 0.0, 0),
    # the whole history evicted: the 1100 tokens computed before are prefilled again
    ([call("a", 0, 1, 1000, 100, 0), call("a", 1, 2, 1600, 100, 0)], 0.0, 1100),
    # only the shared system prompt cached: recompute = computed before − cached
    ([call("a", 0, 1, 1000, 100, 0), call("a", 1, 2, 1600, 100, 400)], 0.0, 700),
    # the first call of a program never counts as recompute, even with a cold cache
    ([call("a", 0, 1, 1000, 100, 0), call("b", 0, 2, 1000, 100, 0)], 0.0, 0),
    # calls before the window warm the program up but are not summed
    ([call("a", 0, 1, 1000, 100, 0), call("a", 1, 2, 1600, 100, 0), call("a", 2, 5, 2200, 100, 0)], 3.0, 1700),
    # a failed call computes nothing
    ([call("a", 0, 1, 1000, 100, 0, ok=False), call("a", 0, 2, 1000, 100, 0)], 0.0, 0),
    # cached beyond what this program computed (shared prefix of others) never goes negative
    ([call("a", 0, 1, 1000, 100, 0), call("a", 1, 2, 1600, 100, 1500)], 0.0, 0),
])
def test_recompute_tokens(steps, t_from, expected):
    assert recompute_tokens(steps, t_from) == expected


def test_imbalance_is_spread_across_nodes_after_warmup():
    samples = [(0.0, [0.0, 1.0]), (10.0, [0.2, 0.6]), (20.0, [0.5, 0.5]), (30.0, [0.9, 0.1])]
    mean, top = imbalance(samples, t_from=10.0)
    assert mean == pytest.approx((0.4 + 0.0 + 0.8) / 3)
    assert top == pytest.approx(0.8)
    assert imbalance([], 0.0) == (0.0, 0.0)
    assert imbalance([(1.0, [0.7])], 0.0) == (0.0, 0.0)


THUNDER_METRICS = """\
# HELP thunder_held_wait_seconds Time requests were held before dispatch
# TYPE thunder_held_wait_seconds histogram
thunder_held_wait_seconds_bucket{le="0.1"} 2.0
thunder_held_wait_seconds_bucket{le="1.0"} 6.0
thunder_held_wait_seconds_bucket{le="10.0"} 10.0
thunder_held_wait_seconds_bucket{le="+Inf"} 10.0
thunder_held_wait_seconds_count 10.0
thunder_held_wait_seconds_sum 21.5
# HELP thunder_pauses_total Program pauses
# TYPE thunder_pauses_total counter
thunder_pauses_total 7.0
"""

SIM_METRICS = """\
sglang:e2e_request_latency_seconds_bucket{model_name="m",dp_rank="0",le="1.0"} 1
sglang:e2e_request_latency_seconds_bucket{model_name="m",dp_rank="0",le="+Inf"} 3
sglang:e2e_request_latency_seconds_sum{model_name="m",dp_rank="0"} 12.0
sglang:e2e_request_latency_seconds_count{model_name="m",dp_rank="0"} 3
sglang:e2e_request_latency_seconds_bucket{model_name="m",dp_rank="1",le="1.0"} 2
sglang:e2e_request_latency_seconds_bucket{model_name="m",dp_rank="1",le="+Inf"} 2
sglang:e2e_request_latency_seconds_sum{model_name="m",dp_rank="1"} 1.0
sglang:e2e_request_latency_seconds_count{model_name="m",dp_rank="1"} 2
"""


def test_parse_histogram_and_quantiles():
    h = parse_histogram(THUNDER_METRICS, "thunder_held_wait_seconds")
    assert h.count == 10 and h.sum == 21.5
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.9 * (5 - 2) / 4)
    assert h.quantile(0.2) == pytest.approx(0.1)
    assert h.quantile(0.99) == pytest.approx(1.0 + 9.0 * (9.9 - 6) / 4)
    assert h.max_bound() == 10.0
    assert Histogram().quantile(0.5) == 0.0


def test_histogram_sums_label_sets_and_subtracts_scrapes():
    h = parse_histogram(SIM_METRICS, "sglang:e2e_request_latency_seconds")
    assert (h.count, h.sum) == (5, 13.0)
    assert dict(h.buckets) == {1.0: 3, math.inf: 5}
    d = h - parse_histogram(SIM_METRICS.replace("} 3\n", "} 2\n", 1), "sglang:e2e_request_latency_seconds")
    assert dict(d.buckets)[math.inf] == 1
    assert h.max_bound() == 1.0  # the +Inf bucket reports the last finite bound
    assert (h - Histogram()).count == 5


def test_parse_counter_accepts_total_suffix():
    assert parse_counter(THUNDER_METRICS, "thunder_pauses") == 7.0
    assert parse_counter(THUNDER_METRICS, "missing") == 0.0


def test_overhead_per_request():
    assert overhead_per_request(10.0, 5, 6.0, 3.0) == pytest.approx(0.2)
    assert overhead_per_request(1.0, 0, 0.0) == 0.0


@pytest.mark.parametrize(("steps", "n", "ended", "flags"), [
    (300, 60, 60, ()),                         # 5 steps each, one lifetime warmed: steady
    (97, 60, 0, ("TRANSIENT", "COARSE")),      # the first three waves of a fresh burst
    (300, 60, 10, ("TRANSIENT",)),
    (120, 60, 60, ("COARSE",)),
    (0, 0, 0, ("TRANSIENT", "COARSE")),        # no programs: no division by zero
])
def test_window_check_names_what_keeps_a_window_from_the_steady_state(steps, n, ended, flags):
    c = window_check(steps, n, ended)
    assert tuple(k for k in ("TRANSIENT", "COARSE") if k + ":" in c["warning"]) == flags
    assert c["steps_per_program"] == round(steps / max(1, n), 2)


@pytest.mark.parametrize(("steps", "n", "before", "flags"), [
    (300, 60, 60, ()),                   # a warm start: one step per program worked off the cold prefills
    (300, 60, 30, ("TRANSIENT",)),       # half of them still owe their history's prefill
    (120, 60, 200, ("COARSE",)),
])
def test_a_warm_started_window_needs_its_cold_prefills_worked_off_not_a_lifetime(steps, n, before, flags):
    c = window_check(steps, n, 0, warm_start=True, steps_before=before)
    assert tuple(k for k in ("TRANSIENT", "COARSE") if k + ":" in c["warning"]) == flags
    assert c["warm_start"] and c["steps_before_per_program"] == round(before / n, 2)
    assert "TRANSIENT" in window_check(steps, n, 0)["warning"]  # the same counts, cold: a lifetime owed
