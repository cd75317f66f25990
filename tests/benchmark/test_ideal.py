"""The physical bound of calibration.md §10 (``benchmark.measures.ideal``)."""

from __future__ import annotations

import pytest

from thunder_sgl.benchmark.measures.ideal import (
    ideal_bound,
    ideal_from_inputs,
    ideal_steps_per_min,
    with_capacity,
)
from thunder_sgl.sim import load_sim_config

GLM = "glm46-fp8-h100x8"

# calibration.md §10 worked examples: GLM-4.6-FP8 TP8, C = 1.0 M, Δ = 600, Π = 25 K tok/s,
# Z = 1.5 s, η = 0.6 → (c̄, Ō) : steps/min
WORKED = [((15_000, 300), 305.0), ((15_000, 200), 440.0), ((10_000, 300), 460.0), ((20_000, 300), 230.0)]


def worked(c_bar: float, output: float):  # noqa: ANN201 - test helper
    return ideal_from_inputs(load_sim_config(GLM), programs=1000, c_bar=c_bar, output=output,
                             new_prompt=600, tool=1.5, t_prefill=600 / 25_000, capacity=1_000_000)


@pytest.mark.parametrize(("inputs", "doc"), WORKED)
def test_closed_form_reproduces_the_worked_examples_within_5_percent(inputs: tuple[int, int], doc: float) -> None:
    b = worked(*inputs)
    assert b.closed_form_per_min == pytest.approx(doc, rel=0.05)


@pytest.mark.parametrize(("inputs", "doc"), WORKED)
def test_fixed_point_is_at_most_5_percent_above_and_15_below_the_worked_examples(
    inputs: tuple[int, int], doc: float
) -> None:
    """The fixed point stretches R by the other steps' prefill (the doc's closed form does
    not), so it lands 0–12% under the doc's numbers."""
    b = worked(*inputs)
    assert 0.85 * doc <= b.steps_per_min <= 1.05 * doc, b


def test_worked_example_terms_batch_and_iteration_time() -> None:
    """§10: resident programs ≈ 67, B ≈ 56–59, τ ≈ 38 ms for c̄ = 15 K, Ō = 300."""
    b = worked(15_000, 300)
    assert b.resident == pytest.approx(66.7, rel=0.01)
    assert 53 <= b.batch <= 62
    assert b.tau == pytest.approx(0.038, rel=0.1)
    bounds = b.bounds_per_min()
    assert b.steps_per_min <= min(bounds.values()) + 1e-6


def test_bound_never_decreases_with_more_programs() -> None:
    values = [ideal_steps_per_min(GLM, 1, "mini-swe-agent", n) for n in (1, 8, 24, 48, 72, 96, 144, 300)]
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:], strict=False)), values
    assert values[-1] > values[0]


def test_bound_never_decreases_with_more_capacity() -> None:
    cfg = load_sim_config(GLM)
    values = [ideal_steps_per_min(with_capacity(cfg, c), 1, "mini-swe-agent", 200)
              for c in (250_000, 500_000, 1_050_000, 2_000_000, 4_000_000)]
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:], strict=False)), values


def test_replicas_multiply_the_per_replica_bound() -> None:
    one = ideal_steps_per_min(GLM, 1, "mini-swe-agent", 100)
    assert ideal_steps_per_min(GLM, 4, "mini-swe-agent", 400) == pytest.approx(4 * one)


def test_terms_for_the_headline_config_are_physical() -> None:
    b = ideal_bound(GLM, 1, "mini-swe-agent", 200)
    assert 10_000 < b.c_bar < 30_000  # profile: final context ≈ 28 K on average
    assert 100 <= b.output <= 400 and 1.0 < b.tool < 3.0 and b.shared > 1500
    assert b.r_min < b.step_seconds
    assert b.point.limit == "hbm"  # 200 programs on one node: memory binds, not the loop
    assert b.hicache_steps_per_min is None


def test_hicache_ceiling_is_reported_separately() -> None:
    b = ideal_bound(GLM + "-hicache", 1, "mini-swe-agent", 200)
    anchor = ideal_bound(GLM, 1, "mini-swe-agent", 200)
    assert b.steps_per_min == pytest.approx(anchor.steps_per_min, rel=1e-6)  # anchor: retention
    assert b.hicache_steps_per_min is not None and b.t_load > 0
    assert b.hicache_steps_per_min >= b.steps_per_min and b.host_point is not None
    forced = ideal_bound(GLM, 1, "mini-swe-agent", 200, hicache=True)
    assert forced.hicache_steps_per_min is not None
    # a run on a host-tier cluster is held to the ceiling, one without to the anchor
    assert ideal_steps_per_min(GLM + "-hicache", 1, "mini-swe-agent", 200) == pytest.approx(b.hicache_steps_per_min)
    assert ideal_steps_per_min(GLM, 1, "mini-swe-agent", 200) == pytest.approx(anchor.steps_per_min)


def test_few_programs_are_bound_by_the_closed_loop() -> None:
    b = ideal_bound(GLM, 1, "mini-swe-agent", 8)
    assert b.point.limit == "closed_loop"
    assert b.steps_per_min == pytest.approx(60 * 8 / (b.step_seconds + b.tool), rel=1e-6)
