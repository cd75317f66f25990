"""Measures of a run computed from its records (window, time scale, CSV)."""

from __future__ import annotations

import csv

import pytest

from thunder_sgl.benchmark.measures.stats import ProgramRecord, StepRecord, WorkloadResult


def result(warmup_s: float = 0.0) -> WorkloadResult:
    r = WorkloadResult("p", concurrency=2, time_scale=10.0, wall_s=60.0, warmup_s=warmup_s)
    # (end of call, end of tool wait, prompt, cached)
    for i, (end, tool_end, prompt, cached) in enumerate(
        [(5.0, 6.0, 100, 0), (15.0, 16.0, 200, 100), (30.0, 31.0, 300, 250), (59.0, None, 400, 300)]
    ):
        r.steps.append(
            StepRecord("a", i, 0, end - 1.0, end, 200, None, prompt, 10, cached, "bash", tool_end)
        )
    r.steps.append(StepRecord("a", 4, 0, 20.0, 21.0, 503, "http_503"))
    r.programs += [
        ProgramRecord("a", 0, 5, 0.0, 8.0, 5, "completed"),
        ProgramRecord("b", 1, 5, 2.0, 40.0, 5, "completed"),
        ProgramRecord("c", 2, 5, 3.0, 50.0, 1, "failed"),
    ]
    r.errors["http_503"] += 1
    return r


def test_measures_use_simulated_time_and_count_steps_when_their_tool_wait_ends():
    s = result().summary()
    assert s["steps_completed"] == 3  # the last call's tool wait never ended
    assert s["window_sim_s"] == 600.0
    assert s["steps_per_min"] == pytest.approx(3 / 10.0)
    assert s["kv_hit_rate"] == pytest.approx(650 / 1000)  # failed attempts carry no tokens
    assert s["program_completion_p50_s"] == pytest.approx((80 + 380) / 2)
    assert s["step_latency_p50_s"] == pytest.approx(10.0)
    assert (s["programs_completed"], s["programs_failed"], s["errors"]) == (2, 1, {"http_503": 1})


def test_warmup_excludes_early_steps_calls_and_programs():
    s = result(warmup_s=10.0).summary()
    assert s["window_sim_s"] == 500.0
    assert s["steps_completed"] == 2
    assert s["steps_per_min"] == pytest.approx(2 / (500 / 60))
    assert s["kv_hit_rate"] == pytest.approx(650 / 900)
    assert s["program_completion_p50_s"] == pytest.approx(380.0)


def test_empty_run_has_no_percentiles_and_zero_rates():
    s = WorkloadResult("p", 1, 1.0, 0.0).summary()
    assert s["steps_per_min"] == 0.0 and s["kv_hit_rate"] == 0.0
    assert s["program_completion_p99_s"] is None and s["step_latency_p50_s"] is None


def test_write_csv_gives_one_row_per_record(tmp_path):
    steps, programs = result().write_csv(tmp_path / "run")
    rows = list(csv.DictReader(steps.open()))
    assert len(rows) == 5 and rows[0]["program_id"] == "a" and rows[3]["tool_end_s"] == ""
    assert [r["outcome"] for r in csv.DictReader(programs.open())] == [
        "completed",
        "completed",
        "failed",
    ]
