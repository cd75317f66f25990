"""Roofline timing: the calibration.md anchors, the closed-form span, and span = step-by-step."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import drain, tokens, unit_config

from thunder_sgl.sim import SimRequest, load_sim_config
from thunder_sgl.sim.engine import Engine
from thunder_sgl.sim.timing import (
    Roofline,
    decode_growth,
    decode_step,
    prefill_seconds,
    span,
    steps_within,
)

approx = pytest.approx


def test_glm46_decode_and_prefill_match_the_calibration_anchors() -> None:
    r = Roofline.from_config(load_sim_config("glm46-fp8-h100x8"))
    # calibration §5: ≈ 6 ms per step at B = 1 (t0 2 ms + 3.9 GB / (0.6 × 3.35 TB/s) + 184 × 15 µs)
    assert decode_step(r, 1, 0) == approx(0.002 + (1.8125e9 + 42e9 * 8 / 160) / (0.6 * 3.35e12) + 184 * 15e-6, rel=1e-9)
    assert 0.006 <= decode_step(r, 1, 0) <= 0.007
    # §5: 31–39 ms per step with a full ≈ 1 M-token pool at η 0.6, B ≈ 60
    assert 0.031 <= decode_step(r, 60, 1_050_000) <= 0.039
    # §6: 8×H100 prefill at a 30 K prefix ≈ 15–30 K tokens/s
    assert 15_000 <= 8192 / prefill_seconds(r, 8192, 30_000) <= 30_000


@settings(max_examples=200, deadline=None)
@given(a=st.floats(1e-4, 0.1), q=st.floats(0, 1e-4), steps=st.integers(1, 5000), frac=st.floats(0, 1))
def test_span_is_the_sum_of_its_steps_and_steps_within_inverts_it(a: float, q: float, steps: int, frac: float) -> None:
    assert span(a, q, steps) == approx(sum(a + q * s for s in range(steps)), rel=1e-9)
    budget = frac * span(a, q, steps)
    k = steps_within(a, q, budget, steps)
    assert span(a, q, k) <= budget
    assert k == steps or span(a, q, k + 1) > budget


def test_decode_growth_is_batch_times_kv_bytes_over_bandwidth() -> None:
    r = Roofline.from_config(unit_config())
    assert decode_growth(r, 3) == approx(3 * 512 / 1e12)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    capacity=st.sampled_from([300, 600, 1200, 5000]),
    hicache=st.booleans(),
    ratio=st.sampled_from([0.7, 0.1]),
    page=st.sampled_from([1, 4]),
)
def test_decode_spans_give_the_same_results_as_step_by_step_simulation(seed: int, capacity: int, hicache: bool, ratio: float, page: int) -> None:
    """Event-driven jumps are exact: same tokens, cache hits, retractions and (to rounding) times
    as an engine that plans every decode step, on loads with sharing, eviction and retraction."""
    rng = random.Random(seed)
    cfg = unit_config(server__max_total_num_tokens=capacity, server__chunked_prefill_size=256, hicache__enabled=hicache,
                      server__init_new_token_ratio=ratio, server__page_size=page)
    prefixes = [tokens(rng.randint(10, 120), start=(1 << 24) + 1000 * i) for i in range(3)]
    reqs = []
    for i in range(rng.randint(1, 10)):
        ids = prefixes[rng.randrange(3)] + tokens(rng.randint(1, 80), start=(1 << 26) + 1000 * i)
        reqs.append((rng.uniform(0, 0.3), ids, rng.randint(1, 150)))
    reqs.sort(key=lambda x: x[0])
    results = []
    for max_span in (None, 1):
        e = Engine(cfg, max_span_steps=max_span)
        done = []
        for i, (t, ids, max_new) in enumerate(reqs):
            done += drain(e, until=t)
            e.submit(SimRequest(f"r{i}", ids, max_new), t)
        done += drain(e)
        e.cache.check()
        results.append(sorted(done, key=lambda c: c.rid))
    jump, step = results
    for a, b in zip(jump, step, strict=True):
        assert (a.rid, a.completion_tokens, a.cached_tokens, a.cached_host, a.retractions, a.finish_reason) == \
            (b.rid, b.completion_tokens, b.cached_tokens, b.cached_host, b.retractions, b.finish_reason)
        assert a.time == approx(b.time, rel=1e-9)


FITTED = {"timing.kind": "fitted", "timing.decode_fixed_s": 0.004, "timing.decode_per_request_s": 0.001,
          "timing.decode_per_kv_token_s": 2e-6, "timing.prefill_fixed_s": 0.01,
          "timing.prefill_per_token_s": 3e-4, "timing.prefill_per_attention_s": 1e-8}


def test_a_fitted_config_times_iterations_with_its_own_coefficients() -> None:
    r = Roofline.from_config(unit_config(**{k.replace(".", "__"): v for k, v in FITTED.items()}))
    assert decode_step(r, 3, 6000) == approx(0.004 + 3 * 0.001 + 6000 * 2e-6)
    assert decode_growth(r, 3) == approx(3 * 2e-6)  # K grows by B per step
    assert prefill_seconds(r, 1000, 2000) == approx(1000 * 3e-4 + 1e-8 * (1000 * 2000 + 1000**2 / 2))
    # an iteration that prefills adds the fixed prefill cost once
    from thunder_sgl.sim.timing import iteration_seconds
    assert iteration_seconds(r, 0, 0, prefill_seconds(r, 100, 0), 0.0) == approx(0.004 + 0.01 + 100 * 3e-4 + 1e-8 * 5000)


def test_fitted_timing_needs_a_decode_and_a_prefill_cost() -> None:
    from thunder_sgl.errors import ConfigError
    with pytest.raises(ConfigError, match="fitted"):
        unit_config(timing__kind="fitted")


def test_engine_counters_follow_sglangs_prefill_busy_and_decode_moments() -> None:
    e = Engine(unit_config())
    e.submit(SimRequest("a", tokens(100), 11), 0.0)
    (a,) = drain(e)
    c = e.counters
    # one prefill iteration (t0 + prefill(100)) then 10 decode steps of one request
    from simkit import prefill, tau
    assert c.prefill_busy_seconds == approx(0.001 + prefill(100))
    n, sb, st_us, sb2, sbt, gen = c.decode_moments
    assert (n, sb, sb2, gen) == (10, 10, 10, 10)
    assert st_us == approx(1e6 * sum(tau(100 + s) for s in range(10)))
    assert sbt == approx(st_us)
    assert c.prefill_tokens == 100
